"""One writer per run directory: a second attempt on a directory another process is writing is refused.

The holder is a real second process (a python that takes the lock and waits), as a second
``kvbench run --resume`` would be; the lock is the kernel's, so the holder's death frees it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import RunDirError
from harness.runs.kinds import launch
from harness.store.lock import LOCK_FILE, run_dir_lock
from harness.store.rundir import RunDir
from tests.resultfiles import make_probe_run
from tests.support import REPO

HOLD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from harness.store.lock import run_dir_lock
with run_dir_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def hold_lock(run_dir: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), str(REPO)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_resume_of_a_directory_another_process_writes_is_refused_naming_it(tmp_path: Path) -> None:
    run_dir = make_probe_run(tmp_path)
    holder = hold_lock(run_dir)
    try:
        with pytest.raises(RunDirError) as refused:
            launch("probe", None, source=None, resume=run_dir)
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "another kvbench is writing" in message
        assert "\n" not in message
        assert RunDir.open(run_dir).next_attempt() == 1  # nothing was started: no attempt recorded
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    holder = hold_lock(tmp_path)
    holder.kill()  # SIGKILL: no cleanup runs
    holder.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            with run_dir_lock(tmp_path):
                break
        except RunDirError:
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.05)
    assert (tmp_path / LOCK_FILE).stat().st_mode & 0o077 == 0
