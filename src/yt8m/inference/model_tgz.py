"""The starter kit's model archives (its inference.py's --output_model_tgz and --input_model_tgz): the model `yt8m
predict` uses packed as a gzip tar, and such an archive unpacked into a folder that predict reads.

A checkpoint travels as a small train dir (checkpoints/ckpt-N.pt, config.yaml, model_size.json); an ONNX export as
its graph, external weights and metadata, under their own names (the graph names its weights file).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile

from yt8m.inference.onnx_export import METADATA_FILE, artifact_paths
from yt8m.io import storage
from yt8m.io.checkpoints import RUN_FILES
from yt8m.io.files import atomic_writer


def archive_members(checkpoint: str, onnx_export: str) -> list[tuple[str, str]]:
    """(path, name in the archive) of the files of a checkpoint's model, or of an ONNX export (`--model`)."""
    if onnx_export:
        model_file, metadata = artifact_paths(onnx_export)
        files = [model_file, f"{model_file}.data", metadata]
        return [(path, posixpath.basename(path)) for path in files if storage.exists(path)]
    train_dir = posixpath.dirname(posixpath.dirname(checkpoint))
    extras = [(posixpath.join(train_dir, name), name) for name in RUN_FILES]
    return [(checkpoint, f"checkpoints/{posixpath.basename(checkpoint)}")] + [
        (path, name) for path, name in extras if storage.exists(path)]


def pack_model(tgz_path: str, checkpoint: str, onnx_export: str) -> list[str]:
    """Write a checkpoint's model (or an ONNX export) into a gzip tar at `tgz_path`, which appears only whole;
    returns the names of its files there."""
    members = archive_members(checkpoint, onnx_export)
    with atomic_writer(tgz_path, binary=True) as out, tarfile.open(fileobj=out, mode="w|gz") as tar:
        for path, name in members:
            _add(tar, path, name)
    return [name for _, name in members]


def _add(tar: tarfile.TarFile, path: str, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = storage.size(path), 0o644
    with storage.open_file(path, "rb") as fh:
        tar.addfile(info, fh)


def unpack_model(tgz_path: str, folder: str) -> dict[str, str]:
    """Extract an archive of `pack_model` (or any gzip tar of a train dir or an ONNX export) into `folder`; returns
    the predict flag that reads it: {"train_dir": folder} or {"model": ...}.

    Only plain files with relative names inside `folder` are taken. A folder holding files the archive does not (an
    earlier model) is refused: a checkpoint of a higher step left there would be the one predict loads."""
    try:
        with storage.open_file(tgz_path, "rb") as raw, tarfile.open(fileobj=raw, mode="r:*") as tar:
            names = _extract(tar, tgz_path, folder)
    except (tarfile.TarError, EOFError) as err:
        raise ValueError(f"--input_model_tgz {tgz_path} is not a readable tar archive ({err})") from err
    if any(name.endswith(".onnx") for name in names):
        graph = next(name for name in sorted(names) if name.endswith(".onnx"))
        return {"model": folder if METADATA_FILE in names else os.path.join(folder, graph)}
    if not any(name.startswith("checkpoints/") for name in names):
        raise ValueError(f"--input_model_tgz {tgz_path} holds neither a checkpoint (checkpoints/ckpt-N.pt) nor an "
                         f"ONNX export (model.onnx, metadata.json): {', '.join(sorted(names)) or 'no files'}")
    return {"train_dir": folder}


def _extract(tar: tarfile.TarFile, tgz_path: str, folder: str) -> set[str]:
    members = {posixpath.normpath(member.name): member for member in tar.getmembers() if member.isfile()}
    outside = sorted(name for name in members if name.startswith(("/", "..")))
    if outside:
        raise ValueError(f"--input_model_tgz {tgz_path} holds paths outside its folder: {', '.join(outside)}")
    _check_folder(folder, set(members))
    for name, member in members.items():
        target = os.path.join(folder, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        source = tar.extractfile(member)
        if source is None:  # only plain files are taken: each has its data
            raise ValueError(f"--input_model_tgz {tgz_path}: {name} holds no data")
        with source, open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    return set(members)


def _check_folder(folder: str, names: set[str]) -> None:
    if not os.path.isdir(folder):
        return
    present = {os.path.relpath(os.path.join(root, name), folder) for root, _, files in os.walk(folder)
               for name in files}
    others = sorted(present - names)
    if others:
        raise ValueError(f"--untar_model_dir {folder} holds files the archive does not ({', '.join(others[:5])}"
                         f"{', ...' if len(others) > 5 else ''}): give an empty or new folder, so that no other "
                         f"model is read")
