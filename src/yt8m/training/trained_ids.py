"""Debugging the data split of a run: with YT8M_TRAINED_IDS_DIR=DIR set, each training process appends
"<epoch> <video id>" for every example it trains on to DIR/rank-<rank>.txt (the distributed tests read them)."""

from __future__ import annotations

import os

from yt8m.data.reading.batch import Batch

TRAINED_IDS_ENV = "YT8M_TRAINED_IDS_DIR"


def record_trained_ids(rank: int, epoch: int, group: list[Batch]) -> None:
    """YT8M_TRAINED_IDS_DIR: append "<epoch> <video id>" per trained example to DIR/rank-<rank>.txt."""
    directory = os.environ.get(TRAINED_IDS_ENV)
    if not directory:
        return
    with open(os.path.join(directory, f"rank-{rank}.txt"), "a") as fh:
        fh.writelines(f"{epoch} {video_id}\n" for batch in group for video_id in batch.video_ids)
