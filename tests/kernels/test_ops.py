"""The fused CPU kernels' ops against their eager references: values and gradients, extremes, NaN, dispatch."""

import copy

import pytest
import torch
import torch.nn.functional as F

from yt8m import kernels
from yt8m.kernels import use_fused_kernels
from yt8m.kernels.ops import batch_norm_relu6_max_pool, moe_mixture, run_major_linear
from yt8m.models import create_model
from yt8m.models.video import mixture_logits
from yt8m.tasks.losses import create_loss

pytestmark = pytest.mark.skipif(kernels.native is None, reason="the fused kernels' extension is not built")


def mixture_inputs(mixtures: int, classes: int = 37, rows: int = 9, seed: int = 0):
    """Gate logits [M + 1, rows, C] and expert logits [M, rows, C], the kernels' run-major layout."""
    generator = torch.Generator().manual_seed(seed)
    gates = torch.randn(mixtures + 1, rows, classes, generator=generator) * 4
    experts = torch.randn(mixtures, rows, classes, generator=generator) * 4
    # Extremes where terms underflow in float32: the kernel redoes those classes in log space.
    gates[:, 0, 0] = torch.tensor([60.0] + [-60.0] * mixtures)
    experts[:, 0, 0] = 300.0
    experts[:, 1, 0] = -300.0
    gates[:, 2, -1] = torch.tensor([-90.0] * mixtures + [90.0])
    return gates, experts


def class_major(runs: torch.Tensor) -> torch.Tensor:
    """[width, rows, C] runs as the [rows, C * width] class-major layer output (column c * width + j)."""
    return runs.permute(1, 2, 0).reshape(runs.shape[1], -1)


