"""The header every run-level result file opens with: its format, the kvbench that wrote it, its run and scenario.

``summary.json``, ``sweep.json``, ``soak.json``, ``replay.json`` and ``agentic.json`` start with these five keys, in
this order; the fifth, ``provenance``, says whether the figures were measured or simulated
(:func:`~.provenance.provenance` of the run's manifest), so a file read alone cannot pass a simulation for a
measurement. Pydantic lists a base model's fields before a subclass's, so each file keeps the key order it had
when every result class declared them itself, and files written before they were shared read the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from common import __version__
from common.schema import VersionedFile
from harness.store.manifest import read_manifest

from .provenance import Origin, provenance

if TYPE_CHECKING:
    from harness.store.rundir import RunDir


class ResultProvenance(BaseModel):
    """Where a result file's figures came from (:class:`~.provenance.Provenance` without the setup key)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    origin: Origin = Field(
        description="measured: on an engine (started by kvbench or attached); simulated: kvbench's simulator, "
        "started by kvbench or attached by URL (its GET /v1/models says owned_by kvbench-sim); unknown: no manifest "
        "was read"
    )
    label: str = Field(description="The provenance in words, as every report prints it.")


UNKNOWN_PROVENANCE = ResultProvenance(origin="unknown", label="provenance unknown (no manifest read)")
"""What a result built from records alone (no run directory) says of its origin."""


class ResultHeader(VersionedFile):
    """``schema_version``, ``kvbench_version``, ``run_id``, ``scenario_name``: the fields every run-level result
    file starts with. Each result class declares its own ``schema_version: Literal[N] = N`` (its position stays
    first), so a file of another version is refused by name."""

    schema_version: int
    kvbench_version: str
    run_id: str
    scenario_name: str
    provenance: ResultProvenance


class HeaderFields(TypedDict):
    """The header's values a result builder passes on (``Result(**header_fields(...), ...)``)."""

    kvbench_version: str
    run_id: str
    scenario_name: str
    provenance: ResultProvenance


def header_fields(run_id: str, scenario_name: str) -> HeaderFields:
    """The header of a result file this kvbench writes now for ``run_id`` of scenario ``scenario_name``; its
    provenance is unknown until :func:`with_provenance` reads the run's manifest."""
    return HeaderFields(
        kvbench_version=__version__, run_id=run_id, scenario_name=scenario_name, provenance=UNKNOWN_PROVENANCE
    )


Result = TypeVar("Result", bound=ResultHeader)


def with_provenance(result: Result, run_dir: RunDir) -> Result:
    """``result`` with the provenance of ``run_dir``'s manifest."""
    found = provenance(read_manifest(run_dir.manifest_file))
    return result.model_copy(update={"provenance": ResultProvenance(origin=found.origin, label=found.label)})
