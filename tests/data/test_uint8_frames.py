"""Frame-level data as uint8 from the shard to the model: the native and Python decoders give the same bytes,
workers hand over the batches in-process reading gives, errors still name file, offset and field, the RAM cache
keeps uint8, and the model dequantizes on its device bit for bit as the data layer's dequantize."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yt8m.data.format import batch_decode
from yt8m.data.format.batch_decode import PackedRecords
from yt8m.data.format.decode import RecordError, decode_frame_batch, dequantize
from yt8m.data.format.encode import encode_frame_example
from yt8m.data.format.tfrecord import TFRecordWriter
from yt8m.data.reading.dataset import FeatureSpec, YT8MDataset, make_loader
from yt8m.data.reading.device_prefetch import to_device_ahead
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.models import create_model
from yt8m.models.base import forward

NAMES, SIZES = ["rgb", "audio"], [16, 8]
SPEC = FeatureSpec(NAMES, SIZES, frame_features=True, max_frames=7, num_classes=10)


def video(index: int, frames: int) -> dict:
    rng = np.random.default_rng(index)
    return {name: rng.integers(0, 256, (frames, size), dtype=np.uint8) for name, size in zip(NAMES, SIZES)}


def payloads() -> list[bytes]:
    """Videos of 0 to 11 frames (max_frames 7 cuts some), one with an unknown context feature, one without labels."""
    records = [encode_frame_example(f"v{index:02d}", [index % 10, (3 * index) % 10], video(index, index % 12))
               for index in range(24)]
    records.append(encode_frame_example("extra", [1], video(99, 5), {"segment_start_times": [0], "segment_labels": [2],
                                                                      "segment_scores": [1.0]}))
    records.append(encode_frame_example("nolabels", [], video(98, 3)))
    return records


def write_shards(folder, count: int = 2) -> str:
    records = payloads()
    for shard in range(count):
        with TFRecordWriter(str(folder / f"train{shard}.tfrecord")) as writer:
            for payload in records[shard::count]:
                writer.write(payload)
    return str(folder / "train*.tfrecord")


def decoded(records: list[bytes]) -> tuple:
    out = np.full((len(records), SPEC.max_frames, sum(SIZES)), 77, np.uint8)  # garbage: padding must be zeroed
    num_frames = np.zeros(len(records), np.int64)
    batch = decode_frame_batch(PackedRecords.join(records), NAMES, SIZES, 10, SPEC.max_frames, out, num_frames)
    return batch.video_ids, batch.labels.lists(), batch.frames.copy(), batch.num_frames.copy()


def test_native_and_python_decoders_give_the_same_bytes(monkeypatch):
    records = payloads()
    assert batch_decode.native is not None, "the native extension is built at install"
    native = decoded(records)
    monkeypatch.setattr(batch_decode, "native", None)
    python = decoded(records)
    assert native[0] == python[0] and native[1] == python[1]
    np.testing.assert_array_equal(native[3], python[3])
    np.testing.assert_array_equal(native[2], python[2])
    ids, _, frames, num_frames = native
    for row, video_id in enumerate(ids[:24]):
        stored = np.concatenate(list(video(row, row % 12).values()), axis=1)[:SPEC.max_frames]
        assert num_frames[row] == len(stored)
        np.testing.assert_array_equal(frames[row, :len(stored)], stored)
        assert not frames[row, len(stored):].any()


def test_a_bad_frame_names_file_offset_and_field(tmp_path):
    good = encode_frame_example("good", [1], video(0, 4))
    bad = encode_frame_example("bad", [1], {"rgb": np.zeros((4, 5), np.uint8), "audio": np.zeros((4, 8), np.uint8)})
    path = tmp_path / "train.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write(good)
        writer.write(bad)
    offset = 16 + len(good)
    for workers in (0, 1):
        for shuffle in (False, True):
            with pytest.raises(RecordError) as raised:
                list(make_loader(YT8MDataset(str(path), SPEC, 8, ReadOptions(shuffle=shuffle)), workers))
            assert str(raised.value) == (f"{path}: record at byte offset {offset}: feature list 'rgb', frame 0: "
                                         "expected 16 bytes, found 5 bytes")
            assert raised.value.field == "rgb"


def by_video(batches) -> dict:
    found = {}
    for batch in batches:
        assert batch.features.dtype == torch.uint8
        for row, video_id in enumerate(batch.video_ids):
            count = int(batch.num_frames[row])
            assert not batch.features[row, count:].any()
            found[video_id] = (batch.features[row, :count].clone(), batch.labels[row].clone())
    return found


@pytest.mark.parametrize("shuffle", [False, True])
def test_workers_hand_over_the_batches_read_in_process(tmp_path, shuffle):
    pattern = write_shards(tmp_path)
    expected = by_video(make_loader(YT8MDataset(pattern, SPEC, 5, ReadOptions(shuffle=shuffle)), 0))
    assert len(expected) == len(payloads())
    for workers in (1, 2):
        found = by_video(make_loader(YT8MDataset(pattern, SPEC, 5, ReadOptions(shuffle=shuffle)), workers))
        assert found.keys() == expected.keys()
        for video_id, (frames, labels) in expected.items():
            assert torch.equal(found[video_id][0], frames) and torch.equal(found[video_id][1], labels), video_id


def test_video_level_workers_hand_over_the_batches_read_in_process(fixtures_dir):
    spec = FeatureSpec(["mean_rgb", "mean_audio"], [1024, 128], frame_features=False)
    pattern = str(fixtures_dir / "video" / "train*.tfrecord")
    expected = {video_id: (batch.features[row], batch.labels[row]) for batch in
                make_loader(YT8MDataset(pattern, spec, 7), 0) for row, video_id in enumerate(batch.video_ids)}
    for workers in (1, 2):
        for batch in make_loader(YT8MDataset(pattern, spec, 7), workers):
            for row, video_id in enumerate(batch.video_ids):
                assert torch.equal(batch.features[row], expected[video_id][0])
                assert torch.equal(batch.labels[row], expected[video_id][1])


def test_the_ram_cache_serves_the_streamed_frames_as_uint8(tmp_path):
    pattern = write_shards(tmp_path)
    streamed = by_video(make_loader(YT8MDataset(pattern, SPEC, 4), 0))
    cached = YT8MDataset(pattern, SPEC, 4, ReadOptions(cache_in_memory=True))
    for epoch in range(2):
        found = by_video(make_loader(cached, 1))
        assert found.keys() == streamed.keys()
        for video_id, (frames, labels) in streamed.items():
            assert torch.equal(found[video_id][0], frames) and torch.equal(found[video_id][1], labels)
    stored = sum(len(chunk) for chunk in cached.cache.videos.features.chunks) * sum(SIZES)
    assert stored == sum(len(frames) for frames, _ in streamed.values()) * sum(SIZES)  # no padding is held


@pytest.mark.parametrize("name", ["FrameLevelLogisticModel", "DbofModel", "NetVLADModel", "NeXtVLADModel",
                                  "LstmModel"])
def test_the_batch_reaches_the_model_as_uint8_and_predicts_as_dequantized_floats(tmp_path, name):
    pattern = write_shards(tmp_path)
    torch.manual_seed(0)
    model = create_model(name, sum(SIZES), 10, modality_sizes=SIZES).eval()
    seen = []
    for batch in to_device_ahead(make_loader(YT8MDataset(pattern, SPEC, 6), 0), torch.device("cpu")):
        with torch.no_grad():
            hook = model.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].dtype))
            on_uint8 = forward(model, batch)["predictions"]
            hook.remove()
            real = (torch.arange(batch.features.shape[1]) < batch.num_frames[:, None]).unsqueeze(-1).numpy()
            floats = torch.from_numpy(np.where(real, dequantize(batch.features.numpy()), np.float32(0)))
            on_floats = model(floats, batch.num_frames)["predictions"]
        assert torch.equal(on_uint8, on_floats)
    assert seen and set(seen) == {torch.uint8}


def dequantization_cases(device: torch.device) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = create_model("NetVLADModel", 1152, 10, modality_sizes=[1024, 128]).to(device)
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (3, 257, 1152), generator=generator, dtype=torch.uint8)
    frames[0, :256, 0] = torch.arange(256, dtype=torch.uint8)  # every value
    real = torch.arange(257)[None, :, None] < torch.tensor([257, 100, 0])[:, None, None]
    return model, frames.to(device), real.to(device)


def expected_values(frames: torch.Tensor, real: torch.Tensor) -> np.ndarray:
    return np.where(real.cpu().numpy(), dequantize(frames.cpu().numpy()), np.float32(0)).view(np.uint32)


def test_dequantization_on_the_model_device_is_bit_identical_eager_and_compiled():
    model, frames, real = dequantization_cases(torch.device("cpu"))
    expected = expected_values(frames, real)
    eager = model.dequantize_frames(frames, real)
    compiled = torch.compile(model.dequantize_frames, fullgraph=True)(frames, real)
    assert eager.dtype == compiled.dtype == torch.float32
    np.testing.assert_array_equal(eager.numpy().view(np.uint32), expected)
    np.testing.assert_array_equal(compiled.numpy().view(np.uint32), expected)


@pytest.mark.gpu
def test_dequantization_on_cuda_is_bit_identical_eager_and_compiled():
    model, frames, real = dequantization_cases(torch.device("cuda"))
    expected = expected_values(frames, real)
    for dequantize_frames in (model.dequantize_frames, torch.compile(model.dequantize_frames, fullgraph=True)):
        np.testing.assert_array_equal(dequantize_frames(frames, real).cpu().numpy().view(np.uint32), expected)


@pytest.mark.gpu
def test_pinned_batches_reach_cuda_one_step_ahead_unchanged(tmp_path):
    pattern = write_shards(tmp_path)
    device = torch.device("cuda")
    for workers in (0, 1):
        expected = by_video(make_loader(YT8MDataset(pattern, SPEC, 5), workers))
        loader = make_loader(YT8MDataset(pattern, SPEC, 5), workers, pin_memory=True)
        moved = list(to_device_ahead(loader, device))
        assert all(batch.features.device.type == "cuda" for batch in moved)
        found = by_video([batch.to(torch.device("cpu")) for batch in moved])
        assert all(torch.equal(found[key][0], expected[key][0]) for key in expected)