@pytest.mark.parametrize("mixtures", [1, 2, 3, 4, 6])
def test_moe_mixture_matches_the_float64_reference(mixtures):
    gates, experts = mixture_inputs(mixtures)
    dlogits = torch.randn(gates.shape[1], gates.shape[2], generator=torch.Generator().manual_seed(1))
    fused_gates, fused_experts = gates.clone().requires_grad_(), experts.clone().requires_grad_()
    assert use_fused_kernels("moe", fused_gates, fused_experts)
    logits, predictions = moe_mixture(fused_gates, fused_experts, mixtures)
    logits.backward(dlogits)
    reference_gates, reference_experts = gates.double().requires_grad_(), experts.double().requires_grad_()
    expected = mixture_logits(class_major(reference_gates), class_major(reference_experts), mixtures)
    expected.backward(dlogits.double())
    torch.testing.assert_close(logits, expected.float(), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(predictions, torch.sigmoid(expected).float(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused_gates.grad, reference_gates.grad.float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused_experts.grad, reference_experts.grad.float(), rtol=1e-4, atol=1e-6)
    assert abs(logits[0, 0].item()) > 100  # the extreme classes really were extreme, and came out exact


def test_moe_mixture_keeps_a_nan():
    gates, experts = mixture_inputs(2)
    gates[1, 3, 5] = float("nan")
    experts[0, 4, 7] = float("nan")
    logits, predictions = moe_mixture(gates, experts, 2)
    assert torch.isnan(predictions[3, 5]) and torch.isnan(predictions[4, 7])
    assert torch.isnan(logits[3, 5]) and torch.isnan(logits[4, 7])
    assert torch.isfinite(logits[5:]).all()


@pytest.mark.parametrize("with_bias", [True, False])
def test_run_major_linear_is_the_layer_with_its_output_in_runs(with_bias):
    generator = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(11, 5 * 3, bias=with_bias)
    x = torch.randn(4, 11, generator=generator)
    druns = torch.randn(3, 4, 5, generator=generator)
    fused_x, reference_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    runs = run_major_linear(fused_x, layer.weight, layer.bias, 3)
    runs.backward(druns)
    fused_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    expected = layer(reference_x)
    expected.backward(class_major(druns))
    torch.testing.assert_close(class_major(runs), expected)
    torch.testing.assert_close(fused_x.grad, reference_x.grad)
    for got, parameter in zip(fused_grads, layer.parameters()):
        torch.testing.assert_close(got, parameter.grad)


def test_moe_trains_the_same_with_and_without_the_fused_kernels():
    """Logits and every gradient against the eager path (nn.Linear layers, mixture_logits) of the same model."""
    torch.manual_seed(0)
    fused = create_model("MoeModel", 24, 30, moe_num_mixtures=3).train()
    eager = copy.deepcopy(fused)
    features = torch.randn(7, 24)
    output = fused(features)
    logits = output["logits"]
    normalized = F.normalize(features, dim=-1)
    expected = mixture_logits(eager.gates(normalized), eager.experts(normalized), 3)
    assert "moe_mixture" in logits.grad_fn.name()
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output["predictions"], torch.sigmoid(expected), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused.compute_logits(normalized), expected, rtol=1e-5, atol=1e-5)  # as sub-models call it
    logits.square().sum().backward()
    expected.square().sum().backward()
    for (name, got), want in zip(fused.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_kernels_run_only_on_contiguous_float32_cpu_tensors():
    gates, experts = mixture_inputs(2)
    assert use_fused_kernels("moe", gates, experts)
    assert not use_fused_kernels("moe", gates.bfloat16(), experts)
    assert not use_fused_kernels("moe", gates.transpose(1, 2), experts)
    assert not use_fused_kernels("moe", gates.double(), experts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_fused_kernels("moe", gates, experts)


def test_a_forked_child_runs_the_kernels_on_its_own_threads():
    """The parent's pool threads do not survive fork: a child that trains starts its own."""
    import multiprocessing

    gates, experts = mixture_inputs(2)
    expected = mixture_of_two(gates, experts)  # the parent's pool now exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        logits = pool.apply_async(mixture_of_two, (gates, experts)).get(timeout=60)  # hangs without the fix
    torch.testing.assert_close(logits, expected)


def mixture_of_two(gates: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    return moe_mixture(gates, experts, 2)[0]


def pooling_inputs(videos: int = 5, frames: int = 7, channels: int = 300):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(videos * frames, channels, generator=generator) * 3 + 1
    x[frames:2 * frames] = x[frames]  # a video whose frames repeat (fewer real frames than sampled): exact ties
    gamma = torch.rand(channels, generator=generator) * 4 - 1  # some negative: the order flips
    beta = torch.randn(channels, generator=generator) * 2  # many values clamp at 0 and 6
    dpooled = torch.randn(videos, channels, generator=generator)
    return x, gamma, beta, dpooled


def test_batch_norm_relu6_max_pool_matches_eager_pytorch_in_float64():
    x, gamma, beta, dpooled = pooling_inputs()
    fused = [t.clone().requires_grad_() for t in (x, gamma, beta)]
    pooled, mean, var = batch_norm_relu6_max_pool(*fused, 7, 1e-3)
    pooled.backward(dpooled)
    reference = [t.double().requires_grad_() for t in (x, gamma, beta)]
    normalized = F.batch_norm(reference[0], None, None, reference[1], reference[2], training=True, eps=1e-3)
    expected = F.relu6(normalized).view(5, 7, -1).amax(dim=1)
    expected.backward(dpooled.double())
    torch.testing.assert_close(pooled, expected.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, x.double().mean(0).float())
    torch.testing.assert_close(var, x.double().var(0, unbiased=False).float())
    # Ties share reduce_max's gradient in the reference and go to one frame here: they differ row by row only
    # within the repeated video, whose rows are equal, so any weight gradient computed from them is the same.
    tied = slice(7, 14)
    torch.testing.assert_close(fused[0].grad[tied].sum(0), reference[0].grad[tied].sum(0).float(), rtol=1e-4, atol=1e-5)
    untied = torch.ones(35, dtype=torch.bool)
    untied[tied] = False
    torch.testing.assert_close(fused[0].grad[untied], reference[0].grad[untied].float(), rtol=1e-4, atol=1e-5)
    for got, want in zip(fused[1:], reference[1:]):
        torch.testing.assert_close(got.grad, want.grad.float(), rtol=1e-4, atol=1e-5)


def test_batch_norm_relu6_max_pool_keeps_a_nan():
    x, gamma, beta, _ = pooling_inputs()
    x[3 * 7 + 2, 10] = float("nan")  # video 3, channel 10: its batch statistics and its maximum are NaN
    pooled, _, _ = batch_norm_relu6_max_pool(x, gamma, beta, 7, 1e-3)
    assert torch.isnan(pooled[:, 10]).all() and torch.isfinite(pooled[:, 11]).all()


def test_dbof_trains_the_same_with_and_without_the_fused_pooling(monkeypatch):
    """Logits, every gradient and the batch-norm running statistics, against the eager path of the same model."""
    from yt8m.models import frame

    torch.manual_seed(0)
    fused = create_model("DbofModel", 48, 20, dbof_cluster_size=64, dbof_hidden_size=16, iterations=5).train()
    eager = copy.deepcopy(fused)
    eager._fused_pooling_applies = lambda activations: False
    features, num_frames = torch.randn(6, 12, 48), torch.tensor([12, 3, 7, 12, 1, 9])  # some sample repeats
    calls = []
    monkeypatch.setattr(frame, "batch_norm_relu6_max_pool",
                        lambda *args: calls.append(1) or batch_norm_relu6_max_pool(*args))
    torch.manual_seed(1)
    logits = fused(features, num_frames)["logits"]
    torch.manual_seed(1)
    expected = eager(features, num_frames)["logits"]
    assert calls, "the fused pooling did not run"
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    logits.square().sum().backward()
    expected.square().sum().backward()
    for (name, got), want in zip(fused.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, got), want in zip(fused.named_buffers(), eager.buffers()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def opcheck_cases():
    gates, experts = mixture_inputs(2, classes=5, rows=3)
    x, gamma, beta, _ = pooling_inputs(videos=2, frames=3, channels=4)
    layer = torch.nn.Linear(4, 6)
    return [
        (torch.ops.yt8m.run_major_linear, (torch.randn(2, 4, requires_grad=True), layer.weight, layer.bias, 3)),
        (torch.ops.yt8m.run_major_linear, (torch.randn(2, 4), layer.weight, None, 2)),
        (torch.ops.yt8m.moe_mixture, (gates.requires_grad_(), experts.requires_grad_(), 2)),
        (torch.ops.yt8m.batch_norm_relu6_max_pool, (x.requires_grad_(), gamma.requires_grad_(), beta, 3, 1e-3)),
    ]


@pytest.mark.parametrize("case", range(4))
def test_each_op_is_registered_as_torch_requires(case):
    """torch.library.opcheck: the schema, the fake implementation (what torch.compile traces) against the real one,
    and the autograd registration."""
    op, args = opcheck_cases()[case]
    torch.library.opcheck(op, args)


def test_a_loss_on_the_mixtures_probabilities_gets_their_gradient():
    """HingeLoss and SoftmaxLoss train on the predictions: the fused mixture's are differentiable like sigmoid's."""
    torch.manual_seed(0)
    fused = create_model("MoeModel", 24, 30, moe_num_mixtures=2).train()
    eager = copy.deepcopy(fused)
    eager._fused_mixture_applies = lambda features: False
    features, labels = torch.randn(7, 24), torch.rand(7, 30) < 0.2
    for model in (fused, eager):
        output = model(features)
        (create_loss("HingeLoss")(output, labels) + create_loss("CrossEntropyLoss")(output, labels)).backward()
    assert "moe_mixture" in fused(features)["predictions"].grad_fn.name()
    for (name, got), want in zip(fused.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("name, ops", [("MoeModel", {"run_major_linear", "moe_mixture"}),
                                       ("DbofModel", {"batch_norm_relu6_max_pool", "run_major_linear", "moe_mixture"})])
def test_torch_compile_traces_through_the_kernels(name, ops):
    """--compile's graph holds the kernels' ops (DbofModel's classifier is a MoeModel), in one graph (no break, no
    eager fallback), and its loss and gradients are eager's. (AOTAutograd on eager kernels here; the trainer's
    inductor backend compiles the rest.)"""
    import torch._dynamo

    targets = []

    def capture(graph, example_inputs):
        targets.extend(str(node.target) for node in graph.graph.nodes)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    torch.manual_seed(0)
    options = {"dbof_cluster_size": 16, "dbof_hidden_size": 8, "iterations": 5} if name == "DbofModel" else {}
    compiled_model = create_model(name, 24, 30, **options).train()
    eager_model = copy.deepcopy(compiled_model)
    features = torch.randn(6, 12, 24) if name == "DbofModel" else torch.randn(6, 24)
    labels = torch.rand(6, 30) < 0.2
    loss_fn = create_loss("CrossEntropyLoss")

    def loss_of(model):
        return loss_fn(model(features), labels)

    torch._dynamo.reset()
    torch.manual_seed(1)
    loss = torch.compile(loss_of, backend=capture, fullgraph=True)(compiled_model)
    loss.backward()
    torch.manual_seed(1)
    expected = loss_of(eager_model)
    expected.backward()
    assert {target.split(".")[1] for target in targets if target.startswith("yt8m.")} == ops
    torch.testing.assert_close(loss, expected)
    for (parameter, got), want in zip(compiled_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-7, msg=parameter)


def test_export_takes_the_eager_path():
    """torch.export (ONNX export's tracer) gets the eager reference: its graph cannot hold the kernels' ops."""
    model = create_model("MoeModel", 24, 30).eval()
    features = torch.randn(3, 24)
    program = torch.export.export(model, (features,))
    assert not [node for node in program.graph.nodes if str(node.target).startswith("yt8m.")]
    torch.testing.assert_close(program.module()(features)["logits"], model(features)["logits"], rtol=1e-5, atol=1e-5)
