"""s3:// end to end against an S3-compatible server on loopback (moto's, in its own process, through s3fs): data read
and globbed there, a train dir there (checkpoints, resume, exports), eval and predict reading it and writing there,
every result equal to the local-disk run's; uploads that appear only whole; options reaching fsspec (gs:// too)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import fsspec
import pytest
import torch
from fsspec.registry import _registry, known_implementations

from s3_server import loopback_s3_server, s3_environment_set
from workflow_fixtures import FEATURE_SIZES, NUM_CLASSES, as_flags, tiny_data  # noqa: F401 (a fixture)
from yt8m import cli
from yt8m.data.format.tfrecord import expand_pattern
from yt8m.data.reading.fetch_ahead import FETCH_THREADS
from yt8m.io import storage
from yt8m.io.files import WriteError, atomic_writer, write_file_atomically

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BUCKET = "yt8m-test"
TIMINGS = {"seconds", "examples_per_sec"}
MODEL_FLAGS = dict(model="MoeModel", feature_names="mean_rgb,mean_audio",
                   feature_sizes=",".join(map(str, FEATURE_SIZES)), num_classes=NUM_CLASSES)


@pytest.fixture(scope="module")
def s3():
    """The loopback server's s3fs filesystem, with one bucket; the process's environment points s3fs at it."""
    import s3fs

    with loopback_s3_server() as endpoint, s3_environment_set(endpoint):
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        yield fs


@pytest.fixture(scope="module")
def s3_data(s3, tiny_data) -> dict:
    """tiny_data's shards uploaded to s3://yt8m-test/data/video/."""
    folder = os.path.dirname(tiny_data["train_pattern"])
    s3.put(folder + "/", f"{BUCKET}/data/video/", recursive=True)
    return {split: f"s3://{BUCKET}/data/video/{split}-*.tfrecord" for split in ("train", "validate", "test")}


def run_cli(capsys, *argv: str) -> list[dict]:
    """`yt8m ARGV` in this process: its JSON lines."""
    assert cli.main(list(argv)) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def train_eval_predict(capsys, patterns: dict, train_dir: str, predictions: str) -> dict:
    """Train one epoch, resume for a second (train-and-evaluate: exports), eval the run, predict the test split."""
    train_flags = as_flags(dict(train_data_pattern=patterns["train"], eval_data_pattern=patterns["validate"],
                                train_dir=train_dir, batch_size=64, export_model_steps=4, num_readers=0,
                                base_learning_rate=0.05, seed=7, **MODEL_FLAGS))
    first = run_cli(capsys, "train", *train_flags, "--num_epochs", "1")[-1]
    resumed = run_cli(capsys, "train", *train_flags, "--num_epochs", "2")[-1]
    evaluated = run_cli(capsys, "eval", "--train_dir", train_dir, "--eval_data_pattern", patterns["validate"],
                        "--run_once", "--num_readers", "0")[-1]
    predicted = run_cli(capsys, "predict", "--train_dir", train_dir, "--input_data_pattern", patterns["test"],
                        "--output_file", predictions, "--num_readers", "0")[-1]
    return {"first": first, "resumed": resumed, "evaluated": evaluated, "predicted": predicted}


def results(summary: dict) -> dict:
    """A command's summary less its timings and paths."""
    return {k: v for k, v in summary.items() if not isinstance(v, str) and k not in TIMINGS}


def final_weights(train_dir: str) -> dict[str, torch.Tensor]:
    from yt8m.io.checkpoints import final_checkpoint, load_checkpoint

    return load_checkpoint(final_checkpoint(train_dir)).model


@pytest.fixture
def store_calls(monkeypatch) -> collections.Counter:
    """Every request s3fs sends the store in this process, by its API name (head_object, get_object, ...)."""
    import s3fs.core

    calls: collections.Counter = collections.Counter()
    call_s3 = s3fs.core.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls[getattr(method, "__name__", method)] += 1
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.core.S3FileSystem, "_call_s3", counted)
    return calls


def test_reading_shards_from_their_listing_never_asks_the_store_their_size(s3, s3_data, tmp_path, capsys,
                                                                           store_calls):
    """The listing gives every shard's size: the read plan, the memory estimates and each open use it (no HEAD)."""
    run_cli(capsys, "train", *as_flags(dict(train_data_pattern=s3_data["train"], train_dir=str(tmp_path / "run"),
                                            batch_size=64, num_epochs=1, num_readers=0, seed=7, **MODEL_FLAGS)))
    shards = len(expand_pattern(s3_data["train"]))
    assert store_calls["head_object"] == 0, store_calls
    assert store_calls["list_objects_v2"] <= 2 and shards <= store_calls["get_object"] <= shards + 4, store_calls
    store_calls.clear()
    run_cli(capsys, "eval", "--train_dir", str(tmp_path / "run"), "--eval_data_pattern", s3_data["validate"],
            "--run_once", "--num_readers", "0")
    assert store_calls["head_object"] == 0 and store_calls["get_object"] == len(expand_pattern(s3_data["validate"]))


