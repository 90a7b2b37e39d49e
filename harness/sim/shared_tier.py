"""The simulator's shared tier across processes: a chunk index kept in one directory.

Each simulator replica of a fleet is its own process. Its ``shared`` tier keeps its chunk index --
chunk key -> the ``time.monotonic()`` at which the chunk's write finishes -- as one small file per
chunk in a directory every replica of the arm uses (:mod:`harness.sim.fleet` creates it). What one
replica stores, every other finds once the write time has passed; ``time.monotonic()`` is the
host's one ``CLOCK_MONOTONIC``, so the times compare across processes. Bandwidth, latency and
capacity stay those of the profile's ``shared`` tier; each replica queues its own reads and writes
(the network link of its host), while capacity is enforced over the directory, least recently
used first (file modification times), by whichever replica writes.

:class:`DirectoryChunks` is the ``OrderedDict`` the tier keeps its chunks in, with the operations
:class:`~harness.sim.kvcache.TierState` uses, backed by the directory. Files are written to a
temporary name and renamed, so a reader never sees half a value.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from pathlib import Path

_MASK = (1 << 64) - 1
_RECOUNT_EVERY = 64
"""Writes between two directory listings for the size (other replicas write too)."""


class DirectoryChunks(OrderedDict[int, float]):
    """Chunk key -> write-finished time, one file per key in ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._count = self._recount()
        self._writes = 0

    def _path(self, key: int) -> Path:
        return self.root / f"{key & _MASK:016x}"

    def _recount(self) -> int:
        return sum(1 for entry in os.scandir(self.root) if not entry.name.startswith("."))

    def get(self, key: int, default: float | None = None) -> float | None:  # type: ignore[override]
        try:
            return float(self._path(key).read_text(encoding="ascii"))
        except (FileNotFoundError, ValueError):
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self._path(key).exists()

    def __getitem__(self, key: int) -> float:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: int, value: float) -> None:
        path = self._path(key)
        temporary = self.root / f".{path.name}.{os.getpid()}"
        temporary.write_text(repr(value), encoding="ascii")
        existed = path.exists()
        os.replace(temporary, path)
        if not existed:
            self._count += 1
        self._writes += 1
        if self._writes % _RECOUNT_EVERY == 0:
            self._count = self._recount()

    def move_to_end(self, key: int, last: bool = True) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(key))

    def __len__(self) -> int:
        return self._count

    def popitem(self, last: bool = True) -> tuple[int, float]:
        entries = [entry for entry in os.scandir(self.root) if not entry.name.startswith(".")]
        if not entries:
            self._count = 0
            raise KeyError("popitem(): the shared tier is empty")
        chosen = (max if last else min)(entries, key=lambda entry: entry.stat().st_mtime_ns)
        key = int(chosen.name, 16)
        value = self.get(key) or 0.0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(chosen.path)
        self._count = len(entries) - 1
        return key, value

    def clear(self) -> None:
        for entry in os.scandir(self.root):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        self._count = 0
