"""The schema of ``manifest.json``, as a model: what :class:`harness.store.manifest.Manifest` writes.

The manifest is written and read as a mapping (:mod:`.manifest`: it is rewritten in place on a full disk, and
readers check only the fields they need); this model states its shape for the published JSON Schema
(``kvbench schema manifest``) and for the test that every kept run's manifest has it. Fields an older manifest
of the same ``manifest_version`` may lack have defaults. Version 3 adds what shards need (``shard``,
``attempts[].clock``) and what a merge made a run from (``merged``), all null otherwise. Times are ISO 8601
UTC strings, memory in bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from harness.engines.host_link import HostLink


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class AttemptClock(_Manifest):
    """A shard attempt's clocks: how its monotonic record times map to wall-clock time, and how far its wall clock
    was from the server's (the ``Date`` header of one response, 1 s resolution)."""

    wall_minus_monotonic_ns: int = Field(
        description="time.time_ns() - time.monotonic_ns() when the attempt started: a record's started_ns plus this "
        "is Unix ns."
    )
    server_offset_s: float | None = Field(
        description="The server's Date minus this client's clock midway through the request, in seconds (Date has "
        "1 s resolution, so |offset| < 1 s says the clocks agree to the second); None: not measured."
    )
    server_offset_note: str = Field(description="How it was measured, or why not.")


class ManifestShare(_Manifest):
    point: int = Field(ge=0)
    load: float = Field(description="The point's whole load: users, agents or requests/s.")
    share: float = Field(description="This shard's part: whole users (slots I, I+N, ...) or requests/s.")


class ManifestShard(_Manifest):
    """Version 3: the shard this run is (``--shard I/N``) and its common start (``--start-at``)."""

    index: int = Field(ge=0, description="0-based.")
    count: int = Field(ge=1)
    start_at: str | None = Field(description="--start-at, ISO 8601 UTC; None: the shard started when launched.")
    shares: list[ManifestShare] = Field(
        default_factory=list, description="Per load point: the whole load and this shard's part of it."
    )


class MergedShard(_Manifest):
    """Version 3, a merged run: one shard it was made from."""

    index: int = Field(ge=0)
    run_id: str
    path: str = Field(description="The shard's run directory as given to kvbench merge.")
    host: str
    status: str = Field(description="The shard's last attempt's status.")
    records: int = Field(ge=0)
    server_offset_s: float | None = Field(description="Its clock vs the server's Date header; None: not measured.")
    server_offset_note: str = Field(description="How the offset was measured, or why not.")


class MergeRecord(_Manifest):
    """Version 3, a merged run (``kvbench merge``): the shards it was made from and whether they make one run."""

    verdict: Literal["valid", "inconclusive"] = Field(
        description="inconclusive when a shard failed, missed a load point, or its measured windows did not overlap."
    )
    findings: list[str] = Field(description="Why it is inconclusive, each naming the shards.")
    shards: list[MergedShard]


class ManifestAttempt(_Manifest):
    """One invocation of the run (``--resume`` adds one)."""

    attempt: int = Field(ge=0, description="0 for the first invocation; each resume counts up.")
    started_at: str = Field(description="ISO 8601, UTC.")
    ended_at: str | None = Field(description="ISO 8601, UTC; None while it runs (or when it was killed).")
    status: str = Field(description="running, completed, failed, inconclusive or interrupted.")
    reason: str | None = Field(default=None, description="Why it ended as it did (one line).")
    host_link: HostLink | None = Field(
        default=None, description="Pinned host <-> GPU copy rates of this attempt's host, where measured."
    )
    clock: AttemptClock | None = Field(
        default=None, description="Version 3, a shard's attempt: its clocks, for the merge (None otherwise)."
    )


class ManifestEngine(_Manifest):
    """What an arm's engine was: its kind, version and command line (redacted)."""

    kind: str
    version: str | None
    command: list[str] = Field(description="The argv kvbench started it with (secrets redacted); empty if attached.")
    details: dict[str, JsonValue] = Field(description="Kind-specific facts (offload layer, tier sizes, ...).")


class ManifestHost(_Manifest):
    """The machine of the latest attempt."""

    hostname: str
    platform: str
    python: str
    cpu_count: int | None
    memory_bytes: int | None
    gpus: list[dict[str, str]] = Field(description="nvidia-smi's name, driver, memory (and uuid) per GPU.")
    gpu_topology: str | None = Field(default=None, description="nvidia-smi topo -m (None without nvidia-smi).")
    gpu_environment: dict[str, str] = Field(
        default_factory=dict, description="GPU-related environment variables in force (NCCL_*, CUDA_VISIBLE_...)."
    )


class ManifestFile(_Manifest):
    """``manifest.json``: what ran, where, with which versions (secrets redacted)."""

    manifest_version: Literal[1, 2, 3] = Field(
        description="3 since shards (shard, attempts[].clock, merged); 2 since per-run prompt salts; 1 before."
    )
    run_id: str
    scenario_name: str
    scenario_source: str | None = Field(description="The scenario file the run started from.")
    scenario: dict[str, JsonValue] = Field(description="The effective scenario, as scenario.yaml holds it.")
    prompt_salt: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]+$",
        description="Version 2 (required there): the salt ahead of every prompt of the run, kept by --resume; null "
        "when workload.prompt_salt is fixed. A version-1 manifest has none: its prompts were the same on every run.",
    )
    kvbench_version: str
    kvbench_git_sha: str | None
    command: list[str] = Field(description="kvbench's own argv (secrets redacted).")
    engines: dict[str, ManifestEngine] = Field(description="Per arm.")
    attempts: list[ManifestAttempt]
    host: ManifestHost
    shard: ManifestShard | None = Field(default=None, description="Version 3: the shard this run is; None: unsharded.")
    merged: MergeRecord | None = Field(
        default=None, description="Version 3: the shards kvbench merge made this run from; None: not a merge."
    )

    @model_validator(mode="after")
    def _version_2_has_salt(self) -> ManifestFile:
        if self.manifest_version >= 2 and "prompt_salt" not in self.model_fields_set:
            raise ValueError("prompt_salt: missing (a manifest of version 2 has it: a string, or null)")
        if self.manifest_version == 1 and self.prompt_salt is not None:
            raise ValueError("prompt_salt: a version-1 manifest predates prompt salts")
        if self.manifest_version < 3 and (self.shard is not None or self.merged is not None):
            raise ValueError("shard: a manifest of version 1 or 2 predates shards")
        return self
