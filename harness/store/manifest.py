"""manifest.json: what ran, where, with which versions — enough to reproduce or to refuse a comparison.

Written when a run starts and rewritten (atomically) as engines start and attempts end. Command
lines, environment values and the scenario copy are redacted (:mod:`common.redact`) before they
get here, and the file is created 0600.

Each attempt records the host link it ran on (``attempts[i].host_link``,
:class:`harness.engines.host_link.HostLink`: pinned host <-> GPU copy rates per GPU in GB/s, or why
they were not measured) when its engine kind runs on this machine's GPUs; per attempt, because a
resumed run may run on another host. Attempts without it (simulator, attached endpoints, no GPU,
files written before it) have no such key.

Version 2 adds ``prompt_salt``: the run's prompt salt (:mod:`workloads.salt`), drawn when the run directory is
created and reused by every ``--resume``, or null where the scenario keeps prompts fixed
(``workload.prompt_salt: fixed``). A version-1 manifest was written before salts existed: its prompts were the
same on every run (:func:`prompt_salt_of` says ``unrecorded``); kvbench still reads and resumes it unsalted.

Version 3 adds shards (:mod:`harness.runs.shard`): ``shard`` (``{index, count, start_at, shares}``, null when the
run is not a shard), each shard attempt's ``clock`` (``wall_minus_monotonic_ns``, the server's ``Date`` offset) and
``merged`` (the shards ``kvbench merge`` made a run from and its verdict, null otherwise). A shard's
``prompt_salt`` is the one all shards of the run derive alike (:func:`harness.runs.shard.shard_salt`).

An attempt ends ``completed``, ``interrupted`` or ``failed`` with a one-line ``reason``. That last
write must succeed on a full disk too: the file carries :data:`SLACK_BYTES` of trailing blanks
(JSON allows them), and when the atomic replace cannot get space the manifest is rewritten in
place, into blocks it already owns; a failed temporary file is always removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from common import __version__
from common.errors import RunDirError
from common.jsonfile import JsonProblem, parse_json
from common.private import FILE_MODE, open_private
from common.redact import redact_argv, redact_data, redact_text
from common.schema import first_problem
from harness.engines.base import EngineFacts
from harness.engines.host_link import HostLink
from harness.scenario.spec import Scenario
from workloads.salt import new_salt

MANIFEST_VERSION = 3
READ_VERSIONS = (1, 2, 3)
"""Manifest versions this kvbench reads: 1 (before per-run prompt salts), 2 (before shards) and 3."""
SLACK_BYTES = 1024
"""Trailing blanks kept in the file so the final status and reason fit in place on a full disk."""
REASON_CHARS = 300


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _run_quiet(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_sha(start: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    return _run_quiet(["git", "rev-parse", "HEAD"], cwd=start if start.is_dir() else start.parent)


GPU_ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "VLLM_ALLREDUCE_", "CUDA_VISIBLE_DEVICES")
"""Environment variables that decide how engines use the GPUs and their links (recorded as in force)."""


def gpu_facts() -> list[dict[str, str]]:
    """Every GPU ``nvidia-smi`` lists: name, driver, memory, UUID (empty without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,uuid", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2], "uuid": parts[3]})
    return gpus


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def gpu_topology() -> str | None:
    """``nvidia-smi topo -m``: how the GPUs, NICs and CPUs are linked (None without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return None
    text = _run_quiet(["nvidia-smi", "topo", "-m"])
    # nvidia-smi underlines the header with terminal escapes even into a pipe; the manifest keeps text
    return None if text is None else _ANSI_ESCAPE.sub("", text)


def gpu_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The GPU-related variables in force for every engine kvbench starts (they inherit this environment)."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in sorted(source.items()) if name.startswith(GPU_ENV_PREFIXES)}


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
        "gpu_topology": gpu_topology(),
        "gpu_environment": gpu_environment(),
    }


def scenario_digest(scenario: Scenario) -> str:
    """sha256 of the scenario as stored (secrets removed, keys sorted) but for ``output`` (where each shard writes
    its run directory is no part of what it measures): equal on every shard of one run, so the shards derive one
    prompt salt and ``kvbench merge`` knows they ran one scenario."""
    stored = json.dumps(redact_data(scenario.model_dump(mode="json", exclude={"output"})), sort_keys=True)
    return hashlib.sha256(stored.encode("utf-8")).hexdigest()


class Manifest:
    """In-memory manifest, saved after every change."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def start(
        cls,
        path: Path,
        scenario: Scenario,
        source: Path | None,
        attempt: int,
        *,
        shard: Mapping[str, Any] | None = None,
        shard_salt: str | None = None,
    ) -> Manifest:
        """Open (or create) the manifest and add a running attempt; ``shard``: a new shard run's ``shard`` block,
        ``shard_salt`` its shared prompt salt (where the scenario salts per run)."""
        if path.exists():
            data = read_manifest(path)
        else:
            data = {
                "manifest_version": MANIFEST_VERSION,
                "run_id": path.parent.name,
                "scenario_name": scenario.name,
                "scenario_source": str(source) if source else None,
                "scenario": redact_data(scenario.model_dump(mode="json")),
                "prompt_salt": (shard_salt or new_salt()) if scenario.workload.prompt_salt == "per_run" else None,
                "kvbench_version": __version__,
                "kvbench_git_sha": git_sha(Path(__file__).resolve().parent),
                "command": redact_argv(sys.argv),
                "engines": {},
                "attempts": [],
                "shard": dict(shard) if shard is not None else None,
                "merged": None,
            }
        data["host"] = host_facts()
        data["attempts"].append({"attempt": attempt, "started_at": now_iso(), "ended_at": None, "status": "running"})
        manifest = cls(path, data)
        manifest.save()
        return manifest

    def record_engine(self, arm: str, facts: EngineFacts) -> None:
        entry = {
            "kind": facts.kind,
            "version": facts.version,
            "command": list(facts.command),
            "details": dict(facts.details),
        }
        # engines redact their own command lines; this catches what they could not know (a URL password)
        self.data["engines"][arm] = redact_data(json.loads(json.dumps(entry, default=str)))
        self.save()

    def note_engine(self, arm: str, key: str, value: str) -> None:
        """Add one fact the arm's engine showed while it ran (e.g. that it cannot reset its prefix cache) to
        ``engines.ARM.details``."""
        entry = self.data["engines"].setdefault(arm, {"details": {}})
        entry.setdefault("details", {})[key] = redact_text(value)
        self.save()

    def record_host_link(self, link: HostLink) -> None:
        """The current attempt's host link (measured before its first engine starts)."""
        self.data["attempts"][-1]["host_link"] = link.model_dump(mode="json")
        self.save()

    def record_clock(self, clock: Mapping[str, Any]) -> None:
        """The current shard attempt's clocks (``attempts[-1].clock``: :class:`~.manifest_model.AttemptClock`)."""
        self.data["attempts"][-1]["clock"] = dict(clock)
        self.save()

    def record_shares(self, shares: list[dict[str, float]]) -> None:
        """A shard's part of each load point (``shard.shares``)."""
        if isinstance(self.data.get("shard"), dict):
            self.data["shard"]["shares"] = shares
            self.save()

    @property
    def host_gpus(self) -> int:
        """GPUs ``nvidia-smi`` listed on this attempt's host."""
        gpus = self.data.get("host", {}).get("gpus")
        return len(gpus) if isinstance(gpus, list) else 0

    def finish(self, status: str, reason: str | None = None) -> None:
        """End the attempt: ``completed``, ``failed``, ``inconclusive`` or ``interrupted``, and why."""
        update: dict[str, Any] = {"ended_at": now_iso(), "status": status}
        if reason:
            one_line = " ".join(reason.split())
            update["reason"] = one_line if len(one_line) <= REASON_CHARS else one_line[: REASON_CHARS - 3] + "..."
        self.data["attempts"][-1].update(update)
        self.save()

    def save(self) -> None:
        text = json.dumps(self.data, indent=2, sort_keys=False) + "\n"
        payload = (text + " " * SLACK_BYTES).encode("utf-8")
        tmp = self.path.with_suffix(".json.tmp")
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            tmp.replace(self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            if not self.path.exists():
                raise
            self._rewrite_in_place(payload)

    def _rewrite_in_place(self, payload: bytes) -> None:
        """The full-disk path: overwrite the existing file's blocks, then cut it to length."""
        payload = payload.rstrip(b" ")
        fd = os.open(self.path, os.O_WRONLY, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload + b" " * max(0, self.path.stat().st_size - len(payload)))
            handle.flush()
            os.fsync(handle.fileno())


MANIFEST_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("run_id", str, "a string"),
    ("scenario_name", str, "a string"),
    ("kvbench_version", str, "a string"),
    ("engines", dict, "an object"),
    ("attempts", list, "a list"),
    ("host", dict, "an object"),
)
"""Fields every manifest of :data:`MANIFEST_VERSION` carries, with their JSON type."""


