"""The schema of ``manifest.json``, as a model: what :class:`harness.store.manifest.Manifest` writes.

The manifest is written and read as a mapping (:mod:`.manifest`: it is rewritten in place on a full disk, and
readers check only the fields they need); this model states its shape for the published JSON Schema
(``kvbench schema manifest``) and for the test that every kept run's manifest has it. Fields an older manifest
of the same ``manifest_version`` may lack have defaults. Times are ISO 8601 UTC strings, memory in bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from harness.engines.host_link import HostLink


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    manifest_version: Literal[1, 2] = Field(description="2 since per-run prompt salts; 1 before (no prompt_salt).")
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

    @model_validator(mode="after")
    def _version_2_has_salt(self) -> ManifestFile:
        if self.manifest_version == 2 and "prompt_salt" not in self.model_fields_set:
            raise ValueError("prompt_salt: missing (a manifest of version 2 has it: a string, or null)")
        if self.manifest_version == 1 and self.prompt_salt is not None:
            raise ValueError("prompt_salt: a version-1 manifest predates prompt salts")
        return self
