"""Building long prompts must not block Ctrl-C: a real process gets SIGINT while it builds, and stops."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# 40 conversations of 1M tokens: several seconds per conversation of pure CPU with the simulator's
# local tokenizer, whose async methods never suspend.
BUILD = """
import signal
import sys
# Ctrl-C as a terminal delivers it: a test runner started in the background (``cmd &`` in a script)
# has SIGINT ignored, which every child inherits, and Python then never installs its handler
signal.signal(signal.SIGINT, signal.default_int_handler)
from harness.runs.interrupt import Interrupted, run_interruptible
from harness.sim.tokenizer import SimTokenizer
from workloads.config import MultiRoundQAProbe
from workloads.multi_round_qa import build_conversations

workload = MultiRoundQAProbe(kind="multi_round_qa", context_tokens=[1_000_000], conversations=40)
print("building", flush=True)
try:
    run_interruptible(lambda: build_conversations(
        workload, SimTokenizer(), seed=1, repetition=0, context_tokens=1_000_000))
except Interrupted:
    print("interrupted", flush=True)
    sys.exit(3)
print("finished", flush=True)
"""


def test_sigint_while_building_prompts_stops_within_seconds() -> None:
    process = subprocess.Popen([sys.executable, "-c", BUILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "building"
        time.sleep(1.0)  # well inside the first conversation's document
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
        waited = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 3, process.stdout.read() if process.stdout else code
    assert waited < 5.0, f"Ctrl-C took {waited:.1f} s to stop the build"
