"""``--set dotted.path=value``: change one field of a scenario's raw mapping before it is validated.

The value is read as a YAML scalar or flow collection with the scenario loader's typing (``4`` is a number,
``off`` the string "off", ``'[--enforce-eager]'`` a list), then put at the path; pydantic validates the
result as it validates any file, so a bad value gets the usual error naming the field. The path is checked
against the model on the way down: a key that is no field gives a one-line error naming the path and the
keys allowed at that level, an index of a list (``arms.1.name``) must exist. A missing section on the way is
created (``soak.window=4h`` in a scenario without ``soak:``).
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel

from common.errors import ScenarioError
from common.jsonfile import clipped, short_repr
from common.redact import is_secret_name, remember_secret
from common.yamlfile import AliasRefused, NoAliasesLoader

Raw = dict[str, object]


def parse_override(text: str) -> tuple[list[str], object]:
    """(path parts, typed value) of ``dotted.path=value``; ScenarioError naming the option when malformed."""
    path, sep, value = text.partition("=")
    parts = path.strip().split(".")
    if not sep or not all(parts):
        raise ScenarioError(f"--set {short_repr(text)}: give dotted.path=value, e.g. --set workload.conversations=4")
    try:
        parsed = yaml.load(value, Loader=NoAliasesLoader) if value.strip() else ""
    except AliasRefused as error:
        raise ScenarioError(f"--set {clipped(path)}: {error} (a --set value spells out its data)") from None
    except yaml.YAMLError as error:
        problem = str(error).splitlines()[0]
        raise ScenarioError(
            f"--set {clipped(path)}: the value {short_repr(value)} is not YAML ({problem}); quote it"
        ) from None
    except RecursionError:
        raise ScenarioError(f"--set {clipped(path)}: the value {short_repr(value)} is nested too deeply") from None
    return parts, parsed


def _members(annotation: object) -> list[object]:
    """The alternatives of an annotation, Annotated and Optional unwrapped (``A | B | None`` -> [A, B])."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in typing.get_args(annotation) for m in _members(arg) if m is not type(None)]
    return [annotation]


def _tags(model: type[BaseModel]) -> set[object]:
    """The Literal values a model's ``kind`` or ``dist`` field takes (how a discriminated union picks it)."""
    for name in ("kind", "dist"):
        field = model.model_fields.get(name)
        if field is not None and typing.get_origin(field.annotation) is Literal:
            return set(typing.get_args(field.annotation))
    return set()


def _models(members: list[object], raw: object) -> list[type[BaseModel]]:
    """The model alternatives; of a tagged union, the one the raw mapping's ``kind``/``dist`` names."""
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if isinstance(raw, dict):
        for key in ("kind", "dist"):
            picked = [m for m in models if raw.get(key) in _tags(m)]
            if picked:
                return picked
    return models


def _step(members: list[object], raw: object, key: str, where: str, option: str) -> list[object]:
    """The annotation members one level down at ``key`` (``where``: the path to it); ScenarioError naming the
    option's path and what is allowed at that level."""
    sequences = [m for m in members if typing.get_origin(m) in (list, tuple)]
    if isinstance(raw, list) or (sequences and not isinstance(raw, dict)):
        if not isinstance(raw, list):
            raise ScenarioError(
                f"--set {option}: {where.rpartition('.')[0]} is not set in the scenario, so it has no items"
            )
        if not key.isdigit() or int(key) >= len(raw):
            raise ScenarioError(
                f"--set {option}: {where.rpartition('.')[0] or '(top level)'} is a list of {len(raw)}; "
                f"give an index 0..{len(raw) - 1}"
            )
        return [arg for m in sequences for arg in _members(typing.get_args(m)[0])]
    models = _models(members, raw)
    fields = {name: field for model in models for name, field in model.model_fields.items()}
    if key in fields:
        return _members(fields[key].annotation)
    mappings = [m for m in members if typing.get_origin(m) is dict]
    if mappings:
        return [arg for m in mappings for arg in _members(typing.get_args(m)[1])]
    parent = where.rpartition(".")[0] or "(top level)"
    if not fields:
        raise ScenarioError(f"--set {option}: {parent} is a value, not a section; it has no field {short_repr(key)}")
    raise ScenarioError(f"--set {option}: no field {short_repr(key)} in {parent}; allowed: {', '.join(sorted(fields))}")


def apply_overrides(data: Raw, overrides: Sequence[str], root: type[BaseModel]) -> Raw:
    """A copy of the raw scenario mapping ``data`` with each ``dotted.path=value`` of ``overrides`` set, the paths
    checked against ``root`` (the scenario model); later overrides win."""
    out = copy.deepcopy(data)  # never the caller's mapping
    for text in overrides:
        parts, value = parse_override(text)
        if isinstance(value, str) and any(is_secret_name(p) and not p.endswith("_env") for p in parts):
            remember_secret(value)  # engine.env.HF_TOKEN=...: scrubbed wherever it would be stored or shown
        members: list[object] = [root]
        node: object = out
        for depth, key in enumerate(parts):
            where = ".".join(parts[: depth + 1])
            members = _step(members, node, key, clipped(where), clipped(".".join(parts)))
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if last:
                    node[int(key)] = value
                else:
                    node = node[int(key)]
                continue
            assert isinstance(node, dict)
            if last:
                node[key] = value
            else:
                if not isinstance(node.get(key), dict | list):
                    node[key] = {}  # a section the file left out (or gave as a scalar the override replaces)
                node = node[key]
    return out
