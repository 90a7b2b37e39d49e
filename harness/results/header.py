"""The header every run-level result file opens with: its format, the kvbench that wrote it, its run and scenario.

``summary.json``, ``sweep.json``, ``soak.json`` and ``replay.json`` start with these four keys, in this
order. Pydantic lists a base model's fields before a subclass's, so each file keeps the key order it had
when every result class declared them itself, and files written before they were shared read the same.
"""

from __future__ import annotations

from typing import TypedDict

from common import __version__
from common.schema import VersionedFile


class ResultHeader(VersionedFile):
    """``schema_version``, ``kvbench_version``, ``run_id``, ``scenario_name``: the fields every run-level result
    file starts with. Each result class declares its own ``schema_version: Literal[N] = N`` (its position stays
    first), so a file of another version is refused by name."""

    schema_version: int
    kvbench_version: str
    run_id: str
    scenario_name: str


class HeaderFields(TypedDict):
    """The header's values a result builder passes on (``Result(**header_fields(...), ...)``)."""

    kvbench_version: str
    run_id: str
    scenario_name: str


def header_fields(run_id: str, scenario_name: str) -> HeaderFields:
    """The header of a result file this kvbench writes now for ``run_id`` of scenario ``scenario_name``."""
    return HeaderFields(kvbench_version=__version__, run_id=run_id, scenario_name=scenario_name)
