"""Files and directories only their owner can read: run directories, manifests, scenarios and engine logs.

Those can hold what a scenario or an engine wrote about secrets even after redaction (an engine that
prints its own arguments into its log), so they are created 0700 (directories) and 0600 (files)
whatever the umask, and nothing is ever widened afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dir(path: Path, *, exist_ok: bool = False) -> None:
    """``mkdir -p`` whose last directory is 0700 (parents keep their usual modes)."""
    existed = path.is_dir()
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=exist_ok)
    if not existed:
        os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating the file 0600 (an existing file keeps its mode); returns the descriptor."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, created 0600, replacing what was there."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
