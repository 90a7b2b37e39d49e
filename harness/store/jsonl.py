"""Append-only JSON Lines: the one reader, the one repair and the one appender every stored event file uses.

A writer killed mid-line (Ctrl-C, SIGKILL, a full disk) leaves a *torn* last line: no trailing
newline and not valid JSON. Readers skip exactly that line -- everything before it is intact --
and refuse any other bad line with its file and line number, so damage is never silently dropped.

Before anything is appended to such a file, :func:`repair_torn_tail` cuts the torn bytes off (so
a new record never glues onto them and turns two lines into one bad line) and keeps them in a side
file ``<name>.torn`` beside it, saying so in the log. :func:`append_jsonl` and
:class:`harness.store.records.RecordWriter` both go through it.

A run kept in a repository stores its large files compressed (:func:`pack`: ``records.jsonl`` becomes
``records.jsonl.xz``, xz at preset 9e, which holds no timestamp, so packing the same bytes gives the same file).
Every reader takes the packed file where the plain one is absent (:func:`common.packed.stored_file`, re-exported
here), so a kept run reads as it was written; appending to a packed file unpacks it first
(:func:`repair_torn_tail`), so a live run always appends to plain JSON Lines.
"""

from __future__ import annotations

import json
import logging
import lzma
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from common.errors import RunDirError
from common.packed import PACKED_SUFFIX as PACKED_SUFFIX
from common.packed import packed_file as packed_file
from common.packed import read_stored_bytes as read_stored_bytes
from common.packed import stored_file as stored_file
from common.schema import first_problem

ModelT = TypeVar("ModelT", bound=BaseModel)

log = logging.getLogger(__name__)

_TAIL_BLOCK = 64 * 1024
_PACK_PRESET = 9 | lzma.PRESET_EXTREME


def pack(path: Path) -> Path:
    """Replace ``path`` by its compressed form (for keeping a finished run); the packed file's path.

    The packed file is written and fsynced beside the plain one before the plain one goes, so a crash in
    between leaves both (readers take the plain one)."""
    target = packed_file(path)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(lzma.compress(path.read_bytes(), preset=_PACK_PRESET))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(target)
    path.unlink()
    return target


def _unpack(path: Path) -> None:
    """Turn a packed ``path`` back into plain JSON Lines before anything is appended to it."""
    packed = packed_file(path)
    if path.exists() or not packed.exists():
        return
    data = read_stored_bytes(path) or b""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    packed.unlink()
    log.warning("%s: unpacked from %s to append to it", path, packed.name)


def torn_file(path: Path) -> Path:
    """Where :func:`repair_torn_tail` keeps the bytes it cut from ``path``."""
    return path.with_name(path.name + ".torn")


def repair_torn_tail(path: Path) -> int:
    """Cut an unterminated last line off ``path``; return how many bytes were cut (0: nothing to do).

    The cut bytes are appended (with a newline) to :func:`torn_file` and fsynced *before* the
    truncation, so a crash in between loses nothing. A packed file (a kept run) is unpacked first.
    """
    _unpack(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with path.open("rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        end = size
        keep = 0
        while end > 0:  # find the last newline, reading backwards block by block
            start = max(0, end - _TAIL_BLOCK)
            handle.seek(start)
            block = handle.read(end - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        handle.seek(keep)
        torn = handle.read()
        side = torn_file(path)
        with side.open("ab") as out:
            out.write(torn + b"\n")
            out.flush()
            os.fsync(out.fileno())
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    log.warning("%s: cut a torn last line of %d bytes (kept in %s) before appending", path, len(torn), side)
    return len(torn)


def append_jsonl(path: Path, payload: dict[str, object] | BaseModel) -> None:
    """Append one JSON object as a line and fsync (for small, rare events: a group, a point, an interval)."""
    line = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload, sort_keys=True)
    repair_torn_tail(path)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def iter_jsonl(path: Path, model: type[ModelT]) -> Iterator[ModelT]:
    """Yield each line of ``path`` as ``model``; a torn last line is skipped, any other bad line is an error.

    Lines are split as bytes and decoded one by one, so a line torn inside a multi-byte character
    is still just a torn line.
    """
    try:
        data = read_stored_bytes(path)
    except OSError as error:
        raise RunDirError(f"{path}: cannot read: {error.strerror}") from None
    if data is None:
        return
    lines = data.splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield model.model_validate_json(line)
        except ValidationError as error:  # bad JSON too: one line naming the field, never pydantic's report
            if number == len(lines) and not line.endswith(b"\n"):
                return  # the writer died mid-line; everything before it is intact
            raise RunDirError(
                f"{path}:{number}: not a valid {model.__name__}: {first_problem(error, whole='(the line)')}"
            ) from None


def read_jsonl(path: Path, model: type[ModelT]) -> list[ModelT]:
    return list(iter_jsonl(path, model))
