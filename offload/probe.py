"""Storage tier probe: sequential write and read bandwidth of a directory.

``probe_path`` writes a temporary file into the directory in ``block_bytes`` chunks, fsyncs it,
reads it back, and repeats for several passes; the result holds the median of each direction.
The numbers are meant to be pasted into an offload profile (:meth:`ProbeResult.to_tier`).

Method:

* **Mode.** With ``O_DIRECT`` (Linux, block a multiple of 4096 bytes, and the filesystem accepts
  it) the page cache is bypassed in both directions and buffers are ``mmap``-allocated, so they
  are page aligned. Otherwise the probe uses buffered I/O and evicts the file's (clean, fsynced)
  pages with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before reading, so the read still comes from
  the device. ``ProbeResult.mode`` says which was used and ``ProbeResult.note`` why.
* **Timing.** ``time.perf_counter_ns``; a write pass spans the first ``write`` to the end of
  ``fsync``; a read pass spans the first to the last ``read``. Opening the file and evicting the
  cache are outside the timed span. Bandwidth is bytes per nanosecond, which is GB/s (1e9 B/s),
  the unit of :class:`~offload.profiles.OffloadTier`.
* **Passes.** Each pass rewrites the same file (truncated at open) and reads it back; the
  result reports every sample and the median.
* **Cleanup.** The file is removed in a ``finally`` block, so also on ``KeyboardInterrupt`` (the CLI
  turns SIGTERM into one while probing).
* **Data.** One random (incompressible) block, written repeatedly; a deduplicating store could
  still shrink it.

One thread, one request in flight: fast NVMe drives and network storage often need several
requests in flight to reach their datasheet figures, so engines doing parallel I/O may see more.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field

from common.errors import KvbenchError
from common.schema import StrictModel

from .profiles import OffloadTier, TierKind

ProbeMode = Literal["direct", "buffered"]

ALIGNMENT = 4096
"""Buffer, offset and size alignment used for ``O_DIRECT`` (covers 512 B and 4 KiB sectors)."""

_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_FADV_DONTNEED: int | None = getattr(os, "POSIX_FADV_DONTNEED", None)
_PROBE_PREFIX = ".kvbench-probe-"

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class ProbeError(KvbenchError):
    """The directory cannot be probed (missing, not a directory, not writable, too little space)."""


def parse_size(text: str) -> int:
    """Parse a byte size such as ``4MiB``, ``1GiB``, ``512k`` or ``2GB``.

    Binary suffixes (``KiB``, ``MiB``, ``GiB``, ``TiB`` and the bare ``K``, ``M``, ``G``, ``T``)
    are powers of 1024; ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000. Case is ignored.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: expected a number and an optional unit, e.g. 4MiB or 1GB")
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1 or value != int(value):
        raise ValueError(f"invalid size {text!r}: must be a whole number of bytes >= 1")
    return int(value)


