"""A scenario from command-line flags alone: ``kvbench run|sweep|replay --base-url URL`` (no YAML file).

:func:`scenario_from_flags` builds the same :class:`~.spec.Scenario` a YAML file would give, and the
run directory keeps it as ``scenario.yaml``, so ``--resume`` and ``kvbench report`` work as for any run.

* The engine is kind ``openai`` (an endpoint kvbench attaches to): ``--base-url URL`` measures one
  endpoint as the arm ``endpoint`` (``--offload PROFILE``: what it offloads, as ``NAME:PROFILE`` below);
  ``--arm NAME=URL`` (repeatable) measures several, one arm each, the
  first the baseline unless ``--baseline NAME``; ``--arm NAME:PROFILE=URL`` also says what that deployment
  offloads (a built-in profile: off, hbm, cpu, disk, shared; default hbm: a GPU prefix cache, no tier),
  which the validity gates judge its cache hits by. URLs are http(s) with a host; a trailing ``/v1`` is
  dropped.
* The model is ``--model NAME``, else the one each endpoint lists under ``GET /v1/models``
  (:func:`harness.engines.openai.discover_model`); several models and none chosen is an error naming them.
* The workload: ``run`` the multi-round QA probe (its defaults, with ``--contexts``, ``--conversations``,
  ``--turns``, ``--answer-tokens``); ``sweep`` the multi-user load at each ``--concurrency`` (each user a
  context drawn from ``--contexts``, ``--turns`` rounds, ``--answer-tokens`` per answer, a window of
  ``--duration`` after ``--warmup``; ``--conversations`` distinct users, default twice the largest
  concurrency); ``replay`` the trace ``--trace FILE``.

Every problem is a one-line :class:`~common.errors.ScenarioError` naming the flag and what it allows.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from common.errors import KvbenchError, ScenarioError
from offload.profiles import BUILTIN_PROFILES

from .flag_fields import ALL_WORKLOAD_FIELDS, WORKLOAD_FIELDS, flag_of
from .flag_fields import FlagKind as FlagKind  # the kinds are named with the flags they build from
from .spec import Scenario, format_validation_error, parse_duration

SINGLE_ARM = "endpoint"
"""The arm of a run against one ``--base-url``."""
DEFAULT_PROFILE = "hbm"
"""What an attached deployment is taken to have unless ``--arm NAME:PROFILE=URL`` says: a GPU prefix cache."""
DEFAULT_CONTEXTS = (8000, 32000)
DEFAULT_SWEEP_TURNS = 3
DEFAULT_SWEEP_ANSWER_TOKENS = 100
USERS_PER_CONCURRENCY = 2
MIN_SWEEP_USERS = 8
"""A flags-only sweep's distinct users unless --conversations says: 2 x the largest concurrency, at least 8."""
_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class EndpointFlags:
    """The flags of a flags-only run, as typed (strings are parsed and checked by :func:`scenario_from_flags`)."""

    base_url: str | None = None
    offload: str | None = None
    arms: tuple[str, ...] = ()
    baseline: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    tokenizer: str | None = None
    contexts: str | None = None
    conversations: int | None = None
    turns: int | None = None
    answer_tokens: int | None = None
    gpu_kv_tokens: int | None = None
    concurrency: str | None = None
    duration: str | None = None
    warmup: str | None = None
    trace: Path | None = None
    output_dir: str = "runs"

    @property
    def given(self) -> bool:
        """Whether this is a flags-only run (an endpoint given: --base-url or --arm NAME=URL)."""
        return self.base_url is not None or any("=" in arm for arm in self.arms)

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> EndpointFlags:
        """The flags from the command line's parsed options (field -> value, None where not given)."""
        return TypeAdapter(cls).validate_python(dict(options))

    def typed(self, fields: Iterable[str]) -> dict[str, object]:
        """``{flag: value}`` of the ``fields`` the user gave."""
        values = {flag_of(field): getattr(self, field) for field in fields}
        return {flag: value for flag, value in values.items() if value is not None}


