"""Reading a YAML configuration file into a mapping, with one-line errors that name the file.

Scenarios, playbooks, calibrations and published-table specs all start the same way: read the text
(UTF-8), parse it with ``yaml.safe_load`` and expect a mapping at the top. Each caller passes its own
error class, so a bad file still fails as that kind of input (ScenarioError, PlaybookError, ...).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import KvbenchError


def read_yaml_mapping(path: Path, error: type[KvbenchError], *, hint: str = "") -> dict[str, object]:
    """The file's top-level mapping; ``error`` naming the file when it cannot be read, is not UTF-8,
    is not YAML, or holds something else than a mapping (``hint`` says what would write a good one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as problem:
        raise error(f"{path}: cannot read: {problem.strerror}") from None
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not UTF-8 text (byte {problem.start}: {problem.reason}); save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as problem:
        raise error(f"{path}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise error(f"{path}: expected a mapping at the top level, got {got}{f' ({hint})' if hint else ''}")
    return data
