"""Predictions and where they go: a Predictor (a checkpoint's model or an ONNX export, on the reader's batches), each
video's top-k classes as Kaggle CSV or JSON-lines rows, the checks of what those can hold (an id, a finite score, each
video once), and JSON lines read back or turned into the CSV (`convert_predictions`)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence, TextIO, TypeVar

import torch
from torch import nn

from yt8m.data.reading.batch import Batch
from yt8m.data.reading.spec import FeatureSpec
from yt8m.distributed.ranks import training_device
from yt8m.eval.score import text_lines
from yt8m.fields import quoted
from yt8m.inference.config import ModelSourceConfig
from yt8m.inference.onnx_export import load_exported
from yt8m.io.checkpoints import load_latest_checkpoint
from yt8m.io.files import write_file_atomically
from yt8m.io.spill import Duplicate, KeyedTable, TemporaryDatabase, add_unique
from yt8m.models.base import forward
from yt8m.models.checkpoints import build_model_from_payload

log = logging.getLogger("yt8m.inference.predict")

CSV_HEADER = "VideoId,LabelConfidencePairs\n"

# A Batch of YT8MDataset (its features and num_frames) -> probabilities [batch, classes] on the CPU.
Predictor = Callable[[Batch], torch.Tensor]


class Predicted(Protocol):
    """What predictions are written for: a batch of videos (a Batch, or an ensemble's aligned batch)."""

    @property
    def video_ids(self) -> Sequence[str]: ...


P = TypeVar("P", bound=Predicted)
# A video id -> where the input holds it ("FILE (record at byte N)", each place), for error messages.
Locator = Callable[[str], list[str]]
# What a CSV field written unquoted cannot hold (`yt8m score` and Kaggle split lines at commas and strip spaces).
_CSV_UNSAFE = {",": "a comma", '"': "a double quote", "\n": "a line break", "\r": "a line break"}
_VIDEOS_NAMED = 5


def format_csv_row(video_id: str, classes: Sequence[int], confidences: Sequence[float]) -> str:
    """One Kaggle CSV line, `id,class confidence class confidence ...`: the one place the CSV is formatted."""
    pairs = " ".join("%i %f" % pair for pair in zip(classes, confidences))
    return f"{video_id},{pairs}\n"


def format_jsonl_row(video_id: str, classes: Sequence[int], confidences: Sequence[float]) -> str:
    return json.dumps({"video_id": video_id, "class_indexes": list(classes), "predictions": list(confidences)}) + "\n"


_ROW_FORMATTERS = {"csv": format_csv_row, "jsonl": format_jsonl_row}


def format_rows(video_ids: Sequence[str], predictions: torch.Tensor, top_k: int, output_format: str = "csv") -> str:
    """One line per video of its top-k classes, confidences descending."""
    values, indices = torch.topk(predictions.float(), k=min(top_k, predictions.shape[1]), dim=1)
    format_row = _ROW_FORMATTERS[output_format]
    return "".join(format_row(video_id, classes, confidences)
                   for video_id, classes, confidences in zip(video_ids, indices.tolist(), values.tolist()))


def write_predictions(predict: Callable[[P], torch.Tensor], batches: Iterable[P], out: TextIO, top_k: int,
                      output_format: str = "csv", output_file: str = "the output",
                      locate: Optional[Locator] = None) -> int:
    """Write (for CSV, the header and) one row per video of `batches` to `out`; returns the number of videos.

    Raises ValueError before writing a batch with a prediction that is not finite, or a video id `output_file`
    cannot hold: empty, already written, or for CSV holding a comma, quote or line break or spaces at its ends.
    `locate` names where the input holds a video, for these errors.
    """
    rows = predicted_rows(predict, batches, top_k, output_format, output_file, locate)
    return write_rows(rows, out, output_format, output_file, locate)


# Each batch's video ids and their rows as text.
Rows = tuple[list[str], str]


def predicted_rows(predict: Callable[[P], torch.Tensor], batches: Iterable[P], top_k: int, output_format: str,
                   output_file: str,
                   locate: Optional[Locator] = None) -> Iterator[Rows]:
    """Each batch's video ids and rows, checked (see write_predictions) but for duplicates: write_rows finds those."""
    videos, started = 0, time.perf_counter()
    for batch in batches:
        video_ids, predictions = list(batch.video_ids), predict(batch)
        check_video_ids(video_ids, output_format, output_file, locate)
        check_finite(predictions, video_ids, output_file, locate)
        yield video_ids, format_rows(video_ids, predictions, top_k, output_format)
        videos += len(video_ids)
        log.info("predicted %d videos, %.0f videos/s", videos, videos / max(time.perf_counter() - started, 1e-9))


def write_rows(rows: Iterable[Rows], out: TextIO, output_format: str, output_file: str,
               locate: Optional[Locator] = None) -> int:
    """(For CSV, the header and) the rows, each video once: a duplicate id is a ValueError naming both lines."""
    first_line = 1
    if output_format == "csv":
        out.write(CSV_HEADER)
        first_line = 2
    videos = 0
    with TemporaryDatabase() as database:
        written = KeyedTable(database, "videos")
        for video_ids, text in rows:
            duplicate = written.add_many(video_ids, first_line + videos)
            if duplicate is not None:
                raise ValueError(_duplicate_message(duplicate, output_file, locate))
            out.write(text)
            videos += len(video_ids)
    return videos


def _where(video_id: str, locate: Optional[Locator]) -> str:
    places = locate(video_id) if locate is not None else []
    return f" (in {' and '.join(places)})" if places else ""


def unwritable_id(video_id: str, output_format: str) -> Optional[str]:
    """Why a predictions file of this format cannot hold the id, or None when it can."""
    if not video_id:
        return "an empty id names no video"
    if output_format == "csv":
        for char, what in _CSV_UNSAFE.items():
            if char in video_id:
                return f"a CSV field cannot hold {what}"
        if video_id != video_id.strip():
            return "a CSV field loses the spaces at its ends when read"
    return None


def check_video_ids(video_ids: Sequence[str], output_format: str, output_file: str,
                    locate: Optional[Locator] = None) -> None:
    """ValueError for the first id that `output_file` cannot hold (see unwritable_id)."""
    for video_id in video_ids:
        problem = unwritable_id(video_id, output_format)
        if problem is not None:
            raise ValueError(f"{output_file}: cannot write video id {video_id!r}{_where(video_id, locate)}: {problem}")


def check_finite(predictions: torch.Tensor, video_ids: Sequence[str], output_file: str,
                 locate: Optional[Locator] = None) -> None:
    """ValueError naming the first videos whose predictions hold NaN or infinity."""
    bad = torch.nonzero(~torch.isfinite(predictions).all(dim=1)).flatten().tolist()
    if not bad:
        return
    named = ", ".join(repr(video_ids[row]) for row in bad[:_VIDEOS_NAMED])
    more = f" and {len(bad) - _VIDEOS_NAMED} more in the same batch" if len(bad) > _VIDEOS_NAMED else ""
    raise ValueError(f"the model's predictions are not finite (NaN or infinity) for "
                     f"{'videos' if len(bad) > 1 else 'video'} {named}{more}{_where(video_ids[bad[0]], locate)}: "
                     f"{output_file} is not written")


def _duplicate_message(duplicate: Duplicate, output_file: str, locate: Optional[Locator]) -> str:
    return (f"{output_file}: video {duplicate.key!r} would be written twice, on lines {duplicate.first_line} and "
            f"{duplicate.line}{_where(duplicate.key, locate)}: each video must appear once")


def checkpoint_predictor(model: nn.Module, device: torch.device) -> Predictor:
    model.eval()

    @torch.no_grad()
    def predict(batch: Batch) -> torch.Tensor:
        return forward(model, batch.to(device))["predictions"].cpu()

    return predict


def onnx_predictor(exported: Any) -> Predictor:
    """Predictions of an `ExportedModel` (onnxruntime) on the dataset's batches."""
    def predict(batch: Batch) -> torch.Tensor:
        num_frames = batch.num_frames
        return torch.from_numpy(exported.predict(batch.features.numpy(),
                                                 None if num_frames is None else num_frames.numpy()))

    return predict


def load_predictor(source: ModelSourceConfig, device: str) -> tuple[Predictor, FeatureSpec, dict[str, Any]]:
    """The predictor for --model (ONNX) or --train_dir (latest checkpoint), the FeatureSpec its inputs
    are read with, and what the summary reports about the model."""
    return load_model_predictor(source.train_dir, source.model, device, source.task)


def load_model_predictor(train_dir: str, model: str, device_name: str, task: str = ""
                         ) -> tuple[Predictor, FeatureSpec, dict[str, Any]]:
    """`load_predictor` for an ONNX export `model` (when given) or the latest checkpoint of `train_dir` (of a
    multi-task one, the head of `task`, default the first)."""
    if model:
        exported = load_exported(model, device_name)
        meta = exported.metadata
        return onnx_predictor(exported), exported.feature_spec(), {
            "model_file": exported.model_file, "global_step": meta.get("global_step"),
            "providers": exported.session.get_providers()}
    found = load_latest_checkpoint(train_dir)  # past unreadable ones, with a warning
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {train_dir}/checkpoints: train a model there first")
    device = training_device(device_name)  # under torchrun: cuda:LOCAL_RANK
    path, checkpoint = found
    trained = build_model_from_payload(checkpoint, path, device, task)
    return (checkpoint_predictor(trained.network, device), trained.features,
            {"checkpoint": path, "global_step": trained.step})


def read_jsonl_predictions(path: str) -> Iterator[tuple[str, list[int], list[float]]]:
    """(video id, class indexes, confidences) of each line of a `--output_format jsonl` file, checked (a video twice
    too, against a temporary SQLite file of the ids: memory does not grow with the file)."""
    for _, video_id, classes, confidences in numbered_jsonl_predictions(path):
        yield video_id, classes, confidences


def numbered_jsonl_predictions(path: str) -> Iterator[tuple[int, str, list[int], list[float]]]:
    """read_jsonl_predictions with each record's line number first."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"predictions file not found: {path}")
    with TemporaryDatabase() as database:
        yield from add_unique(KeyedTable(database, "videos"), _jsonl_records(path),
                              lambda record: (record[1], record[0]),
                              lambda duplicate: ValueError(f"{path}:{duplicate.line}: video {duplicate.key!r} is "
                                                           f"already on line {duplicate.first_line}"))


def _jsonl_records(path: str) -> Iterator[tuple[int, str, list[int], list[float]]]:
    """(line number, video id, class indexes, confidences) of each non-blank line."""
    for number, line in text_lines(path):  # bytes that are not UTF-8: an error naming the line
        if line.strip():
            yield number, *_parse_jsonl_record(f"{path}:{number}", line)


def _parse_jsonl_record(where: str, line: str) -> tuple[str, list[int], list[float]]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object ({err})") from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise ValueError(f"{where}: not a JSON object (nested too deeply)") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field in ("video_id", "class_indexes", "predictions"):
        if field not in record:
            raise ValueError(f"{where}: field '{field}' is missing")
    video_id, classes, confidences = record["video_id"], record["class_indexes"], record["predictions"]
    if not isinstance(video_id, str) or not video_id:
        raise ValueError(f"{where}: field 'video_id' must be a non-empty string, got {quoted(video_id)}")
    problem = unwritable_id(video_id, "csv")
    if problem is not None:
        raise ValueError(f"{where}: field 'video_id' {quoted(video_id)} cannot be written to the CSV: {problem}")
    if not isinstance(classes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                for c in classes):
        raise ValueError(f"{where}: field 'class_indexes' must be a list of non-negative integers, got "
                         f"{quoted(classes)}")
    if not isinstance(confidences, list) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                                    and math.isfinite(p) for p in confidences):
        raise ValueError(f"{where}: field 'predictions' must be a list of finite numbers, got {quoted(confidences)}")
    if len(classes) != len(confidences):
        raise ValueError(f"{where}: fields 'class_indexes' ({len(classes)}) and 'predictions' "
                         f"({len(confidences)}) must have the same length")
    return video_id, classes, confidences


def convert_predictions(input_file: str, output_file: str, top_k: int = 20) -> int:
    """The Kaggle CSV of a JSON-lines predictions file: each video's `top_k` most confident classes
    (a stable sort, so equal confidences keep the file's order); returns the number of videos."""
    if top_k < 1:
        raise ValueError(f"--top_k must be at least 1, got {top_k}")

    def write(out: TextIO) -> int:
        out.write(CSV_HEADER)
        videos = 0
        for video_id, classes, confidences in read_jsonl_predictions(input_file):
            ranked = sorted(zip(classes, confidences), key=lambda pair: -pair[1])[:top_k]
            out.write(format_csv_row(video_id, [c for c, _ in ranked], [p for _, p in ranked]))
            videos += 1
        return videos

    return write_file_atomically(output_file, write)
