"""The header every run-level result file opens with: its format, the kvbench that wrote it, its run and scenario.

``summary.json``, ``sweep.json``, ``soak.json`` and ``replay.json`` start with these four keys, in this
order. Pydantic lists a base model's fields before a subclass's, so each file keeps the key order it had
when every result class declared them itself, and files written before they were shared read the same.
"""

from __future__ import annotations

from typing import Literal

from common.schema import VersionedFile


class ResultHeader(VersionedFile):
    """``schema_version``, ``kvbench_version``, ``run_id``, ``scenario_name``: the fields every run-level result
    file starts with. A result class that changes its format redeclares ``schema_version`` (its position stays)."""

    schema_version: Literal[1] = 1
    kvbench_version: str
    run_id: str
    scenario_name: str
