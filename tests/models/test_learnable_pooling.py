"""The learnable-pooling frame models (WILLOW's NetVLAD, NetRVLAD, NetFV, Soft-DBoF; NeXtVLAD): their pooling
formulas, per-modality sizes, batch norm over real frames only, and a forward pass on a real 2018 video."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from model_helpers import TINY, export_then_predict, train_frames, write_eight_frame_data

from yt8m.commands.train import parse_args
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset
from yt8m.models import create_model
from yt8m.models.config import build_model
from yt8m.models.learnable_pooling import NetFv, NetVlad, SoftBagOfFrames
from yt8m.models.nextvlad import NeXtVlad
from yt8m.models.pooling_layers import FrameBatchNorm

POOLING_MODELS = ["NetVLADModel", "NetRVLADModel", "NetFVModel", "SoftDbofModel", "GatedDbofModel", "NeXtVLADModel"]


def one_video(frames: int = 5, size: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, frames, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def loop_assignment(pooling, video: torch.Tensor) -> torch.Tensor:
    """[frames, clusters] soft assignments, frame by frame (eval-mode batch norm)."""
    norm = pooling.assignment.norm
    rows = []
    for frame in video[0]:
        logits = frame @ pooling.assignment.weight
        logits = (logits - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias
        rows.append(torch.softmax(logits, dim=0))
    return torch.stack(rows)


def test_netvlad_sums_assignment_weighted_residuals_per_cluster():
    torch.manual_seed(0)
    pooling = NetVlad(3, 4, batch_norm=True).double().eval()
    video, mask = one_video(), torch.ones(1, 5, 1, dtype=torch.float64)
    assignment = loop_assignment(pooling, video)
    residuals = torch.stack([sum(assignment[t, k] * (video[0, t] - pooling.centers[k]) for t in range(5))
                             for k in range(4)])
    expected = F.normalize(F.normalize(residuals, dim=1).flatten(), dim=0)
    torch.testing.assert_close(pooling(video, mask)[0], expected)
    light = NetVlad(3, 4, batch_norm=True, residuals=False).double().eval()
    light.assignment.load_state_dict(pooling.assignment.state_dict())
    sums = assignment.T @ video[0]
    torch.testing.assert_close(light(video, mask)[0], F.normalize(F.normalize(sums, dim=1).flatten(), dim=0))


def test_netfv_first_and_second_order_statistics():
    """LOUPE's NetFV: standard deviations sigma = w^2 + 1e-6; the first order intra- and globally normalized, the
    second only globally (tests/models/test_faithful_to_originals.py checks it against LOUPE's code)."""
    torch.manual_seed(0)
    pooling = NetFv(3, 2, batch_norm=True).double().eval()
    video = one_video()
    assignment = loop_assignment(pooling, video)
    sigma = pooling.deviation_roots.square() + 1e-6
    centered = (video[0][:, None, :] - pooling.centers) / sigma  # [frames, clusters, size]
    first = (assignment[..., None] * centered).sum(0)
    second = (assignment[..., None] * (centered.square() - 1)).sum(0)
    flat = [F.normalize(F.normalize(first, dim=1).flatten(), dim=0), F.normalize(second.flatten(), dim=0)]
    torch.testing.assert_close(pooling(video, torch.ones(1, 5, 1, dtype=torch.float64))[0], torch.cat(flat))


def test_soft_dbof_is_the_normalized_sum_of_assignments_over_real_frames():
    torch.manual_seed(0)
    pooling = SoftBagOfFrames(3, 6, batch_norm=True).double().eval()
    video = one_video()
    mask = torch.tensor([1, 1, 1, 0, 0], dtype=torch.float64).view(1, 5, 1)
    expected = F.normalize(loop_assignment(pooling, video)[:3].sum(0), dim=0)
    torch.testing.assert_close(pooling(video, mask)[0], expected)


def test_frame_batch_norm_statistics_cover_only_real_frames():
    torch.manual_seed(0)
    frames = torch.randn(3, 6, 4)
    lengths = torch.tensor([6, 2, 4])
    mask = (torch.arange(6) < lengths[:, None]).unsqueeze(-1).float()
    norm, reference = FrameBatchNorm(4), torch.nn.BatchNorm1d(4, eps=1e-3, momentum=0.001)  # slim's
    real = frames[mask[..., 0].bool()]
    out = norm(frames.masked_fill(mask == 0, 1e3), mask)  # padding full of garbage
    torch.testing.assert_close(out[mask[..., 0].bool()], reference(real))
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    norm.eval(), reference.eval()
    torch.testing.assert_close(norm(frames, mask)[0], reference(frames[0]))


def test_audio_gets_a_fraction_of_the_visual_clusters_and_groups():
    sizes = (16, 8)
    netvlad = create_model("NetVLADModel", 24, 5, modality_sizes=sizes, netvlad_cluster_size=8, willow_hidden_size=4)
    assert [pool.output_size for pool in netvlad.poolings] == [8 * 16, 4 * 8]
    soft = create_model("SoftDbofModel", 24, 5, modality_sizes=sizes, softdbof_cluster_size=64, willow_hidden_size=4)
    assert [pool.output_size for pool in soft.poolings] == [64, 8]
    fv = create_model("NetFVModel", 24, 5, modality_sizes=sizes, fv_cluster_size=4, willow_hidden_size=4)
    assert [pool.output_size for pool in fv.poolings] == [2 * 4 * 16, 2 * 2 * 8]
    nextvlad = create_model("NeXtVLADModel", 24, 5, modality_sizes=sizes, nextvlad_cluster_size=8,
                            nextvlad_groups=4, nextvlad_hidden_size=16)
    assert [(pool.clusters, pool.groups, pool.group_size) for pool in nextvlad.poolings] == [(8, 4, 8), (4, 2, 8)]


def test_nextvlad_attention_and_padding():
    """Padding frames carry no attention: a video alone equals the same video padded, in training mode too."""
    torch.manual_seed(0)
    pooling = NeXtVlad(6, 4, groups=3, expansion=2).train()
    video = torch.randn(2, 5, 6)
    padded = torch.cat([video, torch.randn(2, 4, 6) * 50], dim=1)
    mask = torch.ones(2, 5, 1)
    padded_mask = torch.cat([mask, torch.zeros(2, 4, 1)], dim=1)
    torch.testing.assert_close(pooling(video, mask), pooling(padded, padded_mask))


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="does not split into 3 groups.*--nextvlad_groups"):
        create_model("NeXtVLADModel", 5, 3, nextvlad_groups=3)
    with pytest.raises(ValueError, match=r"modality sizes \[4, 4\] do not add up to feature_size 6"):
        create_model("NetVLADModel", 6, 3, modality_sizes=(4, 4))


