"""manifest.json: what ran, where, with which versions — enough to reproduce or to refuse a comparison.

Written when a run starts and rewritten (atomically) as engines start and attempts end. Command
lines and environment values are redacted before they get here.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.engines.base import EngineFacts
from harness.scenario.spec import Scenario
from kvbench import __version__
from kvbench.redact import redact_argv

MANIFEST_VERSION = 1


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _run_quiet(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_sha(start: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    return _run_quiet(["git", "rev-parse", "HEAD"], cwd=start if start.is_dir() else start.parent)


def gpu_facts() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def host_facts() -> dict[str, Any]:
    memory_bytes = None
    if hasattr(os, "sysconf"):
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            memory_bytes = None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory_bytes,
        "gpus": gpu_facts(),
    }


class Manifest:
    """In-memory manifest, saved after every change."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def start(cls, path: Path, scenario: Scenario, source: Path | None, attempt: int) -> Manifest:
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            data = {
                "manifest_version": MANIFEST_VERSION,
                "run_id": path.parent.name,
                "scenario_name": scenario.name,
                "scenario_source": str(source) if source else None,
                "scenario": scenario.model_dump(mode="json"),
                "kvbench_version": __version__,
                "kvbench_git_sha": git_sha(Path(__file__).resolve().parent),
                "command": redact_argv(sys.argv),
                "engines": {},
                "attempts": [],
            }
        data["host"] = host_facts()
        data["attempts"].append(
            {"attempt": attempt, "started_at": now_iso(), "ended_at": None, "status": "running"}
        )
        manifest = cls(path, data)
        manifest.save()
        return manifest

    def record_engine(self, arm: str, facts: EngineFacts) -> None:
        self.data["engines"][arm] = {
            "kind": facts.kind,
            "version": facts.version,
            "command": list(facts.command),
            "details": dict(facts.details),
        }
        self.save()

    def finish(self, status: str, reason: str | None = None) -> None:
        """End the attempt: ``completed``, ``failed``, ``inconclusive`` or ``interrupted``, and why."""
        update: dict[str, Any] = {"ended_at": now_iso(), "status": status}
        if reason:
            update["reason"] = reason
        self.data["attempts"][-1].update(update)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