@pytest.mark.integration
def test_train_resume_eval_predict_on_s3_equal_the_local_run(s3, s3_data, tiny_data, tmp_path, capsys):
    local_patterns = {split: tiny_data[f"{split}_pattern"] for split in ("train", "validate", "test")}
    local = train_eval_predict(capsys, local_patterns, str(tmp_path / "run"), str(tmp_path / "predictions.csv"))
    remote_dir, remote_predictions = f"s3://{BUCKET}/runs/moe", f"s3://{BUCKET}/out/predictions.csv"
    remote = train_eval_predict(capsys, s3_data, remote_dir, remote_predictions)

    assert remote["first"]["global_step"] == 4 and remote["resumed"]["global_step"] == 8  # resumed at 4, not 0
    for stage in ("first", "resumed", "evaluated"):
        assert results(remote[stage]) == results(local[stage]), stage
    assert remote["predicted"]["videos"] == local["predicted"]["videos"] == 48
    assert s3.cat_file(f"{BUCKET}/out/predictions.csv") == (tmp_path / "predictions.csv").read_bytes()
    remote_weights, local_weights = final_weights(remote_dir), final_weights(str(tmp_path / "run"))
    assert remote_weights.keys() == local_weights.keys()
    assert all(torch.equal(remote_weights[name], local_weights[name]) for name in local_weights)
    # The same files, exports included, and nothing staged left behind.
    local_files = sorted(os.path.relpath(os.path.join(folder, name), tmp_path / "run")
                         for folder, _, names in os.walk(tmp_path / "run") for name in names
                         if not name.startswith((".yt8m-train.lock", "events.out.tfevents.")))
    remote_files = sorted(os.path.relpath(path, f"{BUCKET}/runs/moe") for path in s3.find(f"{BUCKET}/runs/moe"))
    assert remote_files == local_files
    assert any(name.startswith("export/best/") for name in remote_files)


def test_an_upload_appears_only_whole(s3, tmp_path):
    url = f"s3://{BUCKET}/atomic/checkpoint.bin"
    write_file_atomically(url, lambda out: out.write("first"))
    with pytest.raises(RuntimeError, match="killed mid-write"):
        with atomic_writer(url, binary=True) as out:
            out.write(b"x" * (3 << 20))  # past the writer's buffer: bytes reached the staged file
            raise RuntimeError("killed mid-write")
    assert storage.read_bytes(url) == b"first"  # the earlier object, untouched
    assert storage.listdir(f"s3://{BUCKET}/atomic") == ["checkpoint.bin"]
    with pytest.raises(WriteError, match=f"could not write s3://no-such-bucket-{os.getpid()}/x.json"):
        write_file_atomically(f"s3://no-such-bucket-{os.getpid()}/x.json", lambda out: out.write("{}"))


def test_listings_are_never_stale(s3):
    """A watching eval lists the train dir again and again: objects another client wrote since must show."""
    folder = f"s3://{BUCKET}/listing"
    assert storage.listdir(folder) == []
    s3.pipe_file(f"{BUCKET}/listing/ckpt-00000004.pt", b"4")
    assert storage.listdir(folder) == ["ckpt-00000004.pt"]
    s3.pipe_file(f"{BUCKET}/listing/ckpt-00000008.pt", b"8")
    assert sorted(storage.listdir(folder)) == ["ckpt-00000004.pt", "ckpt-00000008.pt"]
    s3.rm_file(f"{BUCKET}/listing/ckpt-00000004.pt")
    assert storage.listdir(folder) == ["ckpt-00000008.pt"] and not storage.exists(f"{folder}/ckpt-00000004.pt")


def test_fsspec_configuration_reaches_s3fs_through_the_cli(s3):
    """The endpoint given as fsspec configuration (FSSPEC_S3_ENDPOINT_URL) instead of AWS_ENDPOINT_URL_S3: the
    route every s3fs or gcsfs option takes (FSSPEC_GS_TOKEN=anon for public gs:// buckets)."""
    env = {name: value for name, value in os.environ.items() if name != "AWS_ENDPOINT_URL_S3"}
    env["FSSPEC_S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL_S3"]
    synth = subprocess.run([sys.executable, "-m", "yt8m", "synth", "--output_dir", f"s3://{BUCKET}/synth",
                            "--num_classes", "5", "--train_videos", "20", "--validate_videos", "0",
                            "--test_videos", "0", "--shards", "2", "--feature_sizes", "4,2"],
                           capture_output=True, text=True, timeout=120, env=env)
    assert synth.returncode == 0, synth.stderr
    assert expand_pattern(f"s3://{BUCKET}/synth/video/train-*") == [
        f"s3://{BUCKET}/synth/video/train-0000{i}-of-00002.tfrecord" for i in range(2)]


