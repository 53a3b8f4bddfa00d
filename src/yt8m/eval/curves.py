"""A run's TensorBoard scalars read back (the evaluation report's training and validation curves), without TensorFlow
and without the tensorboard package: event files are TFRecord-framed `Event` protos, read with the data layer's
TFRecord reader (CRCs checked) and a scan of the few protobuf fields a scalar needs. One path whether or not the
tensorboard extra is installed (the tests check it against tensorboard's EventAccumulator where it is).

What it reads of tensorflow/core/util/event.proto and summary.proto: Event.wall_time (1), step (2), summary (5) and
session_log (7, status START = 1); Summary.value (1); Value.tag (1), simple_value (2, what torch's SummaryWriter
writes) or tensor (8: a one-value float or double TensorProto, TF2's scalars). Restarts fold as TensorBoard folds
them: a session START at step s (torch's purge_step, written when a run resumes) drops every point at step s or later
written before it, and a point at step s replaces its tag's points at step s or later (a re-run's, an eval of the same
checkpoint again).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Optional

from yt8m.data.format.tfrecord import CorruptRecordError, read_records
from yt8m.data.format.wire import WIRE_FIXED32, WIRE_FIXED64, WIRE_LEN, WIRE_VARINT
from yt8m.data.format.wire_scan import RecordError, iter_fields
from yt8m.io import storage

log = logging.getLogger("yt8m.eval")

EVENT_FILE_PREFIX = "events.out.tfevents."
EVENT_WALL_TIME, EVENT_STEP, EVENT_SUMMARY, EVENT_SESSION_LOG = 1, 2, 5, 7
SESSION_STATUS, SESSION_START = 1, 1
SUMMARY_VALUE = 1
VALUE_TAG, VALUE_SIMPLE, VALUE_TENSOR = 1, 2, 8
TENSOR_DTYPE, TENSOR_CONTENT, TENSOR_FLOAT_VAL, TENSOR_DOUBLE_VAL = 1, 4, 5, 6
DT_FLOAT, DT_DOUBLE = 1, 2
_INT64_SIGN = 1 << 63

# A tag's curve: (step, value) points in step order.
Curve = list[tuple[int, float]]


@dataclass
class Event:
    """What the report reads of one event: its time, step, scalars (tag, value) and whether it starts a session."""

    wall_time: float = 0.0
    step: int = 0
    scalars: list[tuple[str, float]] = field(default_factory=list)
    session_start: bool = False


def parse_event(data: bytes) -> Event:
    """The fields of one serialized Event the curves need; a RecordError where its bytes are not a protobuf."""
    event = Event()
    for number, wire, value in iter_fields(data):
        if number == EVENT_WALL_TIME and wire == WIRE_FIXED64:
            event.wall_time = struct.unpack_from("<d", data, value[0])[0]
        elif number == EVENT_STEP and wire == WIRE_VARINT:
            event.step = value - (1 << 64) if value & _INT64_SIGN else value
        elif number == EVENT_SUMMARY and wire == WIRE_LEN:
            event.scalars += _summary_scalars(data, *value)
        elif number == EVENT_SESSION_LOG and wire == WIRE_LEN:
            event.session_start = any(n == SESSION_STATUS and w == WIRE_VARINT and v == SESSION_START
                                      for n, w, v in iter_fields(data, *value))
    return event


def _summary_scalars(data: bytes, start: int, end: int) -> list[tuple[str, float]]:
    scalars = []
    for number, wire, value in iter_fields(data, start, end):
        if number != SUMMARY_VALUE or wire != WIRE_LEN:
            continue
        tag, scalar = "", None
        for inner, inner_wire, inner_value in iter_fields(data, *value):
            if inner == VALUE_TAG and inner_wire == WIRE_LEN:
                tag = data[inner_value[0]:inner_value[1]].decode("utf-8", errors="replace")
            elif inner == VALUE_SIMPLE and inner_wire == WIRE_FIXED32:
                scalar = struct.unpack_from("<f", data, inner_value[0])[0]
            elif inner == VALUE_TENSOR and inner_wire == WIRE_LEN:
                scalar = _tensor_scalar(data, *inner_value)
        if tag and scalar is not None:
            scalars.append((tag, float(scalar)))
    return scalars


def _tensor_scalar(data: bytes, start: int, end: int) -> Optional[float]:
    """The value of a TensorProto holding one float or double; None for any other tensor (histograms, text)."""
    dtype, values = 0, []
    for number, wire, value in iter_fields(data, start, end):
        if number == TENSOR_DTYPE and wire == WIRE_VARINT:
            dtype = value
        elif number in (TENSOR_FLOAT_VAL, TENSOR_DOUBLE_VAL, TENSOR_CONTENT):
            width = 4 if number == TENSOR_FLOAT_VAL else 8 if number == TENSOR_DOUBLE_VAL else 0
            form = "<f" if number == TENSOR_FLOAT_VAL else "<d"
            if number == TENSOR_CONTENT:
                width, form = {DT_FLOAT: (4, "<f"), DT_DOUBLE: (8, "<d")}.get(dtype, (0, ""))
            if width and wire in (WIRE_LEN, WIRE_FIXED32, WIRE_FIXED64):
                values += [struct.unpack_from(form, data, at)[0] for at in range(value[0], value[1], width)]
    return float(values[0]) if dtype in (DT_FLOAT, DT_DOUBLE) and len(values) == 1 else None


def _file_events(path: str) -> list[Event]:
    """A file's events; a record cut short (a writer still at work) or not an Event ends or skips what is read."""
    events = []
    try:
        for offset, payload in read_records(path):
            try:
                events.append(parse_event(payload))
            except RecordError as err:
                log.warning("%s: record at byte offset %d is not an Event (%s): skipped", path, offset, err)
    except CorruptRecordError as err:
        log.info("%s: read up to a %s at byte offset %d (a writer still at work, or damage)", path, err.problem,
                 err.offset)
    return events


def event_files(directory: str) -> list[str]:
    """The event files directly in `directory` (not its subfolders), by name."""
    return sorted(os.path.join(directory, name) for name in storage.listdir(directory)
                  if name.startswith(EVENT_FILE_PREFIX))


def read_scalars(directory: str) -> dict[str, Curve]:
    """Every scalar tag of the event files directly in `directory`, as its curve; files taken in the order they
    were started (their first event's time), restarts folded (see the module's doc). {} without event files."""
    files = [(events, path) for path in event_files(directory) if (events := _file_events(path))]
    files.sort(key=lambda item: (item[0][0].wall_time, item[1]))
    curves: dict[str, dict[int, float]] = {}
    for events, _ in files:
        for event in events:
            if event.session_start:
                for points in curves.values():
                    _drop_from(points, event.step)
            for tag, value in event.scalars:
                points = curves.setdefault(tag, {})
                _drop_from(points, event.step)
                points[event.step] = value
    return {tag: sorted(points.items()) for tag, points in sorted(curves.items()) if points}


def _drop_from(points: dict[int, float], step: int) -> None:
    for later in [s for s in points if s >= step]:
        del points[later]


def run_curves(train_dir: str) -> dict[str, dict[str, Curve]]:
    """A train dir's curves: "train" (training's scalars, in the train dir itself, or its train/ where a run wrote
    them there) and "eval" (the validation metrics in eval/)."""
    train = read_scalars(train_dir) or read_scalars(os.path.join(train_dir, "train"))
    return {"train": train, "eval": read_scalars(os.path.join(train_dir, "eval"))}