def check_url(url: str, flag: str) -> str:
    """``url`` without a trailing ``/`` and ``/v1``; one-line error unless it is http(s)://HOST[:PORT][/path]."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as error:
        raise ScenarioError(f"{flag} {url!r}: not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ScenarioError(
            f"{flag} {url!r}: give an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/v1"
        )
    from harness.engines.openai import refuse_query_or_fragment

    return refuse_query_or_fragment(url, flag).rstrip("/").removesuffix("/v1")


def parse_arm(text: str) -> tuple[str, str, str]:
    """``NAME=URL`` or ``NAME:PROFILE=URL`` -> (name, profile, url)."""
    head, sep, url = text.partition("=")
    if not sep or not url:
        raise ScenarioError(f"--arm {text!r}: give NAME=URL (e.g. --arm OFF=http://127.0.0.1:8000/v1)")
    name, _, profile = head.partition(":")
    if not _ARM_NAME.match(name) or len(name) > 64:
        raise ScenarioError(
            f"--arm {text!r}: arm name {name!r} must start with a letter or digit and hold only letters, digits, "
            "'_', '.', '+', '-'"
        )
    profile = check_profile(profile, f"--arm {text!r}") if profile else DEFAULT_PROFILE
    return name, profile, check_url(url, f"--arm {name}")


def check_profile(profile: str, flag: str) -> str:
    """``profile`` if it is a built-in offload profile; one-line error naming ``flag`` and the allowed ones."""
    if profile not in BUILTIN_PROFILES:
        raise ScenarioError(
            f"{flag}: unknown offload profile {profile!r}; allowed: {', '.join(sorted(BUILTIN_PROFILES))}"
        )
    return profile


def parse_ints(text: str, flag: str, *, low: int) -> list[int]:
    """``"8000,32000"`` -> [8000, 32000]; one-line error naming ``flag`` otherwise."""
    try:
        values = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(value < low for value in values):
        raise ScenarioError(f"{flag} {text!r}: give whole numbers >= {low}, separated by commas (e.g. 8000,32000)")
    if len(set(values)) != len(values):
        raise ScenarioError(f"{flag} {text!r}: each value once")
    return sorted(values)


def _endpoints(flags: EndpointFlags) -> list[tuple[str, str, str]]:
    """(arm, profile, url) of every endpoint the flags name."""
    if flags.base_url is not None and flags.arms:
        raise ScenarioError("give --base-url URL (one endpoint) or --arm NAME=URL (one per arm), not both")
    if flags.offload is not None and flags.base_url is None:
        raise ScenarioError("--offload goes with --base-url URL; with --arm give NAME:PROFILE=URL")
    if flags.base_url is not None:
        profile = DEFAULT_PROFILE if flags.offload is None else check_profile(flags.offload, "--offload")
        return [(SINGLE_ARM, profile, check_url(flags.base_url, "--base-url"))]
    arms = [parse_arm(text) for text in flags.arms]
    names = [name for name, _, _ in arms]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ScenarioError(f"--arm: arm {repeated[0]!r} given twice; every arm needs its own name")
    return arms


def _model(flags: EndpointFlags, urls: Sequence[str], discover: Callable[[str, str | None], str]) -> str:
    if flags.model is not None:
        if not flags.model.strip():
            raise ScenarioError("--model: give the model name the server lists under GET /v1/models")
        return flags.model
    api_key = _api_key(flags.api_key_env)
    found = {url: discover(url, api_key) for url in dict.fromkeys(urls)}
    if len(set(found.values())) > 1:
        listed = ", ".join(f"{url} serves {model}" for url, model in found.items())
        raise ScenarioError(f"the endpoints serve different models ({listed}); choose one with --model NAME")
    return next(iter(found.values()))


def _api_key(env: str | None) -> str | None:
    import os

    if env is None:
        return None
    if not _ENV_NAME.match(env):
        raise ScenarioError(f"--api-key-env {env!r}: give the NAME of an environment variable (not the key)")
    value = os.environ.get(env)
    if not value:
        raise ScenarioError(f"--api-key-env {env}: that environment variable is not set")
    return value


def _workload(kind: FlagKind, flags: EndpointFlags) -> dict[str, object]:
    contexts = parse_ints(flags.contexts, "--contexts", low=16) if flags.contexts else list(DEFAULT_CONTEXTS)
    if kind == "probe":
        workload: dict[str, object] = {"kind": "multi_round_qa", "context_tokens": contexts}
        optional = {"conversations": flags.conversations, "turns": flags.turns, "answer_tokens": flags.answer_tokens}
        if flags.gpu_kv_tokens is not None:  # sizes mode auto's filler where the endpoint cannot reset
            workload["between_turns"] = {"mode": "auto", "gpu_kv_tokens": flags.gpu_kv_tokens}
        return workload | {key: value for key, value in optional.items() if value is not None}
    if kind == "sweep":
        turns = flags.turns if flags.turns is not None else DEFAULT_SWEEP_TURNS
        answer = flags.answer_tokens if flags.answer_tokens is not None else DEFAULT_SWEEP_ANSWER_TOKENS
        workload = {
            "kind": "multi_user_qa",
            "rounds": {"dist": "fixed", "value": turns},
            "context_tokens": {"dist": "choice", "values": contexts},
            "answer_tokens": {"dist": "fixed", "value": answer},
        }
        users = flags.conversations
        if users is None:  # enough users that each returns after others ran, few enough that their texts build fast
            users = max(MIN_SWEEP_USERS, USERS_PER_CONCURRENCY * max(_concurrency(flags)))
        return workload | {"users": users}
    if flags.trace is None:
        raise ScenarioError("kvbench replay --base-url URL needs --trace FILE (the trace to replay)")
    if not flags.trace.is_file():
        raise ScenarioError(f"--trace {flags.trace}: no such file")
    # the format told from the first line, as kvbench trace stats does (--set workload.format=NAME names it)
    return {"kind": "trace", "path": str(flags.trace.resolve()), "format": "auto"}


def _concurrency(flags: EndpointFlags) -> list[int]:
    if flags.concurrency is None:
        raise ScenarioError("kvbench sweep --base-url URL needs --concurrency (users at each load point, e.g. 1,4,16)")
    return parse_ints(flags.concurrency, "--concurrency", low=1)


def _sweep(flags: EndpointFlags) -> dict[str, object]:
    sweep: dict[str, object] = {"mode": "concurrency", "values": _concurrency(flags)}
    for flag, value, key in (("--duration", flags.duration, "duration"), ("--warmup", flags.warmup, "warmup")):
        if value is not None:
            try:
                sweep[key] = parse_duration(value)
            except ValueError as error:
                raise ScenarioError(f"{flag}: {error}") from None
    return sweep


_VERB: dict[FlagKind, str] = {"probe": "run", "sweep": "sweep", "replay": "replay"}


def _refuse_unused(kind: FlagKind, flags: EndpointFlags) -> None:
    """A workload flag the command does not use is an error, not silently ignored."""
    unused = list(flags.typed(field for field in ALL_WORKLOAD_FIELDS if field not in WORKLOAD_FIELDS[kind]))
    if unused:
        raise ScenarioError(f"{unused[0]}: kvbench {_VERB[kind]} does not take it")


def scenario_from_flags(
    kind: FlagKind, flags: EndpointFlags, *, discover: Callable[[str, str | None], str] | None = None
) -> Scenario:
    """The scenario of a flags-only ``kvbench run`` (probe), ``sweep`` or ``replay``.

    ``discover(url, api_key)``: the model an endpoint serves, when ``--model`` is not given (default:
    ``GET /v1/models``, :func:`harness.engines.openai.discover_model`).
    """
    _refuse_unused(kind, flags)
    endpoints = _endpoints(flags)
    if not endpoints:
        raise ScenarioError("give --base-url URL or --arm NAME=URL")
    names = [name for name, _, _ in endpoints]
    if flags.baseline is not None and flags.baseline not in names:
        raise ScenarioError(f"--baseline {flags.baseline!r}: no such arm; arms: {', '.join(names)}")
    if flags.tokenizer is not None and not Path(flags.tokenizer).expanduser().exists():
        raise ScenarioError(f"--tokenizer {flags.tokenizer}: no such file or directory")
    workload = _workload(kind, flags)  # the flags' own errors before a request leaves (model discovery)
    sweep = _sweep(flags) if kind == "sweep" else None
    if discover is None:
        from harness.engines.openai import discover_model

        discover = discover_model
    try:
        model = _model(flags, [url for _, _, url in endpoints], discover)
    except ScenarioError:
        raise
    except KvbenchError as error:
        raise ScenarioError(f"model discovery: {error}") from None
    engine: dict[str, object] = {"kind": "openai", "model": model}
    if len(endpoints) == 1:
        engine["base_url"] = endpoints[0][2]
    else:
        engine["arm_urls"] = {name: url for name, _, url in endpoints}
    engine |= {key: value for key, value in (("api_key_env", flags.api_key_env), ("vocab", flags.tokenizer)) if value}
    where = ", ".join(f"{name}={url}" for name, _, url in endpoints)
    data: dict[str, object] = {
        "name": f"endpoint-{_slug(model)}",
        "description": f"Flags-only kvbench {_VERB[kind]} of {model} at {where}.",
        "engine": engine,
        "arms": [{"name": name, "offload": profile} for name, profile, _ in endpoints],
        "workload": workload,
        "output": {"dir": flags.output_dir},
    }
    if flags.baseline is not None:
        data["compare"] = {"baseline": flags.baseline}
    if sweep is not None:
        data["sweep"] = sweep
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        # name the flag, not the YAML path the user never wrote
        lines = format_validation_error("flags", error).splitlines()[1:]
        first = lines[0].strip().removeprefix("- ") if lines else str(error)
        raise ScenarioError(_flag_names(first)) from None


_FLAG_OF_FIELD = {
    "workload.conversations": "--conversations",
    "workload.users": "--conversations",
    "workload.turns": "--turns",
    "workload.rounds": "--turns",
    "workload.answer_tokens": "--answer-tokens",
    "workload.between_turns.gpu_kv_tokens": "--gpu-kv-tokens",
    "workload.context_tokens": "--contexts",
    "sweep.values": "--concurrency",
    "sweep.duration": "--duration",
    "sweep.warmup": "--warmup",
}


def _flag_names(problem: str) -> str:
    """``workload.turns: ...`` -> ``--turns: ...`` (the flag the user typed, not a YAML path)."""
    field, sep, message = problem.partition(": ")
    flag = next((flag for path, flag in _FLAG_OF_FIELD.items() if field.startswith(path)), field)
    return f"{flag}: {message}" if sep else problem


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def tier_declaration(command: Sequence[str], arm: str, index: int, profile: str) -> str:
    """How the run started by ``command`` (its argv, as the manifest keeps it) declares that arm ``arm`` (the
    scenario's ``arms[index]``) offloads to ``profile``: ``--offload cpu`` after ``--base-url URL``,
    ``--arm NAME:cpu=URL`` after ``--arm NAME=URL``, else the scenario file's ``arms[i].offload: cpu``."""
    args = list(command)
    if any(arg == "--base-url" or arg.startswith("--base-url=") for arg in args):
        return f"--offload {profile}"
    arm_values = [value for flag, value in itertools.pairwise(args) if flag == "--arm"]
    arm_values += [arg.removeprefix("--arm=") for arg in args if arg.startswith("--arm=")]
    if any("=" in value for value in arm_values):
        return f"--arm {arm}:{profile}=URL"
    return f"arms[{index}].offload: {profile}"
