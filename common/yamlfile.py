"""Reading a YAML configuration file into a mapping, with one-line errors that name the file.

Scenarios, playbooks, calibrations and published-table specs all start the same way: read the text
(UTF-8), parse it with ``yaml.safe_load`` and expect a mapping at the top. Each caller passes its own
error class, so a bad file still fails as that kind of input (ScenarioError, PlaybookError, ...).

Scenario files may also say ``${VAR}`` and ``${VAR:-default}`` in string values: :class:`ScenarioLoader` reads
them and :func:`expand_env` expands them from an environment, naming the field of an unset variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from .errors import KvbenchError


def read_yaml_mapping(
    path: Path, error: type[KvbenchError], *, hint: str = "", loader: type[yaml.SafeLoader] = yaml.SafeLoader
) -> dict[str, object]:
    """The file's top-level mapping; ``error`` naming the file when it cannot be read, is not UTF-8,
    is not YAML, or holds something else than a mapping (``hint`` says what would write a good one).
    ``loader``: a safe loader with other implicit types (scenarios: :class:`Yaml12BooleansLoader`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as problem:
        raise error(f"{path}: cannot read: {problem.strerror}") from None
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not UTF-8 text (byte {problem.start}: {problem.reason}); save it as UTF-8") from None
    try:
        data = yaml.load(text, Loader=loader)  # a SafeLoader: plain data, never arbitrary objects
    except yaml.YAMLError as problem:
        raise error(f"{path}: not valid YAML: {problem}") from None
    except RecursionError:  # the composer recurses once per level: [[[[... past Python's stack
        raise error(f"{path}: not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise error(f"{path}: expected a mapping at the top level, got {got}{f' ({hint})' if hint else ''}")
    return data


class Yaml12BooleansLoader(yaml.SafeLoader):
    """A safe loader whose only booleans are ``true`` and ``false`` (YAML 1.2), not ``on``/``off``/``yes``/``no``.

    YAML 1.1 reads ``offload: off`` as False and an arm named ``ON`` as True; a scenario means the
    offload profile "off" and the name "ON".
    """


Yaml12BooleansLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12BooleansLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class AliasRefused(yaml.YAMLError):
    """A YAML alias (``*name``) where :class:`NoAliasesLoader` reads; the message names the alias."""


class NoAliasesLoader(Yaml12BooleansLoader):
    """:class:`Yaml12BooleansLoader` that refuses aliases: a one-line value (``--set``) has no use for them, and
    nested aliases (``a: &a [x, x]; b: &b [*a, *a]; ...``) grow a few bytes into a value whose every echo is
    exponentially long (a "billion laughs")."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            alias = self.peek_event()  # type: ignore[no-untyped-call]
            assert isinstance(alias, yaml.AliasEvent)  # check_event said so
            column = "" if alias.start_mark is None else f" (column {alias.start_mark.column + 1})"
            raise AliasRefused(f"the alias *{alias.anchor}{column} is not allowed here")
        return super().compose_node(parent, index)


# -- ${VAR} and ${VAR:-default} in scenario files ------------------------------------------------------------
ENV_REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
"""``${VAR}``, ``${VAR:-default}`` (the default when VAR is unset or empty, as in a POSIX shell) and ``$$`` (a
literal ``$``, so ``$${VAR}`` stays ``${VAR}``)."""
_WHOLE_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}$")
ENV_TAG = "tag:kvbench,2026:env"
"""The tag of a plain (unquoted) scalar that is one whole ``${...}``: typed after expansion (see :class:`EnvPlain`)."""


class EnvPlain(str):
    """A plain scalar that is one whole reference, ``conversations: ${N:-4}``: once expanded, its text is typed as
    YAML would type it written there (4 is a number, ``off`` a string, ``null`` nothing); a quoted one,
    ``"${N}"``, and a reference inside longer text always stay strings."""


class ScenarioLoader(Yaml12BooleansLoader):
    """:class:`Yaml12BooleansLoader` that keeps whole ``${...}`` plain scalars for :func:`expand_env`."""


ScenarioLoader.yaml_implicit_resolvers = {
    key: list(value) for key, value in Yaml12BooleansLoader.yaml_implicit_resolvers.items()
}
ScenarioLoader.add_implicit_resolver(ENV_TAG, _WHOLE_REFERENCE, ["$"])


def _construct_env(loader: yaml.SafeLoader, node: yaml.Node) -> EnvPlain:
    assert isinstance(node, yaml.ScalarNode)  # the implicit resolver tags plain scalars only
    return EnvPlain(loader.construct_scalar(node))


ScenarioLoader.add_constructor(ENV_TAG, _construct_env)


class EnvUnset(LookupError):
    """A ``${VAR}`` without a default whose variable is not set; the message names the field and the variable."""


def expand_text(text: str, environ: Mapping[str, str], where: str) -> tuple[str, list[str]]:
    """``text`` with every reference expanded, and the names of the variables read; :class:`EnvUnset` naming
    ``where`` and the variable when one is unset and has no default."""
    used: list[str] = []

    def one(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        name, default = found.group(1), found.group(2)
        value = environ.get(name)
        if value:  # set and not empty
            used.append(name)
            return value
        if default is not None:
            return default
        if value is None:
            raise EnvUnset(f"{where}: ${{{name}}} is not set (export {name}, or give a default: ${{{name}:-VALUE}})")
        used.append(name)
        return value

    return ENV_REFERENCE.sub(one, text), used


SCALAR_TAGS = {f"tag:yaml.org,2002:{name}" for name in ("int", "float", "bool", "null")}


def _typed(text: str) -> object:
    """``text`` typed as the plain scalar it would be written as in a scenario file: a number, true/false or
    null where its whole text is one (the loader's own patterns), else the text."""
    resolvers = Yaml12BooleansLoader.yaml_implicit_resolvers
    for tag, pattern in [*resolvers.get(text[:1], []), *resolvers.get(None, [])]:
        if tag in SCALAR_TAGS and pattern.match(text):
            return yaml.load(text, Loader=Yaml12BooleansLoader)  # one scalar: the pattern matched the whole text
    return text


def expand_env(data: object, environ: Mapping[str, str], path: tuple[str, ...] = ()) -> tuple[object, dict[str, str]]:
    """A copy of ``data`` (as :class:`ScenarioLoader` read it) with ``${...}`` expanded in every string value (not
    in keys), and the variables read with their values; :class:`EnvUnset` names the field (``engine.env.HF_TOKEN``)."""
    used: dict[str, str] = {}
    where = ".".join(path) or "(top level)"
    if isinstance(data, dict):
        out: dict[object, object] = {}
        for key, value in data.items():
            out[key], found = expand_env(value, environ, (*path, str(key)))
            used.update(found)
        return out, used
    if isinstance(data, list):
        items: list[object] = []
        for index, item in enumerate(data):
            expanded, found = expand_env(item, environ, (*path, str(index)))
            items.append(expanded)
            used.update(found)
        return items, used
    if isinstance(data, str):
        text, names = expand_text(data, environ, where)
        used.update({name: environ[name] for name in names})
        return (_typed(text) if isinstance(data, EnvPlain) else text), used
    return data, used
