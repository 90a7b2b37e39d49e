"""Shared pydantic base for every user-facing configuration model.

Scenario files are validated once and then never mutated: every model is frozen and rejects
unknown keys, so a typo in a YAML file is an error rather than a silently ignored setting.
"""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Frozen, ``extra="forbid"`` base model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
