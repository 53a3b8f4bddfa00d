"""Tests of TFRecord framing: fixture offsets, GZIP detection, corrupt files, globs, write-read round trips; each
on both framings, _native.c's and its Python fallback."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import re
import shutil
import struct
import uuid

import fsspec
import numpy as np
import pytest

from conftest import load_sidecar
from yt8m.data.format import tfrecord
from yt8m.data.format.tfrecord import (
    CorruptRecordError,
    TFRecordWriter,
    expand_pattern,
    read_record_chunks,
    read_records,
)

VALID_FILES = ["video/train00.tfrecord", "video/train01.tfrecord", "video/train02.tfrecord",
               "video_2017/train00.tfrecord", "video_gzip/train00.tfrecord.gz",
               "frame/train00.tfrecord", "frame/train01.tfrecord",
               "segment/validate00.tfrecord", "segment/validate01.tfrecord"]
CORRUPT_FILES = ["corrupt/video_bad_data_crc.tfrecord", "corrupt/video_bad_length_crc.tfrecord",
                 "corrupt/video_truncated.tfrecord"]
NATIVE = tfrecord.native


@pytest.fixture(autouse=True, params=["native", "python"])
def framing(request, monkeypatch) -> str:
    """Every test runs on the native framing and on the Python fallback: the same records, errors and offsets."""
    if request.param == "native" and NATIVE is None:
        pytest.skip("the native extension is not built")
    if request.param == "python":
        monkeypatch.setattr(tfrecord, "native", None)
    return request.param


@pytest.mark.skipif(NATIVE is None, reason="the native extension is not built")
def test_python_framing_returns_what_the_native_framing_does():
    """Both framings over damaged buffers (a byte changed, a cut) and record limits: the same count, position,
    status, bytes needed and payload bounds."""
    rng = np.random.default_rng(7)
    records = [rng.bytes(int(size)) for size in rng.integers(0, 300, 30)]
    clean = b"".join(struct.pack("<Q", len(r)) + struct.pack("<I", tfrecord.masked_crc32c(struct.pack("<Q", len(r))))
                     + r + struct.pack("<I", tfrecord.masked_crc32c(r)) for r in records)
    for trial in range(300):
        data = np.frombuffer(clean, np.uint8).copy()
        if trial % 2:
            data[rng.integers(len(data))] ^= 1 << rng.integers(8)
        fill = int(rng.integers(len(data) + 1)) if trial % 3 == 0 else len(data)
        limit = int(rng.integers(1, 40))
        results = []
        for frame in (NATIVE.frame_records, tfrecord.frame_records_python):
            starts, ends = np.zeros(limit, np.int64), np.zeros(limit, np.int64)
            count, pos, status, needed = frame(data, 0, fill, limit, starts, ends)
            results.append((count, pos, status, needed, starts[:count].tolist(), ends[:count].tolist()))
        assert results[0] == results[1], f"trial {trial}"
    statuses = ("FRAME_LIMIT", "FRAME_NEED_BYTES", "FRAME_BAD_LENGTH_CRC", "FRAME_BAD_PAYLOAD_CRC")
    assert [getattr(NATIVE, name) for name in statuses] == [getattr(tfrecord, name) for name in statuses]


@pytest.mark.parametrize("name", VALID_FILES)
def test_record_offsets_and_lengths_match_sidecar(fixtures_dir, name):
    sidecar = load_sidecar(fixtures_dir / name)
    found = [(offset, len(payload)) for offset, payload in read_records(str(fixtures_dir / name))]
    assert found == [(r["offset"], r["length"]) for r in sidecar["records"]]


@pytest.mark.parametrize("name", CORRUPT_FILES)
def test_corrupt_file_fails_where_tensorflow_does(fixtures_dir, name):
    path = str(fixtures_dir / name)
    corruption = load_sidecar(fixtures_dir / name)["corruption"]
    tf_problem, tf_offset = re.search(r"(corrupted|truncated) record at (\d+)", corruption["tf_error"]).groups()
    read = []
    with pytest.raises(CorruptRecordError) as caught:
        for offset, _ in read_records(path):
            read.append(offset)
    assert len(read) == corruption["tf_records_read_before_error"]
    assert caught.value.offset == int(tf_offset)
    assert caught.value.path == path
    assert path in str(caught.value) and f"{tf_problem} record at {tf_offset}" in str(caught.value)


@pytest.mark.parametrize("name", CORRUPT_FILES)
def test_skip_corrupt_keeps_intact_records_and_reports(fixtures_dir, name, caplog):
    path = str(fixtures_dir / name)
    sidecar = load_sidecar(fixtures_dir / name)
    skipped = []
    with caplog.at_level(logging.WARNING):
        offsets = [offset for offset, _ in read_records(path, skip_corrupt=True, on_corrupt=skipped.append)]
    intact = sidecar["records"][:sidecar["corruption"]["bad_record_index"]]
    assert offsets == [r["offset"] for r in intact]
    assert len(skipped) == 1 and skipped[0].path == path
    assert any(path in rec.getMessage() and "skipping" in rec.getMessage() for rec in caplog.records)


def write_records(path: str, payloads: list[bytes], compression=None) -> None:
    with TFRecordWriter(path, compression=compression) as writer:
        for payload in payloads:
            writer.write(payload)


PAYLOADS = [b"", b"a", bytes(range(256)) * 40, b"\x1f\x8b" * 9]


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("name", ["plain.tfrecord", "named.gz"])
def test_write_then_read_local(tmp_path, compression, name):
    path = str(tmp_path / name)
    write_records(path, PAYLOADS, compression)
    assert [payload for _, payload in read_records(path)] == PAYLOADS
    with open(path, "rb") as fh:
        assert (fh.read(2) == b"\x1f\x8b") == (compression == "GZIP")


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_write_then_read_memory_filesystem(compression):
    root = f"memory://tfrecord-{uuid.uuid4().hex}"
    for shard in range(3):
        write_records(f"{root}/part-{shard}.tfrecord", [b"shard %d" % shard], compression)
    paths = expand_pattern(f"{root}/part-*.tfrecord")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["part-0.tfrecord", "part-1.tfrecord", "part-2.tfrecord"]
    assert [payload for p in paths for _, payload in read_records(p)] == [b"shard 0", b"shard 1", b"shard 2"]


def test_plain_file_starting_like_gzip_is_read_plain(tmp_path):
    # A first record of 0x8b1f bytes puts the GZIP magic at the start of a plain file.
    payloads = [b"x" * 0x8B1F, b"y"]
    path = str(tmp_path / "magic.tfrecord")
    write_records(path, payloads)
    with open(path, "rb") as fh:
        assert fh.read(2) == b"\x1f\x8b"
    assert [payload for _, payload in read_records(path)] == payloads


def test_gzip_detected_from_content_not_name(fixtures_dir, tmp_path):
    renamed = tmp_path / "no_suffix.tfrecord"
    shutil.copy(fixtures_dir / "video_gzip/train00.tfrecord.gz", renamed)
    assert sum(1 for _ in read_records(str(renamed))) == 50


def test_truncated_inside_a_header(tmp_path):
    path = tmp_path / "short.tfrecord"
    write_records(str(path), [b"first", b"second"])
    data = path.read_bytes()
    path.write_bytes(data[:12 + 5 + 4 + 7])
    with pytest.raises(CorruptRecordError, match=r"truncated record at 21"):
        list(read_records(str(path)))


def test_expand_pattern_comma_separated_sorted_unique(fixtures_dir):
    video = fixtures_dir / "video"
    paths = expand_pattern(f"{video}/train02.tfrecord, {video}/train0[01].tfrecord,{video}/*.tfrecord")
    assert paths == [str(video / f"train0{i}.tfrecord") for i in range(3)]


def test_expand_pattern_empty_glob_names_it(fixtures_dir):
    missing = f"{fixtures_dir}/video/nothing*.tfrecord"
    with pytest.raises(ValueError, match=re.escape(missing)):
        expand_pattern(f"{fixtures_dir}/video/*.tfrecord,{missing}")
    with pytest.raises(ValueError, match="nothing_here"):
        expand_pattern("memory://nothing_here/*.tfrecord")


def test_expand_pattern_ignores_directories(tmp_path):
    (tmp_path / "dir.tfrecord").mkdir()
    (tmp_path / "a.tfrecord").write_bytes(b"")
    assert expand_pattern(str(tmp_path / "*.tfrecord")) == [str(tmp_path / "a.tfrecord")]


def test_writer_rejects_unknown_compression(tmp_path):
    with pytest.raises(ValueError, match="ZLIB"):
        TFRecordWriter(str(tmp_path / "x"), compression="ZLIB")


def test_writer_adds_only_the_framing():
    path = f"memory://raw-{uuid.uuid4().hex}/one.tfrecord"
    write_records(path, [b"payload"])
    with fsspec.open(path, "rb") as fh:
        assert len(fh.read()) == 12 + 7 + 4


def test_damaged_gzip_stream_is_a_corrupt_record(tmp_path):
    path = tmp_path / "cut.tfrecord.gz"
    payloads = [bytes([i]) * 50_000 for i in range(1, 40)]
    write_records(str(path), payloads, "GZIP")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    read = []
    with pytest.raises(CorruptRecordError, match=r"cut.tfrecord.gz: corrupted record at \d+ \(GZIP stream"):
        for _, payload in read_records(str(path)):
            read.append(payload)
    assert 0 < len(read) < len(payloads) and read == payloads[:len(read)]
    assert [p for _, p in read_records(str(path), skip_corrupt=True)] == read


def test_gzip_highly_compressible_and_concatenated_members(tmp_path):
    first, second = tmp_path / "a.gz", tmp_path / "b.gz"
    write_records(str(first), [bytes(3_000_000), b"x"], "GZIP")  # compresses about 1000:1
    write_records(str(second), [b"second member"], "GZIP")
    joined = tmp_path / "joined.tfrecord"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    assert [p for _, p in read_records(str(joined))] == [bytes(3_000_000), b"x", b"second member"]


def chunk_payloads(chunk) -> list[bytes]:
    return [chunk.data[start:end].tobytes() for start, end in zip(chunk.starts, chunk.ends)]


def read_chunks(path: str, limit: int, limit_after_second: int) -> tuple[list[bytes], list[int], list[int]]:
    chunks = read_record_chunks(path, limit)
    payloads, sizes, offsets = [], [], []
    chunk = next(chunks)
    while True:
        payloads += chunk_payloads(chunk)
        sizes.append(len(chunk.starts))
        offsets += chunk.offsets.tolist()
        try:
            chunk = chunks.send(limit_after_second if len(sizes) == 2 else None)
        except StopIteration:
            return payloads, sizes, offsets


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("read_size", [None, 1 << 20], ids=["default", "1MB"])
def test_chunks_hand_out_every_record_as_many_as_asked_for(tmp_path, monkeypatch, compression, read_size):
    """Records of 100 KB to 700 KB: read whole into the default buffer, chunks hold exactly the records asked for,
    send(n) changing that; through a 1 MB buffer (a record larger than it grows it) they hold at most that many.
    Either way every record comes once, in order, at its own offset."""
    if read_size:
        monkeypatch.setattr(tfrecord, "READ_SIZE", read_size)
    rng = np.random.default_rng(0)
    payloads = [rng.bytes(int(size)) for size in rng.integers(100_000, 700_000, 23)]
    path = str(tmp_path / "big.tfrecord")
    write_records(path, payloads, compression)
    got, sizes, offsets = read_chunks(path, 4, 6)
    assert got == payloads
    assert offsets == np.cumsum([0] + [16 + len(p) for p in payloads[:-1]]).tolist()
    if read_size is None:
        assert sizes == [4, 4, 6, 6, 3]
    else:
        assert max(sizes[:2]) <= 4 and max(sizes) <= 6 and len(sizes) > 5


def test_chunks_before_a_corrupt_record_are_handed_out_first(fixtures_dir):
    name = "corrupt/video_bad_data_crc.tfrecord"
    bad_index = load_sidecar(fixtures_dir / name)["corruption"]["bad_record_index"]
    read = []
    with pytest.raises(CorruptRecordError, match="payload CRC mismatch"):
        for chunk in read_record_chunks(str(fixtures_dir / name), 1000):
            read += chunk_payloads(chunk)
    assert len(read) == bad_index


def test_random_bytes_are_a_corrupt_record_not_a_crash(tmp_path):
    """Garbage of every short length, and long garbage behind a valid record: a CorruptRecordError each time."""
    rng = np.random.default_rng(3)
    valid = tmp_path / "valid.tfrecord"
    write_records(str(valid), [b"first record"])
    for size in list(range(1, 40)) + [1000, 100_000]:
        path = tmp_path / f"garbage{size}.tfrecord"
        path.write_bytes(valid.read_bytes() + rng.bytes(size))
        read = []
        with pytest.raises(CorruptRecordError, match=str(path)):
            for _, payload in read_records(str(path)):
                read.append(payload)
        assert read == [b"first record"]


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_file_cut_inside_the_last_crc_says_what_the_record_needs(tmp_path, compression):
    path = tmp_path / "cut_crc.tfrecord"
    write_records(str(path), [b"first", bytes(4697)])
    path.write_bytes(path.read_bytes()[:-2])
    if compression:
        path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(CorruptRecordError) as caught:
        list(read_records(str(path)))
    assert str(caught.value) == (f"{path}: truncated record at 21 (its 4697-byte payload and 4-byte CRC need 4701 "
                                 "bytes, 4699 left in the file)")


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("length", [2 ** 64 - 1, 2 ** 64 - 16, 2 ** 40])
def test_an_implausible_length_is_told_as_stored(tmp_path, monkeypatch, compression, length):
    """A damaged length whose CRC still matches: no wrap-around to "-1 bytes", and no allocation of its size
    (a stream through a 1 MB buffer grows it only as far as the file goes)."""
    monkeypatch.setattr(tfrecord, "READ_SIZE", 1 << 20)
    header = struct.pack("<Q", length)
    data = header + struct.pack("<I", tfrecord.masked_crc32c(header)) + bytes(3_000_000)
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(gzip.compress(data) if compression else data)
    with pytest.raises(CorruptRecordError) as caught:
        list(read_records(str(path)))
    assert str(caught.value) == (f"{path}: truncated record at 0 (its length field says {length} payload bytes, "
                                 "more than the 3000000 left in the file)")


def test_a_file_truncated_while_it_is_read_is_a_corrupt_record_not_a_crash(tmp_path, monkeypatch):
    """Another process cuts the file between two reads (here: between two chunks). Read through a mapping, the
    next access to a page past the new end raised SIGBUS and killed the process."""
    monkeypatch.setattr(tfrecord, "READ_SIZE", 1 << 20)
    path = tmp_path / "shrinking.tfrecord"
    payloads = [bytes([i]) * 100_000 for i in range(40)]
    write_records(str(path), payloads)
    chunks = read_record_chunks(str(path), 5)
    first = next(chunks)
    assert chunk_payloads(first) == payloads[:5]
    os.truncate(path, 2_400_000)  # inside record 23, past the first 1 MB read; mapped, the page after it faulted
    read = chunk_payloads(first)
    with pytest.raises(CorruptRecordError, match=re.escape(f"{path}: truncated record at {23 * 100_016} ")):
        for chunk in iter(lambda: chunks.send(None), None):
            read += chunk_payloads(chunk)
    assert read == payloads[:23]
    skipped = []
    kept = [payload for _, payload in read_records(str(path), skip_corrupt=True, on_corrupt=skipped.append)]
    assert kept == payloads[:23] and len(skipped) == 1


def test_corrupt_record_error_survives_pickling():
    """As a DataLoader worker sends it to the main process."""
    error = CorruptRecordError("/data/x.tfrecord", 4711, "truncated record", "2 bytes left")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CorruptRecordError and str(copy) == str(error)
    assert (copy.path, copy.offset, copy.problem, copy.detail) == ("/data/x.tfrecord", 4711, "truncated record",
                                                                   "2 bytes left")
