"""A mid-epoch resume goes on from where the readers stood (the positions a checkpoint keeps): the same batches in
the same order as the uninterrupted run, the same weights bit for bit, without reading the epoch up to the checkpoint
again (in-process and worker readers, a RAM cache, two interleaved sources); a late resume opens the shards the
shuffle buffer's records lie in, not the epoch's."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from workflow_fixtures import FEATURE_SIZES, Crash, crash_after_checkpoint, tiny_data, tiny_train_config  # noqa: F401  (fixture)
from yt8m.data.making.synthetic import write_synthetic
from yt8m.data.reading.dataset import YT8MDataset
from yt8m.data.reading.read_plan import ReadOptions
from yt8m.data.reading.spec import FeatureSpec
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint
from yt8m.training import train
from yt8m.training.trained_ids import TRAINED_IDS_ENV

POSITIONS_USED = "where its readers stood"
READ_AGAIN = "reading the epoch up to the checkpoint again"


def trained_ids(ids_dir: Path) -> list[str]:
    return (ids_dir / "rank-0.txt").read_text().splitlines()


def final_weights(train_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(final_checkpoint(str(train_dir))).model


def run(config, ids_dir: Path, monkeypatch, hooks=()) -> dict:
    ids_dir.mkdir(exist_ok=True)
    monkeypatch.setenv(TRAINED_IDS_ENV, str(ids_dir))
    return train(config, hooks=list(hooks))


@pytest.mark.parametrize("reading", [{"num_readers": 0}, {"num_readers": 2}, {"cache_in_memory": True}],
                         ids=["in_process", "two_workers", "ram_cache"])
def test_a_mid_epoch_resume_goes_on_from_the_readers_positions_exactly(tiny_data, tmp_path, monkeypatch, caplog,
                                                                       reading):
    # 8 batches an epoch; a checkpoint after epoch 2's batch 3, which worker 0 of two gave: worker 1 reads on first
    values = dict(shuffle_buffer=50, batch_size=32, export_model_steps=11, **reading)
    reference = run(tiny_train_config(tiny_data, tmp_path / "a", **values), tmp_path / "ids-a", monkeypatch)
    config = tiny_train_config(tiny_data, tmp_path / "b", **values)
    with pytest.raises(Crash):
        run(config, tmp_path / "ids-b", monkeypatch, [crash_after_checkpoint(11)])
    assert list_checkpoints(str(tmp_path / "b"))[-1][0] == 11
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        resumed = run(config, tmp_path / "ids-b", monkeypatch)
    assert POSITIONS_USED in caplog.text and READ_AGAIN not in caplog.text
    opened = re.search(r"resumed epoch 2: its readers opened (\d+) shards for their first batches, of the (\d+)",
                       caplog.text)
    if "cache_in_memory" in reading:
        assert opened is None  # a RAM cache, filled again, serves the rest of the epoch from its batch on
    else:
        assert opened and int(opened[1]) <= int(opened[2]) == 2
    assert resumed["global_step"] == reference["global_step"] == 24
    assert trained_ids(tmp_path / "ids-b") == trained_ids(tmp_path / "ids-a")  # the same examples, in the same order
    expected = final_weights(tmp_path / "a")
    for name, tensor in final_weights(tmp_path / "b").items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


@pytest.fixture(scope="module")
def second_source(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("second_source")
    write_synthetic(str(root), kind="video", num_classes=10, train_videos=96, validate_videos=0, test_videos=0,
                    shards=3, feature_sizes=FEATURE_SIZES, seed=9, id_key="video_id")
    return str(root / "video" / "train-*.tfrecord")


def test_two_interleaved_sources_resume_where_each_stood(tiny_data, second_source, tmp_path, monkeypatch, caplog):
    tasks = [{"name": "first"}, {"name": "second", "train_data_pattern": second_source, "num_classes": 10}]
    values = dict(tasks=tasks, trunk_hidden_sizes=[16], task_sampling="proportional", shuffle_buffer=40,
                  batch_size=32, num_epochs=2, export_model_steps=3)  # 8 + 3 batches an epoch
    reference = run(tiny_train_config(tiny_data, tmp_path / "a", **values), tmp_path / "ids-a", monkeypatch)
    config = tiny_train_config(tiny_data, tmp_path / "b", **values)
    with pytest.raises(Crash):
        run(config, tmp_path / "ids-b", monkeypatch, [crash_after_checkpoint(15)])  # epoch 2, after 4 of 11
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        resumed = run(config, tmp_path / "ids-b", monkeypatch)
    assert POSITIONS_USED in caplog.text and READ_AGAIN not in caplog.text
    assert resumed["global_step"] == reference["global_step"] == 22
    assert trained_ids(tmp_path / "ids-b") == trained_ids(tmp_path / "ids-a")
    expected = final_weights(tmp_path / "a")
    for name, tensor in final_weights(tmp_path / "b").items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


def test_a_resume_with_another_shuffle_buffer_reads_the_epoch_again_saying_why(tiny_data, tmp_path, monkeypatch,
                                                                                caplog):
    config = tiny_train_config(tiny_data, tmp_path / "run", shuffle_buffer=50, batch_size=32, export_model_steps=5)
    with pytest.raises(Crash):
        run(config, tmp_path / "ids", monkeypatch, [crash_after_checkpoint(10)])
    with caplog.at_level(logging.INFO, logger="yt8m.train"):
        resumed = run(tiny_train_config(tiny_data, tmp_path / "run", shuffle_buffer=60, batch_size=32,
                                        export_model_steps=5), tmp_path / "ids", monkeypatch)
    assert READ_AGAIN in caplog.text and "other processes, workers, batches or buffers" in caplog.text
    assert resumed["global_step"] == 24
    epochs = [line.split()[0] for line in trained_ids(tmp_path / "ids")]
    assert epochs.count("1") == 240 and epochs.count("2") == 240  # epoch 2 still gives each video once


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("many_shards")
    write_synthetic(str(root), kind="video", num_classes=6, train_videos=2000, validate_videos=0, test_videos=0,
                    shards=100, feature_sizes=(8, 4), seed=2)
    return str(root / "video" / "train-*.tfrecord")


def test_a_late_resume_opens_the_shards_of_the_buffers_records_not_the_epochs(many_shards):
    """2,000 videos in 100 shards, a buffer of 100: resumed at 90% of the epoch, the reader opens the shards its
    buffer's records lie in (about buffer x ln(buffer) records back: ~25 shards) and the one it goes on in."""
    spec = FeatureSpec(["mean_rgb", "mean_audio"], [8, 4], num_classes=6)
    options = ReadOptions(shuffle=True, seed=4, shuffle_buffer=100)
    whole = YT8MDataset(many_shards, spec, 20, options)
    whole.set_epoch(1)
    batches = list(whole)
    cut = 90  # of 100 batches
    resumed = YT8MDataset(many_shards, spec, 20, options)
    resumed.set_epoch(1)
    resumed.resume_at(1, {0: batches[cut - 1].position}, 0)
    rest = list(resumed)
    assert [batch.video_ids for batch in rest] == [batch.video_ids for batch in batches[cut:]]
    for got, expected in zip(rest, batches[cut:]):
        assert torch.equal(got.features, expected.features)
    assert whole.read_stats.files_opened == 100
    assert resumed.read_stats.files_opened <= 35
