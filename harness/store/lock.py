"""One writer per run directory: an attempt holds an exclusive lock on ``RUN_DIR/.attempt.lock``.

Two ``kvbench ... --resume RUN_DIR`` started together would each read what is left to measure, then both
measure it, each under the other's load, and append to the same records. The lock is ``flock(2)`` on a file
in the run directory: the kernel releases it when the holder exits, however it exits (kill -9 included), so a
stale lock never blocks a resume. The file records who holds it (pid, host, start time) for the refusal's
one-line message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from common.errors import RunDirError
from common.jsonfile import parse_json

LOCK_FILE = ".attempt.lock"


def _holder(path: Path) -> str:
    try:
        holder = parse_json(path.read_bytes())
        if not isinstance(holder, dict):
            return "holder unknown"
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder["started_unix_s"])))
        return f"pid {int(holder['pid'])} on {holder['host']}, since {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the block; RunDirError naming the holder when another process has it."""
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise RunDirError(f"{path}: cannot open the run directory's lock: {error.strerror or error}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(
                f"{run_dir}: another kvbench is writing this run directory ({_holder(path)}); "
                "let it finish or stop it, then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_unix_s": time.time()}).encode()
        )
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
