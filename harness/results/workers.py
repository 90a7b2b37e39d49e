"""``workers.json``: where the shards of a sweep run on Ray (``kvbench sweep --ray``) ran, and how each ended.

The merged run's ``manifest.json`` (``merged``) says what the merge found in each shard's files; this file adds what
only the Ray driver knew: the worker (Ray node, actor, host, process id) that ran each shard, its wall clock's
offset from the driver's, and whether the worker ran to the end or died. A shard's load points start at the common
``--start-at`` schedule on its worker's own clock, so the offsets bound how far apart the shards started.

**Clock offset** (seconds): the worker's ``time.time()`` minus the driver's midway through the call that read it,
``worker - (sent + received) / 2``; it is known to within half the round trip (``clock_rtt_s / 2``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common.schema import VersionedFile

WorkerEnd = Literal["completed", "exited", "died"]
"""completed: the worker's ``kvbench sweep`` exited 0 or 3 (a verdict); exited: it exited otherwise (its stderr's
last line in ``error``); died: the Ray actor was lost (killed, out of memory, its node gone) before it ended."""


class RayWorker(BaseModel):
    """One Ray actor that ran one shard."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    shard: int = Field(ge=0, description="The shard it ran (--shard I/N: I).")
    hostname: str | None = Field(description="The worker's host name; None: it died before it said.")
    node_id: str | None = Field(description="The Ray node it ran on (hex).")
    actor_id: str | None = Field(description="The Ray actor (hex).")
    pid: int | None = Field(description="The actor's process id on its host.")
    clock_offset_s: float | None = Field(description="Its wall clock minus the driver's, seconds (module docstring).")
    clock_rtt_s: float | None = Field(description="The round trip of the call that read its clock, seconds.")
    end: WorkerEnd
    exit_code: int | None = Field(description="Its kvbench sweep's exit code; None when it died first.")
    error: str | None = Field(description="Why it did not complete (one line); None when it did.")
    bytes_streamed: int = Field(ge=0, description="Bytes of its run directory's files it streamed to the driver.")


class RayWorkers(VersionedFile):
    """``workers.json`` of a sweep run on Ray."""

    FILE_NAME = "workers.json"
    schema_version: Literal[1] = 1
    ray_version: str
    address: str = Field(description="--ray ADDRESS as given, or 'local' (a cluster kvbench started and stopped).")
    start_at: str = Field(description="The shards' common --start-at, ISO 8601 UTC.")
    workers: list[RayWorker]
