"""Reading a YAML configuration file into a mapping, with one-line errors that name the file.

Scenarios, playbooks, calibrations and published-table specs all start the same way: read the text
(UTF-8), parse it with ``yaml.safe_load`` and expect a mapping at the top. Each caller passes its own
error class, so a bad file still fails as that kind of input (ScenarioError, PlaybookError, ...).
"""

from __future__ import annotations

import re
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
