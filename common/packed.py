"""A stored file and its packed form: ``NAME`` or ``NAME.xz`` (xz, any preset), read as one.

A run kept in a repository stores its large files compressed (:func:`harness.store.jsonl.pack`), so every reader
asks for the plain name and takes the packed file where the plain one is absent (:func:`stored_file`,
:func:`read_stored_bytes`). The ground floor holds this because result files (:class:`common.schema.VersionedFile`)
are read, and a stale packed twin removed when one is written again, here too.
"""

from __future__ import annotations

import lzma
from pathlib import Path

from .errors import RunDirError

PACKED_SUFFIX = ".xz"


def packed_file(path: Path) -> Path:
    """Where ``path`` is kept compressed."""
    return path.with_name(path.name + PACKED_SUFFIX)


def stored_file(path: Path) -> Path | None:
    """The file holding ``path``'s content: ``path`` itself, else its packed form; None when neither exists."""
    if path.exists():
        return path
    packed = packed_file(path)
    return packed if packed.exists() else None


def read_stored_bytes(path: Path) -> bytes | None:
    """``path``'s content, from the plain file or its packed form (None when neither exists)."""
    found = stored_file(path)
    if found is None:
        return None
    data = found.read_bytes()
    if found == path:
        return data
    try:
        return lzma.decompress(data)
    except lzma.LZMAError as error:
        raise RunDirError(f"{found}: not a readable xz file: {error}") from None
