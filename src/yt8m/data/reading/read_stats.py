"""What reading met besides good records: files cut short, records skipped, the id keys (releases) seen and the bytes
read (ReadStats), counted where they happen and gathered where the batches arrive (ReadCounter)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from yt8m.data.format.decode import CLASSES_2017, CLASSES_2018, record_id_key
from yt8m.data.format.tfrecord import CorruptRecordError
from yt8m.data.format.wire_scan import RecordError

logger = logging.getLogger(__name__)


@dataclass
class ReadStats:
    """What reading met besides good records: `skipped_files` counts the shards cut short under skip_corrupt
    (a CRC mismatch or truncation skips the rest of the file), `skipped_records` the records skipped under
    skip_corrupt because they failed to decode (a missing, wrong-size or non-finite feature, a label out of range,
    bad wire data), and `id_key_files` maps each id key seen ("id": 2018 and later, "video_id": 2017) to a file
    using it, decided per file from its first record."""

    skipped_files: int = 0
    skipped_records: int = 0
    id_key_files: dict[str, str] = field(default_factory=dict)
    record_bytes: int = 0  # the TFRecord bytes of the records read (framing included), where the dataset counts them
    files_opened: int = 0  # the shards opened (a resume's: those its shuffle buffer's records come from, and on)

    def add(self, other: "ReadStats") -> None:
        self.skipped_files += other.skipped_files
        self.skipped_records += other.skipped_records
        self.record_bytes += other.record_bytes
        self.files_opened += other.files_opened
        for key, path in other.id_key_files.items():
            self.id_key_files.setdefault(key, path)

    def __bool__(self) -> bool:
        return bool(self.skipped_files or self.skipped_records or self.id_key_files or self.record_bytes or
                    self.files_opened)


class ReadCounter:
    """A dataset's counts: `total` over every epoch read so far, in the process that iterates the dataset or the one
    its workers send their counts to; `unsent`, what this process's reading met since its last batch (absorbed into
    `total` in-process, sent along with the next batch by a worker). Shards that mix 2017 and 2018 id keys get one
    warning."""

    def __init__(self) -> None:
        self.total = ReadStats()
        self.unsent = ReadStats()

    def count_corrupt(self, err: CorruptRecordError) -> None:
        """A file cut short under skip_corrupt (the reader has logged it)."""
        self.unsent.skipped_files += 1

    def skip_record(self, err: RecordError) -> None:
        logger.warning("%s; skipping this record", err)
        self.unsent.skipped_records += 1

    def note_id_key(self, path: str, payload: bytes, sequence: bool) -> None:
        """The id key of `path`'s first record, `payload`."""
        key = record_id_key(payload, sequence)
        if key is not None:
            self.unsent.id_key_files.setdefault(key, path)

    def take_unsent(self) -> ReadStats:
        stats, self.unsent = self.unsent, ReadStats()
        return stats

    def absorb(self, stats: ReadStats) -> None:
        """Add what a reader met to `total`, warning the first time two id keys have been seen."""
        mixed_before = len(self.total.id_key_files) > 1
        self.total.add(stats)
        files = self.total.id_key_files
        if not mixed_before and len(files) > 1:
            logger.warning("these shards mix YouTube-8M releases: id key 'id' (2018 and later, %d classes; e.g. %s) "
                           "and 'video_id' (2017, %d classes; e.g. %s); their label ids mean different classes",
                           CLASSES_2018, files.get("id"), CLASSES_2017, files.get("video_id"))
