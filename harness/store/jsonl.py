"""Append-only JSON Lines: the one reader and the one appender every stored event file uses.

A writer killed mid-line (Ctrl-C, SIGKILL, a full disk) leaves a *torn* last line: no trailing
newline and not valid JSON. Readers skip exactly that line -- everything before it is intact --
and refuse any other bad line with its file and line number, so damage is never silently dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from kvbench.errors import RunDirError

ModelT = TypeVar("ModelT", bound=BaseModel)


def append_jsonl(path: Path, payload: dict[str, object] | BaseModel) -> None:
    """Append one JSON object as a line and fsync (for small, rare events: a group, a point, an interval)."""
    line = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload, sort_keys=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def iter_jsonl(path: Path, model: type[ModelT]) -> Iterator[ModelT]:
    """Yield each line of ``path`` as ``model``; a torn last line is skipped, any other bad line is an error."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        lines = handle.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield model.model_validate_json(line)
        except ValueError as error:
            if number == len(lines) and not line.endswith("\n"):
                return  # the writer died mid-line; everything before it is intact
            raise RunDirError(f"{path}:{number}: not a valid {model.__name__}: {error}") from None


def read_jsonl(path: Path, model: type[ModelT]) -> list[ModelT]:
    return list(iter_jsonl(path, model))