def check_manifest(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The manifest's schema: its version is one this kvbench reads, its fields are there with their types.

    RunDirError naming the file, the field and what it must be. A file without ``manifest_version``
    (written by hand, or by tests) is checked for the types of the fields it has.
    """
    version = data.get("manifest_version")
    if "manifest_version" in data and (type(version) is not int or version not in READ_VERSIONS):
        readable = " or ".join(map(str, READ_VERSIONS))
        raise RunDirError(f"{path}: manifest_version {version!r}; this kvbench reads {readable}")
    for field, kind, what in MANIFEST_FIELDS:
        if field not in data:
            if "manifest_version" in data:
                raise RunDirError(f"{path}: {field}: missing (a manifest of version {version} has it)")
            continue
        if not isinstance(data[field], kind):
            raise RunDirError(f"{path}: {field}: must be {what}, got {type(data[field]).__name__}")
    if isinstance(version, int) and version >= 2 and "prompt_salt" not in data:
        raise RunDirError(f"{path}: prompt_salt: missing (a manifest of version 2 has it: a string, or null)")
    salt = data.get("prompt_salt")
    if salt is not None and not (isinstance(salt, str) and salt.isalnum()):
        raise RunDirError(f"{path}: prompt_salt: must be letters and digits, or null; got {salt!r}")
    for index, attempt in enumerate(data.get("attempts", [])):
        if not isinstance(attempt, dict) or type(attempt.get("attempt", 0)) is not int:
            raise RunDirError(f"{path}: attempts[{index}]: must be an object with an integer attempt")
    return data


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest as a mapping (empty when the file is missing), checked by :func:`check_manifest`.

    An unreadable or invalid one is a RunDirError naming the file and the field.
    """
    try:
        data = parse_json(path.read_bytes())
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise RunDirError(f"{path}: cannot read: {error.strerror}") from None
    except JsonProblem as error:  # JSON, UTF-8 or nesting
        raise RunDirError(f"{path}: not a JSON manifest: {error}") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: not a JSON manifest: expected an object, got {type(data).__name__}")
    return check_manifest(path, data)


def attempt_host_links(manifest: Mapping[str, Any], where: str) -> list[HostLink]:
    """The host link of every attempt that recorded one, in attempt order.

    RunDirError naming ``where`` (the manifest's path) and the field when one is not a host link.
    """
    attempts = manifest.get("attempts")
    links: list[HostLink] = []
    for index, attempt in enumerate(attempts if isinstance(attempts, list) else []):
        if not isinstance(attempt, dict) or attempt.get("host_link") is None:
            continue
        try:
            links.append(HostLink.model_validate(attempt["host_link"]))
        except ValidationError as error:
            raise RunDirError(f"{where}: {first_problem(error, prefix=(f'attempts[{index}].host_link',))}") from None
    return links


PromptSaltState = Literal["per_run", "fixed", "unrecorded"]


def prompt_salt_of(manifest: Mapping[str, Any]) -> tuple[PromptSaltState, str | None]:
    """How the run salted its prompts, and the salt: ``per_run`` (a salt), ``fixed`` (null: the scenario kept
    prompts fixed), ``unrecorded`` (a version-1 manifest, or none: written before salts; prompts were fixed)."""
    if "prompt_salt" not in manifest:
        return "unrecorded", None
    salt = manifest["prompt_salt"]
    return ("per_run", salt) if isinstance(salt, str) else ("fixed", None)
