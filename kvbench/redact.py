"""Removes API keys and tokens from command lines, environments and free text before they are stored."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "***"
_SECRET_FLAGS = {"--api-key", "--api_key", "--token", "--hf-token", "--password", "--secret"}
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# (pattern, keep): with keep, group 1 is a prefix that stays ("Bearer ", "api_key=").
_SECRET_TEXT: list[tuple[re.Pattern[str], bool]] = [
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"), True),
    (re.compile(r"(?i)((?:api[_-]?key|token|secret|password)\s*[=:]\s*)[^\s,;&\"']+"), True),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), False),
    (re.compile(r"\bhf_[A-Za-z0-9]{6,}"), False),
]


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Hide the value after a secret flag (``--api-key X``) and in ``--api-key=X`` forms."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, sep, _ = arg.partition("=")
        if flag in _SECRET_FLAGS:
            if sep:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: (REDACTED if _SECRET_NAME.search(name) else value) for name, value in env.items()}


def redact_text(text: str) -> str:
    for pattern, keep_prefix in _SECRET_TEXT:
        replacement = r"\g<1>" + REDACTED if keep_prefix else REDACTED
        text = pattern.sub(replacement, text)
    return text
