"""The scenario: one YAML file that says what to run, validated once, then read-only.

``load_scenario`` is the single entry point; any problem becomes a :class:`ScenarioError` whose
message names the file, the field path and the allowed values.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from kvbench.harness.engines.configs import EngineConfig
from kvbench.harness.errors import ScenarioError
from kvbench.harness.model import StrictModel
from kvbench.offload.profiles import OffloadProfile, resolve_profile


class Arm(StrictModel):
    """One side of the comparison, e.g. AMG-OFF (offload disabled) or AMG-ON (offload enabled)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    offload: str | OffloadProfile = Field(
        description="A built-in profile name (off, hbm, cpu, disk, shared) or an inline profile."
    )

    @field_validator("offload")
    @classmethod
    def _known_profile(cls, value: str | OffloadProfile) -> str | OffloadProfile:
        resolve_profile(value)
        return value

    @property
    def profile(self) -> OffloadProfile:
        return resolve_profile(self.offload)


class BetweenTurns(StrictModel):
    """How turn 2 is made to measure a *returning* user, whose KV has left GPU memory.

    * ``reset_prefix_cache``: ask the engine to drop its GPU prefix cache between turns
      (vLLM ``POST /reset_prefix_cache``, SGLang ``/flush_cache``, the simulator); offload tiers stay.
    * ``disable_prefix_cache``: start the engine with its GPU prefix cache off, so only an
      offload tier can serve turn 2.
    * ``filler``: send unrelated prompts between turns until the GPU cache has been overwritten.
    * ``none``: do nothing (measures the hot-cache case, useful as a sanity check).
    """

    mode: Literal["reset_prefix_cache", "disable_prefix_cache", "filler", "none"] = "reset_prefix_cache"
    filler_tokens: int = Field(
        default=0, ge=0, description="With mode=filler: total prompt tokens of filler traffic per gap."
    )
    filler_request_tokens: int = Field(default=4000, ge=16, description="Prompt tokens per filler request.")

    @model_validator(mode="after")
    def _filler_needs_tokens(self) -> BetweenTurns:
        if self.mode == "filler" and self.filler_tokens <= 0:
            raise ValueError("mode 'filler' needs filler_tokens > 0 (enough to overwrite the GPU KV cache)")
        return self


class MultiRoundQAProbe(StrictModel):
    """Unloaded multi-round QA probe: per context length, N conversations with T turns each."""

    kind: Literal["multi_round_qa"]
    context_tokens: list[Annotated[int, Field(ge=16, le=2_000_000)]] = Field(min_length=1)
    conversations: int = Field(default=2, ge=1, description="Independent conversations per length.")
    turns: int = Field(default=2, ge=2, le=64)
    question_tokens: int = Field(default=32, ge=4)
    answer_tokens: int = Field(default=16, ge=1, description="max_tokens of every answer.")
    ignore_eos: bool = Field(
        default=True, description="Ask the engine to ignore EOS so every answer has answer_tokens tokens."
    )
    api: Literal["chat", "completions"] = "chat"
    between_turns: BetweenTurns = BetweenTurns()
    warmup_requests: int = Field(default=2, ge=0, description="Unmeasured requests after start-up.")
    request_timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("context_tokens")
    @classmethod
    def _sorted_unique(cls, values: list[int]) -> list[int]:
        if len(set(values)) != len(values):
            raise ValueError(f"context lengths must be unique, got {values}")
        return sorted(values)


WorkloadConfig = MultiRoundQAProbe  # a discriminated union once more kinds exist


class SLO(StrictModel):
    """Service-level objectives; used for goodput, soak verdicts and regression gates."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)


class OutputSpec(StrictModel):
    dir: str = Field(default="runs", description="Parent directory of run directories.")


class Compare(StrictModel):
    """Which arm is the baseline of the % diff columns (default: the first arm)."""

    baseline: str | None = None


class Scenario(StrictModel):
    """A complete, validated benchmark scenario."""

    schema_version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    engine: EngineConfig
    arms: list[Arm] = Field(min_length=1)
    workload: WorkloadConfig
    repetitions: int = Field(default=1, ge=1, description="Times the workload is repeated per arm.")
    seed: int = 0
    slo: SLO = SLO()
    output: OutputSpec = OutputSpec()
    compare: Compare = Compare()

    @model_validator(mode="after")
    def _arms_consistent(self) -> Scenario:
        names = [arm.name for arm in self.arms]
        if len(names) != len(set(names)):
            raise ValueError(f"arm names must be unique, got {names}")
        if self.compare.baseline is not None and self.compare.baseline not in names:
            raise ValueError(f"compare.baseline {self.compare.baseline!r} is not an arm; arms: {names}")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.compare.baseline or self.arms[0].name


def _field_names(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """Best-effort: the pydantic model that owns the mapping at ``loc`` (for listing allowed keys)."""
    model: type[BaseModel] | None = Scenario
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            # discriminated-union members appear as their tag in the location
            return _UNION_TAGS.get(part, None)
        model = _first_model(field.annotation)
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _union_tags() -> dict[str, type[BaseModel]]:
    from kvbench.harness.engines import configs

    tags: dict[str, type[BaseModel]] = {}
    for obj in vars(configs).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel) and "kind" in obj.model_fields:
            annotation = obj.model_fields["kind"].annotation
            for tag in getattr(annotation, "__args__", ()):
                tags[str(tag)] = obj
    tags["multi_round_qa"] = MultiRoundQAProbe
    return tags


_UNION_TAGS = _union_tags()


def format_validation_error(source: str, error: ValidationError) -> str:
    lines = [f"{source}: invalid scenario ({error.error_count()} problem(s))"]
    for item in error.errors():
        loc = tuple(item["loc"])
        path = ".".join(str(p) for p in loc) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            owner = _model_at(loc[:-1])
            if owner is not None:
                message += f"; allowed fields here: {', '.join(_field_names(owner))}"
        elif item["type"] == "missing":
            message = "required field is missing"
        got = item.get("input")
        suffix = (
            ""
            if item["type"] in {"missing", "extra_forbidden"} or isinstance(got, dict)
            else f" (got {got!r})"
        )
        lines.append(f"  - {path}: {message}{suffix}")
    return "\n".join(lines)


def bundled_scenarios() -> dict[str, Path]:
    """Scenario files shipped with the package, by stem (``quickstart`` -> .../quickstart.yaml)."""
    root = resources.files("kvbench.scenarios")
    found: dict[str, Path] = {}
    for entry in root.iterdir():
        if entry.name.endswith(".yaml"):
            found[entry.name.removesuffix(".yaml")] = Path(str(entry))
    return found


def resolve_scenario_path(ref: str) -> Path:
    """A path to a YAML file, or the name of a bundled scenario."""
    path = Path(ref)
    if path.exists():
        return path
    bundled = bundled_scenarios()
    if ref in bundled:
        return bundled[ref]
    names = ", ".join(sorted(bundled)) or "(none)"
    raise ScenarioError(f"{ref}: no such file, and not a bundled scenario; bundled scenarios: {names}")


def parse_scenario(data: object, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(format_validation_error(source, error)) from None


def load_scenario(ref: str | Path) -> tuple[Scenario, Path]:
    """Read and validate a scenario file (or bundled scenario name)."""
    path = resolve_scenario_path(str(ref))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ScenarioError(f"{path}: not valid YAML: {error}") from None
    return parse_scenario(data, str(path)), path