def test_willow_gates_hidden_units_and_probabilities_by_default():
    model = create_model("NetVLADModel", 12, 5, **TINY)
    assert model.probability_gating is not None and len(model.head) == 2
    assert all(weight is not model.probability_gating.weight for weight, _ in model.l2_penalties())  # as WILLOW's
    plain = create_model("NetVLADModel", 12, 5, **{**TINY, "context_gating": False, "moe_prob_gating": False})
    assert plain.probability_gating is None and isinstance(plain.head[1], torch.nn.Identity)


@pytest.fixture(scope="module")
def real_video(realdata_dir) -> dict:
    """The real 2018 frame-level video (SjJ3, 170 frames, label 11) as the data pipeline batches it."""
    path = realdata_dir / "yt8m_2018_frame_tfrecord" / "SjJ3_derived_from_paddlevideo_example.tfrecord"
    batch = next(iter(YT8MDataset(str(path), FeatureSpec(["rgb", "audio"], [1024, 128], True), 4)))
    assert batch.features.shape == (1, 170, 1152)
    return batch


@pytest.mark.parametrize("name", POOLING_MODELS)
def test_forward_on_a_real_frame_level_video(name, real_video):
    """The 2018 sizes (rgb 1024, audio 128; 3862 classes), the real video against 4 padded copies of it: finite
    predictions, the same for the video alone and batched with padding."""
    torch.manual_seed(0)
    model = create_model(name, 1152, 3862, modality_sizes=(1024, 128), **TINY)
    features, num_frames = real_video.features, real_video.num_frames
    padded = torch.cat([features, torch.zeros(1, 30, 1152, dtype=features.dtype)], dim=1).expand(4, -1, -1)
    model.train()
    with torch.no_grad():
        model(padded, num_frames.expand(4))  # batch-norm statistics of the real frames
        model.eval()
        alone = model(features, num_frames)["predictions"]
        batched = model(padded, num_frames.expand(4))["predictions"]
    assert alone.shape == (1, 3862) and torch.isfinite(alone).all()
    torch.testing.assert_close(batched, alone.expand(4, -1), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("recipe", ["nextvlad", "netvlad", "netrvlad", "netfv", "softdbof", "gateddbof"])
def test_published_recipes_parse_and_build(recipe, tmp_path, monkeypatch):
    """configs/<recipe>.yaml is a whole `yt8m train` config whose model builds at the 2018 sizes (on the meta device:
    no memory for the weights), where the PCA release's eigenvalues lie where the NeXtVLAD recipe says."""
    path = Path(__file__).resolve().parents[2] / "configs" / f"{recipe}.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "yt8m_pca").mkdir(parents=True)
    np.save(tmp_path / "data" / "yt8m_pca" / "eigenvals.npy", np.linspace(15, 0.001, 2048)[:, None])  # its shape
    config = parse_args(["--config", str(path)])
    features = config.features
    assert features.frame_features and features.feature_sizes == [1024, 128] and features.num_classes == 3862
    with torch.device("meta"):
        model = build_model(config.model, features)
    assert type(model).__name__.lower().startswith(recipe)
    assert sum(p.numel() for p in model.parameters()) > 30_000_000


SMALL_FLAGS = {"NeXtVLADModel": ["--nextvlad_cluster_size", "8", "--nextvlad_hidden_size", "32",
                                 "--nextvlad_groups", "4", "--nextvlad_expansion", "2"],
               "NetVLADModel": ["--netvlad_cluster_size", "8", "--willow_hidden_size", "32"]}


@pytest.fixture(scope="module")
def frame_data(tmp_path_factory) -> dict:
    return write_eight_frame_data(tmp_path_factory.mktemp("frames"))


@pytest.mark.integration
@pytest.mark.parametrize("model", ["NeXtVLADModel", "NetVLADModel"])
def test_compiled_mixed_precision_training_then_onnx_export_predicts(model, frame_data, tmp_path, capsys):
    summary = train_frames("--model", model, *SMALL_FLAGS[model], "--train_data_pattern", frame_data["train"],
                           "--train_dir", str(tmp_path / "run"), "--num_epochs", "2", "--compile", "--mixed_precision")
    assert summary["global_step"] == 8 and summary["loss"] > 0
    assert len(export_then_predict(tmp_path / "run", frame_data["validate"], tmp_path, capsys)) == 1 + 16


@pytest.mark.integration
@pytest.mark.parametrize("model", ["NeXtVLADModel", "NetVLADModel"])
def test_training_under_torchrun(model, frame_data, tmp_path):
    summary = train_frames("--model", model, *SMALL_FLAGS[model], "--train_data_pattern", frame_data["train"],
                           "--train_dir", str(tmp_path / "run"), "--num_epochs", "1", torchrun=True)
    assert summary["global_step"] == 2 and summary["processes"] == 2  # 64 videos, 2 processes of 16 a step
