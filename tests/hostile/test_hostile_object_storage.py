"""s3:// that cannot be reached: an endpoint where nothing listens, a server that refuses the key pair (moto with
key checks), a server that stops answering mid-read. Each is one line naming the URL, never a botocore traceback nor
a hang."""

from __future__ import annotations

import pytest
from cli_outcome import yt8m_here  # noqa: F401  (a fixture)

from s3_server import free_port, loopback_s3_server, s3_environment_set, stalling_proxy
from yt8m.data.making.synthetic import write_synthetic

pytestmark = pytest.mark.hostile

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

# botocore retries a refused connection for 6 s by default; a user in a hurry asks for fewer attempts.
FEW_ATTEMPTS = {"AWS_MAX_ATTEMPTS": "2", "AWS_RETRY_MODE": "standard"}
# (command line, the URL its error must name)
READS = [
    (["inspect", "s3://bucket/shards/*.tfrecord"], "s3://bucket/shards/*.tfrecord"),
    (["inspect", "s3://bucket/shards/a.tfrecord"], "s3://bucket/shards/a.tfrecord"),
    (["eval", "--train_dir", "s3://bucket/run", "--eval_data_pattern", "s3://bucket/shards/*.tfrecord",
      "--run_once"], "s3://bucket/run"),
    (["predict", "--train_dir", "s3://bucket/run", "--input_data_pattern", "s3://bucket/shards/*.tfrecord",
      "--output_file", "predictions.csv"], "s3://bucket/run"),
]


@pytest.fixture(scope="module")
def refusing_endpoint():
    with loopback_s3_server(checking_keys=True) as endpoint:
        yield endpoint


@pytest.mark.parametrize("argv, url", READS, ids=[argv[0] + str(i) for i, (argv, _) in enumerate(READS)])
def test_an_endpoint_where_nothing_listens(yt8m_here, tmp_path, monkeypatch, argv, url):
    for name, value in FEW_ATTEMPTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    with s3_environment_set(f"http://127.0.0.1:{free_port()}"):
        outcome = yt8m_here(*argv)
    outcome.assert_clean_error(url, "Could not connect to the endpoint URL")


@pytest.mark.parametrize("argv, url", READS, ids=[argv[0] + str(i) for i, (argv, _) in enumerate(READS)])
def test_a_key_pair_the_server_refuses(yt8m_here, refusing_endpoint, tmp_path, monkeypatch, argv, url):
    monkeypatch.chdir(tmp_path)
    with s3_environment_set(refusing_endpoint):
        outcome = yt8m_here(*argv)
    outcome.assert_clean_error(url)
    assert "Access Key" in outcome.error_line or "Forbidden" in outcome.error_line


def test_a_read_the_server_stalls_is_one_line_naming_the_file_offset_and_seconds_waited(yt8m_here, tmp_path,
                                                                                       monkeypatch, caplog):
    import s3fs

    shard = write_synthetic(str(tmp_path), num_classes=5, train_videos=8, validate_videos=0, test_videos=0,
                            shards=1, feature_sizes=(4, 2))["train"][0]
    monkeypatch.setenv("YT8M_READ_TIMEOUT_SECS", "0.5")
    monkeypatch.setenv("YT8M_READ_RETRIES", "1")
    with loopback_s3_server() as endpoint, stalling_proxy(endpoint) as (proxy, stall), s3_environment_set(proxy):
        s3fs.S3FileSystem().mkdir("stalls")
        s3fs.S3FileSystem().put(shard, "stalls/train.tfrecord")
        stall.set()
        outcome = yt8m_here("inspect", "s3://stalls/train.tfrecord")
    outcome.assert_clean_error("s3://stalls/train.tfrecord: object storage sent no data for 1 s reading at byte "
                               "offset 0 (2 attempt(s) of 0.5 s; $YT8M_READ_TIMEOUT_SECS and $YT8M_READ_RETRIES")
    assert "reopening it (retry 1 of 1)" in caplog.text
