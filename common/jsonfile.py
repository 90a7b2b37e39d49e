"""Parsing JSON text that a user or a file hands in, with one-line problems and bounded nesting.

``json.loads`` recurses once per level of nesting, so a line of 100,000 ``[`` raises ``RecursionError`` (a
traceback, not a ``ValueError``), and a value nested 900 deep that it does read can still break a later
``repr`` or a recursive walk over it. :func:`parse_json` is the one parser every reader of a JSON document or a
JSON Lines line uses: it refuses any document nested deeper than :data:`MAX_DEPTH` levels (pydantic's own JSON
limit for the files it parses) and raises :class:`JsonProblem`, a ``ValueError`` whose text is one line saying
what is wrong and where in the text (line and column); the caller prefixes the file (and line of a JSONL file).

:func:`short_repr` caps the ``repr`` of any value an error message echoes (a user's value can be megabytes, or nested
past Python's recursion limit), so a message stays one readable line.
"""

from __future__ import annotations

import json
import reprlib

MAX_DEPTH = 200
"""Deepest nesting (arrays and objects inside each other) a document may have: no file kvbench reads needs more
than a handful; pydantic refuses deeper JSON with the same limit."""

SHOWN_CHARS = 120
"""Longest echo of a value in an error message (characters)."""


class JsonProblem(ValueError):
    """Text that is not a JSON document kvbench reads; ``str()`` is one line (what, then where in the text)."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None) -> None:
        where = "" if line is None else f" at line {line} column {column}"
        super().__init__(f"{reason}{where}")
        self.reason = reason
        self.line = line
        self.column = column


def parse_json(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> object:
    """The document in ``text`` (bytes are read as UTF-8); :class:`JsonProblem` when it is not JSON, not UTF-8 or
    nested deeper than ``max_depth``."""
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as error:
        raise JsonProblem(error.msg, error.lineno, error.colno) from None
    except UnicodeDecodeError as error:
        raise JsonProblem(f"not UTF-8 (byte {error.start}: {error.reason})") from None
    except RecursionError:
        raise JsonProblem(f"nested deeper than {max_depth} levels") from None
    # a document with fewer brackets than the limit cannot be nested past it: the walk is for the rare rest
    opened = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opened > max_depth and _depth_over(data, max_depth):
        raise JsonProblem(f"nested deeper than {max_depth} levels")
    return data


def _depth_over(data: object, max_depth: int) -> bool:
    """Whether ``data`` nests containers more than ``max_depth`` deep (an explicit stack: no recursion)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, SHOWN_CHARS, SHOWN_CHARS, 40


def short_repr(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message: at most ``limit`` characters, nesting and long items elided (``...``)."""
    return clipped(_REPR.repr(value), limit)


def clipped(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for an error message: its first ``limit`` characters, the cut marked ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