def format_size(n_bytes: int) -> str:
    """Render a byte count with the largest binary unit that divides it (``4 MiB``), else bytes."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= factor and n_bytes % factor == 0:
            return f"{n_bytes // factor} {unit}"
    return f"{n_bytes} B"


class ProbeResult(StrictModel):
    """Measured sequential bandwidth of one directory (GB/s = 1e9 bytes/s)."""

    path: str = Field(description="Directory that was probed (absolute).")
    mode: ProbeMode = Field(description="'direct' (O_DIRECT, page cache bypassed) or 'buffered'.")
    note: str | None = Field(default=None, description="Why the probe fell back to buffered I/O.")
    size: int = Field(gt=0, description="Bytes written and read per pass.")
    block: int = Field(gt=0, description="Bytes per write/read call.")
    passes: int = Field(ge=1)
    write_gbps: float = Field(gt=0, description="Median write bandwidth over the passes, fsync included.")
    read_gbps: float = Field(gt=0, description="Median read bandwidth over the passes.")
    # strict=False: a stored list is a tuple here (StrictModel is strict about numbers, not sequences)
    write_samples_gbps: tuple[float, ...] = Field(strict=False, description="Write bandwidth of each pass.")
    read_samples_gbps: tuple[float, ...] = Field(strict=False, description="Read bandwidth of each pass.")

    def to_tier(
        self,
        kind: TierKind,
        capacity_gb: float,
        *,
        path: str | None = None,
        latency_us: float | None = None,
    ) -> OffloadTier:
        """An offload tier carrying the measured bandwidths, rounded to 3 significant digits.

        ``path`` defaults to the probed directory for ``disk`` and ``shared`` tiers and to none
        for ``cpu`` (host memory has no backing directory).
        """
        if path is None and kind != "cpu":
            path = self.path
        return OffloadTier(
            kind=kind,
            capacity_gb=capacity_gb,
            path=path,
            read_gbps=_round_sig(self.read_gbps),
            write_gbps=_round_sig(self.write_gbps),
            latency_us=latency_us,
        )


def _round_sig(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


def free_bytes(path: Path) -> int:
    """Bytes available to an unprivileged user on the filesystem holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def probe_path(
    path: Path,
    size_bytes: int,
    block_bytes: int,
    direct: bool | None = None,
    *,
    passes: int = 3,
    on_progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Measure sequential write-then-read bandwidth of the directory ``path``.

    ``size_bytes`` is rounded down to a whole number of ``block_bytes`` blocks. ``direct``:
    ``True`` requires ``O_DIRECT`` (error if unavailable), ``False`` forces buffered I/O,
    ``None`` uses ``O_DIRECT`` where it works and falls back to buffered I/O otherwise.
    ``on_progress`` receives a short line before each phase (for a CLI spinner).

    Raises :class:`ProbeError` naming the path if it is missing, not a directory, not writable
    or lacks ``size_bytes`` of free space, and ``ValueError`` for invalid sizes.
    """
    if block_bytes <= 0:
        raise ValueError(f"block size must be positive, got {block_bytes}")
    if size_bytes < block_bytes:
        raise ValueError(f"size ({size_bytes} B) must be at least one block ({block_bytes} B)")
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    aligned = block_bytes % ALIGNMENT == 0
    if direct is True and not aligned:
        raise ValueError(f"O_DIRECT needs a block size that is a multiple of {ALIGNMENT} B, not {block_bytes}")
    blocks = size_bytes // block_bytes
    total = blocks * block_bytes

    directory = _check_directory(path, total)
    report = on_progress or (lambda _line: None)

    note: str | None = None
    mode: ProbeMode
    if direct is False:
        mode, note = "buffered", "buffered I/O requested"
    elif not _O_DIRECT:
        mode, note = "buffered", "O_DIRECT is not available on this platform"
    elif not aligned:
        mode, note = "buffered", f"block size is not a multiple of {ALIGNMENT} B"
    else:
        reason = _direct_unsupported_reason(directory, block_bytes)
        if reason is None:
            mode = "direct"
        elif direct is True:
            raise ProbeError(f"cannot probe {directory} with O_DIRECT: {reason}")
        else:
            mode, note = "buffered", f"O_DIRECT not usable here ({reason})"
    if mode == "buffered" and _FADV_DONTNEED is None:
        note = f"{note}; posix_fadvise is unavailable, so reads may be served from the page cache"

    flags = _O_DIRECT if mode == "direct" else 0
    target = directory / f"{_PROBE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    write_samples: list[float] = []
    read_samples: list[float] = []
    with _aligned_buffer(block_bytes) as wbuf, _aligned_buffer(block_bytes) as rbuf:
        # Random content, so a compressing filesystem or device cannot shrink what is written.
        wbuf[:] = os.urandom(block_bytes)
        try:
            for i in range(passes):
                report(f"pass {i + 1}/{passes}: writing {format_size(total)} to {directory}")
                write_samples.append(total / _timed_write(target, wbuf, blocks, flags))
                report(f"pass {i + 1}/{passes}: reading {format_size(total)} from {directory}")
                read_samples.append(total / _timed_read(target, rbuf, total, flags, mode == "buffered"))
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ProbeError(f"{directory} ran out of space during the probe") from exc
            raise ProbeError(f"probe of {directory} failed: {exc}") from exc
        finally:
            _remove(target)

    return ProbeResult(
        path=str(directory),
        mode=mode,
        note=note,
        size=total,
        block=block_bytes,
        passes=passes,
        write_gbps=statistics.median(write_samples),
        read_gbps=statistics.median(read_samples),
        write_samples_gbps=tuple(write_samples),
        read_samples_gbps=tuple(read_samples),
    )


def _check_directory(path: Path, needed_bytes: int) -> Path:
    directory = Path(path).expanduser().absolute()
    if not directory.exists():
        raise ProbeError(f"cannot probe {directory}: no such directory")
    if not directory.is_dir():
        raise ProbeError(f"cannot probe {directory}: not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ProbeError(f"cannot probe {directory}: directory is not writable")
    available = free_bytes(directory)
    if available < needed_bytes:
        raise ProbeError(
            f"cannot probe {directory}: needs {format_size(needed_bytes)} free, "
            f"has {available / 1e9:.2f} GB; use a smaller --size"
        )
    return directory


def _aligned_buffer(n_bytes: int) -> mmap.mmap:
    """Anonymous mapping: page aligned, as O_DIRECT requires."""
    return mmap.mmap(-1, n_bytes)


def _direct_unsupported_reason(directory: Path, block_bytes: int) -> str | None:
    """Try one O_DIRECT write and read of one block; None if both work, else why not."""
    trial = directory / f"{_PROBE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.direct"
    try:
        with _aligned_buffer(block_bytes) as buf:
            fd = _open(trial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, directory)
            try:
                _write_all(fd, buf)
            finally:
                os.close(fd)
            fd = _open(trial, os.O_RDONLY | _O_DIRECT, directory)
            try:
                os.readv(fd, [buf])
            finally:
                os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return os.strerror(exc.errno)
        raise ProbeError(f"probe of {directory} failed: {exc}") from exc
    finally:
        _remove(trial)
    return None


def _open(target: Path, flags: int, directory: Path) -> int:
    try:
        return os.open(target, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    except PermissionError as exc:
        raise ProbeError(f"cannot write a probe file in {directory}: {exc.strerror}") from exc


def _write_all(fd: int, buf: mmap.mmap) -> None:
    written = os.write(fd, buf)
    if written == len(buf):
        return
    view = memoryview(buf)
    try:
        while written < len(buf):
            n = os.write(fd, view[written:])
            if n <= 0:
                raise OSError(errno.EIO, "write returned 0 bytes")
            written += n
    finally:
        view.release()


def _timed_write(target: Path, buf: mmap.mmap, blocks: int, flags: int) -> int:
    """Write ``blocks`` copies of ``buf`` and fsync; elapsed nanoseconds (at least 1)."""
    fd = _open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, target.parent)
    try:
        start = time.perf_counter_ns()
        for _ in range(blocks):
            _write_all(fd, buf)
        os.fsync(fd)
        return max(time.perf_counter_ns() - start, 1)
    finally:
        os.close(fd)


def _timed_read(target: Path, buf: mmap.mmap, total: int, flags: int, evict: bool) -> int:
    """Read the whole file into ``buf`` block by block; elapsed nanoseconds (at least 1)."""
    fd = _open(target, os.O_RDONLY | flags, target.parent)
    try:
        if evict and _FADV_DONTNEED is not None:
            os.posix_fadvise(fd, 0, 0, _FADV_DONTNEED)
        done = 0
        start = time.perf_counter_ns()
        while done < total:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            done += n
        elapsed = max(time.perf_counter_ns() - start, 1)
    finally:
        os.close(fd)
    if done != total:
        raise OSError(errno.EIO, f"short read from {target}: {done} of {total} bytes")
    return elapsed


def _remove(target: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