def test_an_s3_client_keeps_enough_connections_for_the_reads_fetched_ahead(s3, monkeypatch):
    """botocore's 10 connections would queue the fetch-ahead's reads; fsspec's configuration still sets the number."""
    fs, _ = storage.filesystem(f"s3://{BUCKET}/data")
    assert fs.config_kwargs["max_pool_connections"] == storage.S3_CONNECTIONS > FETCH_THREADS
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"max_pool_connections": 7, "read_timeout": 9}})
    fs, _ = storage.filesystem(f"s3://{BUCKET}/data")
    assert fs.config_kwargs == {"max_pool_connections": 7, "read_timeout": 9}


def test_gs_options_from_fsspec_configuration_reach_the_filesystem(monkeypatch):
    """FSSPEC_GS_TOKEN=anon (fsspec reads it into fsspec.config.conf at import) reaches gcsfs's constructor when
    yt8m opens gs:// paths; a stand-in for gcsfs records what it is given (no network, no gcsfs needed)."""
    from fsspec.implementations.memory import MemoryFileSystem

    class RecordingGCS(MemoryFileSystem):
        protocol = ("gs", "gcs")
        given: list[dict] = []

        def __init__(self, *args, **options):
            RecordingGCS.given.append(options)
            super().__init__(*args, **options)

    monkeypatch.setitem(_registry, "gs", RecordingGCS)
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
    with pytest.raises(ValueError, match="no files match"):
        expand_pattern("gs://public-bucket/train-*.tfrecord")
    assert RecordingGCS.given and all(options.get("token") == "anon" for options in RecordingGCS.given)
    RecordingGCS.clear_instance_cache()


def test_a_missing_object_store_package_names_the_extra(monkeypatch):
    monkeypatch.delitem(_registry, "gs", raising=False)
    monkeypatch.setitem(known_implementations, "gs",
                        {"class": "no_such_module.GCSFileSystem", "err": "Please install gcsfs to access gs://"})
    with pytest.raises(ValueError, match=r"cannot reach gs://b/x: .*pip install 'yt8m\[gcs\]'"):
        storage.exists("gs://b/x")


@pytest.mark.integration
def test_an_onnx_export_on_object_storage_predicts_as_the_local_one(s3, tiny_data, tmp_path, capsys):
    """`yt8m export --output s3://...` uploads the graph then its metadata; `predict --model s3://...` reads it back
    and writes the local export's predictions byte for byte."""
    train_dir = str(tmp_path / "run")
    run_cli(capsys, "train", *as_flags(dict(train_data_pattern=tiny_data["train_pattern"], train_dir=train_dir,
                                            batch_size=64, num_epochs=1, num_readers=0, seed=3, **MODEL_FLAGS)))
    exports = {"local": str(tmp_path / "export"), "remote": f"s3://{BUCKET}/exports/moe"}
    predictions = {}
    for where, output in exports.items():
        exported = run_cli(capsys, "export", "--train_dir", train_dir, "--output", output)[-1]
        assert exported["model_file"] == f"{output}/model.onnx"
        predictions[where] = str(tmp_path / f"{where}.csv")
        run_cli(capsys, "predict", "--model", output, "--input_data_pattern", tiny_data["test_pattern"],
                "--output_file", predictions[where], "--num_readers", "0")
    assert sorted(s3.ls(f"{BUCKET}/exports/moe")) == [f"{BUCKET}/exports/moe/metadata.json",
                                                       f"{BUCKET}/exports/moe/model.onnx"]
    remote_csv = (tmp_path / "remote.csv").read_bytes()
    assert remote_csv == (tmp_path / "local.csv").read_bytes() and remote_csv.count(b"\n") == 49
    s3.rm_file(f"{BUCKET}/exports/moe/model.onnx")
    assert cli.main(["predict", "--model", exports["remote"], "--input_data_pattern", tiny_data["test_pattern"],
                     "--output_file", str(tmp_path / "none.csv")]) == 1
    assert "exported model not found: s3://yt8m-test/exports/moe/model.onnx" in capsys.readouterr().err