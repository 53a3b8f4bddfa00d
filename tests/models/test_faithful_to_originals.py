"""The learnable-pooling models, context gating and GatedMoeModel against NumPy float64 forward passes written from
the original TensorFlow code, run on the yt8m modules' weights: equal in eval mode within 2e-5, on videos of
different lengths in one batch (yt8m's padding full of garbage) and a video without frames.

The originals: WILLOW (Miech et al. 2017) in antoine77340/LOUPE loupe.py and antoine77340/Youtube-8M-WILLOW
frame_level_models.py, video_level_models.py and train.py; NeXtVLAD (Lin et al. 2018) in linrongc/youtube-8m
nextvlad.py, video_level_models.py, train.py and eval.py. Each equation below cites the function it comes from.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yt8m.models import create_model
from yt8m.models.gating import ContextGating
from yt8m.models.learnable_pooling import GatedBagOfFrames, NetFv, NetVlad, SoftBagOfFrames

SIZES, CLASSES = (8, 4), 5  # rgb and audio dimensions
FEATURES = sum(SIZES)
LENGTHS = [6, 3, 0, 1]  # one video without frames
TOLERANCE = 2e-5
TINY_WILLOW = dict(netvlad_cluster_size=4, fv_cluster_size=4, softdbof_cluster_size=16, gateddbof_cluster_size=16,
                   willow_hidden_size=6, moe_num_mixtures=2)
TINY = dict(TINY_WILLOW, nextvlad_cluster_size=4, nextvlad_groups=4, nextvlad_expansion=2, nextvlad_hidden_size=16,
            nextvlad_gating_reduction=4)


# ---- the originals' building blocks ----

def as_np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy()


def l2_normalize(x: np.ndarray, axis: int) -> np.ndarray:
    """tf.nn.l2_normalize: x / sqrt(max(sum x^2, 1e-12))."""
    return x / np.sqrt(np.maximum((x ** 2).sum(axis=axis, keepdims=True), 1e-12))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def slim_batch_norm_eval(x: np.ndarray, norm: torch.nn.BatchNorm1d,
                         order: np.ndarray | slice = slice(None)) -> np.ndarray:
    """slim.batch_norm(center=True, scale=True, is_training=False): the moving statistics and slim's epsilon 0.001
    (the layer's own epsilon is not read). `order` puts yt8m's per-unit values in the original's unit order."""
    mean, var = as_np(norm.running_mean)[order], as_np(norm.running_var)[order]
    return (x - mean) / np.sqrt(var + 0.001) * as_np(norm.weight)[order] + as_np(norm.bias)[order]


def dims_major(clusters: int, dims: int) -> np.ndarray:
    """The originals flatten a [dims, clusters] descriptor (index d * K + k), yt8m a [clusters, dims] one
    (k * D + d): position i of the original's vector is yt8m's dims_major(K, D)[i]. The same hidden layer and batch
    norm, their units permuted."""
    return np.arange(clusters * dims).reshape(clusters, dims).T.reshape(-1)


def context_gating(x: np.ndarray, gating, batch_norm: bool) -> np.ndarray:
    """LOUPE PoolingBaseModel.context_gating (= WILLOW NetVLADModelLF's gating block, whose bias form is LOUPE's):
    x * sigmoid(BN(x gating_weights)), or x * sigmoid(x gating_weights + gating_biases)."""
    gates = x @ as_np(gating.weight)
    gates = slim_batch_norm_eval(gates, gating.norm) if batch_norm else gates + as_np(gating.bias)
    return x * sigmoid(gates)


def moe(x: np.ndarray, model) -> np.ndarray:
    """WILLOW video_level_models.MoeModel.create_model (the starter kit's): per class a softmax over M + 1 gates (no
    bias), the last one a dummy expert, times M sigmoid experts (with bias); yt8m's rows are slim's weight columns."""
    mixtures = model.num_mixtures
    gates = softmax((x @ as_np(model.gates.weight).T).reshape(-1, mixtures + 1))
    experts = sigmoid((x @ as_np(model.experts.weight).T + as_np(model.experts.bias)).reshape(-1, mixtures))
    return (gates[:, :mixtures] * experts).sum(axis=1).reshape(len(x), -1)


def starter_input(frames: np.ndarray) -> np.ndarray:
    """Youtube-8M-WILLOW train.py (the starter kit's): tf.nn.l2_normalize(model_input_raw, feature_dim), each frame
    over all its features. A video without frames: utils.SampleRandomFrames reads index 0 of its zero padding."""
    return l2_normalize(frames if len(frames) else np.zeros((1, FEATURES)), axis=1)


# ---- WILLOW (Miech et al. 2017) ----

def soft_assignment(x: np.ndarray, assignment, batch_norm: bool) -> np.ndarray:
    """loupe.py NetVLAD.forward (and NetRVLAD, NetFV, SoftDBoW; WILLOW's GatedDBoF): softmax(BN(x cluster_weights)),
    or softmax(x cluster_weights + cluster_biases)."""
    logits = x @ as_np(assignment.weight)
    return softmax(slim_batch_norm_eval(logits, assignment.norm) if batch_norm else logits + as_np(assignment.bias))


def netvlad(x: np.ndarray, pool: NetVlad, batch_norm: bool) -> np.ndarray:
    """loupe.py NetVLAD.forward (with cluster_weights2, yt8m's centers transposed) and NetRVLAD.forward (without):
    the [D, K] sum of assignment-weighted residuals, l2_normalize over D (intra), flattened, l2_normalize."""
    a = soft_assignment(x, pool.assignment, batch_norm)
    vlad = (a.T @ x).T
    if pool.centers is not None:
        vlad = vlad - a.sum(axis=0) * as_np(pool.centers).T
    return l2_normalize(l2_normalize(vlad, axis=0).reshape(-1), axis=0)


def netfv(x: np.ndarray, pool: NetFv, batch_norm: bool) -> np.ndarray:
    """loupe.py NetFV.forward: covar_weights^2 + 1e-6 divides the first order (intra- then globally normalized),
    its square the second order, which is only L2-normalized over the whole vector (twice, as there)."""
    a = soft_assignment(x, pool.assignment, batch_norm)
    a_sum = a.sum(axis=0)
    centers, covar = as_np(pool.centers).T, as_np(pool.deviation_roots).T ** 2 + 1e-6
    fv1 = (a.T @ x).T
    fv2 = (a_sum * centers ** 2 + (a.T @ x ** 2).T - 2 * fv1 * centers) / covar ** 2 - a_sum
    fv2 = l2_normalize(l2_normalize(fv2.reshape(-1), axis=0), axis=0)
    fv1 = l2_normalize((fv1 - a_sum * centers) / covar, axis=0).reshape(-1)
    return np.concatenate([l2_normalize(fv1, axis=0), fv2])


def soft_dbof(x: np.ndarray, pool: SoftBagOfFrames, batch_norm: bool) -> np.ndarray:
    """frame_level_models.py SoftDBoF.forward (max_pool False, the default): l2_normalize(sum over frames of a)."""
    return l2_normalize(soft_assignment(x, pool.assignment, batch_norm).sum(axis=0), axis=0)


def gated_dbof(x: np.ndarray, pool: GatedBagOfFrames, batch_norm: bool) -> np.ndarray:
    """frame_level_models.py GatedDBoF.forward: the bag gated by sigmoid(BN(l2(max over frames of a) dim_red
    cluster_weights_2)) (cluster_biases_2 without batch norm), then l2_normalize."""
    a = soft_assignment(x, pool.assignment, batch_norm)
    gates = l2_normalize(a.max(axis=0), axis=0) @ as_np(pool.reduce) @ as_np(pool.expand)
    gates = slim_batch_norm_eval(gates, pool.norm) if batch_norm else gates + as_np(pool.bias)
    return l2_normalize(sigmoid(gates) * a.sum(axis=0), axis=0)


ORIGINAL_POOLINGS = {NetVlad: netvlad, NetFv: netfv, SoftBagOfFrames: soft_dbof, GatedBagOfFrames: gated_dbof}


def original_order(pool) -> np.ndarray:
    """Where each unit of the original's pooled vector sits in yt8m's (see dims_major)."""
    if isinstance(pool, (NetVlad, NetFv)):
        dims, clusters = pool.assignment.weight.shape
        half = dims_major(clusters, dims)
        return half if isinstance(pool, NetVlad) else np.concatenate([half, half + len(half)])
    return np.arange(pool.output_size)


def hidden_rows(poolings) -> np.ndarray:
    offsets = np.cumsum([0] + [pool.output_size for pool in poolings])
    return np.concatenate([start + original_order(pool) for start, pool in zip(offsets, poolings)])


def willow(model, videos: list, batch_norm: bool, gating: bool) -> np.ndarray:
    """frame_level_models.py NetVLADModelLF.create_model (NetFVModelLF, SoftDbofModelLF, GatedDbofModelLF alike):
    input_bn over all features, a pooling of the first 1024 (rgb) and one of the rest (audio), concatenated,
    hidden1_weights + hidden1_biases (--netvlad_relu / --fv_relu / --dbof_relu False), the gating block (--gating),
    then video_level_models.MoeModel with --moe_prob_gating: p * sigmoid(BN(p gating_prob_weights)), always
    batch-normalized there."""
    hidden, gate = model.head
    weights = as_np(hidden.weight).T[hidden_rows(model.poolings)]
    rows = []
    for frames in videos:
        x = starter_input(frames)
        if batch_norm:
            x = slim_batch_norm_eval(x, model.input_norm)
        parts = np.split(x, np.cumsum(SIZES)[:-1], axis=1)
        pooled = np.concatenate([ORIGINAL_POOLINGS[type(pool)](part, pool, batch_norm)
                                 for pool, part in zip(model.poolings, parts)])
        activation = pooled @ weights + as_np(hidden.bias)
        if gating:
            activation = context_gating(activation, gate, batch_norm)
        probabilities = moe(activation[None], model.classifier)[0]
        rows.append(context_gating(probabilities, model.probability_gating, True) if gating else probabilities)
    return np.stack(rows)


# ---- NeXtVLAD (Lin et al. 2018) ----

def nextvlad_pooling(x: np.ndarray, mask: np.ndarray, pool) -> np.ndarray:
    """nextvlad.py NeXtVLAD.forward on one video's [300 or fewer, N] padded frames and its sequence mask."""
    frames = len(x)
    expanded = x @ as_np(pool.expand.weight).T + as_np(pool.expand.bias)
    attention = sigmoid(expanded @ as_np(pool.attention.weight).T + as_np(pool.attention.bias)) * mask[:, None]
    activation = slim_batch_norm_eval(expanded @ as_np(pool.assignment.weight).T, pool.assignment_norm)
    activation = softmax(activation.reshape(frames * pool.groups, pool.clusters)) * attention.reshape(-1, 1)
    residual_weight = activation.sum(axis=0) * as_np(pool.centers).T  # a_sum * cluster_weights2
    vlad = (activation.T @ expanded.reshape(frames * pool.groups, pool.group_size)).T - residual_weight
    order = dims_major(pool.clusters, pool.group_size)
    return slim_batch_norm_eval(l2_normalize(vlad, axis=0).reshape(-1), pool.output_norm, order)


def lin_input(frames: np.ndarray, length: int, eigenvalues: np.ndarray | None) -> np.ndarray:
    """train.py and eval.py: (model_input_raw - [4/512] * 1024 + [0] * 128) * pad(sqrt(eigenvalues[:1024]) + 1e-4,
    1 for audio), the reader's zero padding included; without eigenvalues the starter kit's l2_normalize, the line
    those files leave commented out. The frames are zero-padded to `length`, as the reader pads to 300."""
    padded = np.zeros((length, FEATURES))
    padded[:len(frames)] = frames
    if eigenvalues is None:
        return l2_normalize(padded, axis=1)
    offset = np.array([4 / 512] * SIZES[0] + [0] * SIZES[1])
    scale = np.concatenate([np.sqrt(eigenvalues[:SIZES[0]]) + 1e-4, np.ones(SIZES[1])])
    return (padded - offset) * scale


def nextvlad(model, videos: list, length: int, eigenvalues: np.ndarray | None) -> np.ndarray:
    """nextvlad.py NeXtVLADModel.create_model: mask = tf.sequence_mask(num_frames), the video and audio NeXtVLAD,
    concatenated, dropout (none in evaluation), hidden1_weights (no bias), hidden1_bn, SE gating: sigmoid(relu(
    gating_bn(x gating_weights_1)) gating_weights_2), then video_level_models.LogisticModel: sigmoid(x W + b)."""
    _, hidden, hidden_norm, gating = model.head
    orders = [dims_major(pool.clusters, pool.group_size) for pool in model.poolings]
    offsets = np.cumsum([0] + [pool.output_size for pool in model.poolings])
    weights = as_np(hidden.weight).T[np.concatenate([start + order for start, order in zip(offsets, orders)])]
    rows = []
    for frames in videos:
        x, mask = lin_input(frames, length, eigenvalues), (np.arange(length) < len(frames)).astype(float)
        parts = np.split(x, np.cumsum(SIZES)[:-1], axis=1)
        pooled = np.concatenate([nextvlad_pooling(part, mask, pool) for pool, part in zip(model.poolings, parts)])
        activation = slim_batch_norm_eval(pooled @ weights, hidden_norm)
        squeezed = np.maximum(slim_batch_norm_eval(activation @ as_np(gating.squeeze.weight).T, gating.norm), 0)
        activation = activation * sigmoid(squeezed @ as_np(gating.excite.weight).T)
        linear = model.classifier.linear
        rows.append(sigmoid(activation @ as_np(linear.weight).T + as_np(linear.bias)))
    return np.stack(rows)


# ---- the comparisons ----

def padded_batch(seed: int = 0) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Raw frames per video, and yt8m's batch of them: float64, padded with garbage to 2 frames past the longest."""
    generator = np.random.default_rng(seed)
    videos = [generator.normal(size=(length, FEATURES)) for length in LENGTHS]
    batch = generator.normal(size=(len(videos), max(LENGTHS) + 2, FEATURES)) * 50
    for row, video in enumerate(videos):
        batch[row, :len(video)] = video
    return videos, torch.from_numpy(batch), torch.tensor(LENGTHS)


def trained_looking(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The model in float64, eval mode, every parameter and batch-norm statistic moved off its initial value (zero
    biases, unit statistics would hide a missing or misplaced term)."""
    torch.manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
        for norm in model.modules():
            if isinstance(norm, torch.nn.BatchNorm1d):
                norm.running_mean.normal_(0, 0.5)
                norm.running_var.uniform_(0.5, 2)
    return model


def assert_matches(model, reference: np.ndarray, batch: torch.Tensor, lengths: torch.Tensor) -> None:
    with torch.no_grad():
        predictions = model(batch, lengths)["predictions"].numpy()
    np.testing.assert_allclose(predictions, reference, rtol=0, atol=TOLERANCE)


WILLOW_MODELS = ["NetVLADModel", "NetRVLADModel", "NetFVModel", "SoftDbofModel", "GatedDbofModel"]


@pytest.mark.parametrize("gating", [True, False])
@pytest.mark.parametrize("batch_norm", [True, False])
@pytest.mark.parametrize("name", WILLOW_MODELS)
def test_willow_models_compute_the_originals_forward_pass(name, batch_norm, gating):
    model = trained_looking(create_model(name, FEATURES, CLASSES, modality_sizes=SIZES, willow_batch_norm=batch_norm,
                                         context_gating=gating, moe_prob_gating=gating, **TINY_WILLOW))
    videos, batch, lengths = padded_batch()
    assert_matches(model, willow(model, videos, batch_norm, gating), batch, lengths)


@pytest.mark.parametrize("whitened", [False, True])
def test_nextvlad_computes_the_originals_forward_pass(whitened, tmp_path):
    eigenvalues = np.random.default_rng(1).uniform(0.001, 15, size=(2 * SIZES[0], 1))  # the release's shape
    np.save(tmp_path / "eigenvals.npy", eigenvalues)
    path = str(tmp_path / "eigenvals.npy") if whitened else ""
    model = trained_looking(create_model("NeXtVLADModel", FEATURES, CLASSES, modality_sizes=SIZES,
                                         nextvlad_eigenvalues=path, video_level_classifier_model="LogisticModel",
                                         **TINY))
    videos, batch, lengths = padded_batch()
    reference = nextvlad(model, videos, batch.shape[1], eigenvalues[:, 0] if whitened else None)
    assert_matches(model, reference, batch, lengths)


@pytest.mark.parametrize("batch_norm", [True, False])
def test_context_gating_is_loupes(batch_norm):
    gating = trained_looking(ContextGating(6, batch_norm))
    x = np.random.default_rng(2).normal(size=(3, 6))
    with torch.no_grad():
        gated = gating(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gated, context_gating(x, gating, batch_norm), rtol=0, atol=TOLERANCE)


def test_gated_moe_is_willows_moe_with_probability_gating():
    """video_level_models.MoeModel with --moe_prob_gating, on the starter kit's L2-normalized video features."""
    model = trained_looking(create_model("GatedMoeModel", FEATURES, CLASSES, moe_num_mixtures=3))
    x = np.random.default_rng(3).normal(size=(4, FEATURES))
    reference = context_gating(moe(l2_normalize(x, axis=1), model.moe), model.gating, True)
    with torch.no_grad():
        predictions = model(torch.from_numpy(x))["predictions"].numpy()
    np.testing.assert_allclose(predictions, reference, rtol=0, atol=TOLERANCE)


POOLING_MODELS = WILLOW_MODELS + ["NeXtVLADModel"]


@pytest.mark.parametrize("name", POOLING_MODELS + ["GatedMoeModel"])
def test_batch_norms_are_slims(name):
    """slim.batch_norm's defaults in both originals: epsilon 1e-3, moving averages decayed by 0.999 (torch momentum
    0.001); --pooling_batch_norm_decay sets the decay of a pooling model's."""
    sizes = {} if name == "GatedMoeModel" else {"modality_sizes": SIZES}
    norms = [module for module in create_model(name, FEATURES, CLASSES, **sizes, **TINY).modules()
             if isinstance(module, torch.nn.BatchNorm1d)]
    assert norms and all(norm.eps == 1e-3 and norm.momentum == pytest.approx(0.001) for norm in norms)
    if name != "GatedMoeModel":
        faster = create_model(name, FEATURES, CLASSES, modality_sizes=SIZES, pooling_batch_norm_decay=0.99, **TINY)
        assert all(norm.momentum == pytest.approx(0.01) for norm in faster.modules()
                   if isinstance(norm, torch.nn.BatchNorm1d))


@pytest.mark.parametrize("name", POOLING_MODELS + ["GatedMoeModel"])
def test_only_the_classifiers_weights_are_l2_penalized(name):
    """slim.l2_regularizer(moe_l2) is on the MoE's gates and experts only (video_level_models.MoeModel); neither
    original penalizes the gating weights, on the probabilities or the hidden layer."""
    # the pooling models with WILLOW's MoE classifier (NeXtVLAD's own default is logistic: one weight, penalized)
    sizes = {} if name == "GatedMoeModel" else {"modality_sizes": SIZES, "video_level_classifier_model": "MoeModel"}
    model = create_model(name, FEATURES, CLASSES, **sizes, **TINY)
    moe = model.moe if name == "GatedMoeModel" else model.classifier
    assert [weight for weight, _ in model.l2_penalties()] == [moe.gates.weight, moe.experts.weight]
