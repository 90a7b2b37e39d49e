"""Removes API keys and tokens from command lines, environments, scenarios and free text before they are stored.

The one place for redaction rules. What counts as a secret:

* the value after a secret flag (``--api-key X``, ``--hf-token=X``) in an argument list;
* the value of an environment variable whose *name* says key, token, secret, password or credential;
* in free text: ``Bearer X``, ``api_key=X``/``token: X``, OpenAI (``sk-``) and Hugging Face (``hf_``)
  tokens, and the password in a URL (``http://user:PASSWORD@host``);
* any literal string known to be secret, wherever it appears and whatever prefix a server echoes it
  with: the ones a caller passes, and the ones this process registered with :func:`remember_secret`
  (the API key kvbench sends, the tokens an engine it starts is given), so every redacted line --
  stored error text, log tails, console errors -- scrubs them without knowing where they came from;
* in a scenario (:func:`redact_data`): all of the above, applied to every string, list of
  arguments and mapping of environment variables in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "***"
MIN_LITERAL_CHARS = 4
"""Literal secrets shorter than this are not searched for (they would redact ordinary words)."""
_SECRET_FLAGS = {"--api-key", "--api_key", "--token", "--hf-token", "--hf_token", "--password", "--secret"}
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# (pattern, keep): with keep, group 1 is a prefix that stays ("Bearer ", "api_key=", "http://user:").
_SECRET_TEXT: list[tuple[re.Pattern[str], bool]] = [
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"), True),
    (re.compile(r"(?i)((?:api[_-]?key|token|secret|password)\s*[=:]\s*)[^\s,;&\"']+"), True),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), False),
    (re.compile(r"\bhf_[A-Za-z0-9]{6,}"), False),
    # userinfo of a URL: keep the user name, hide the password (RFC 3986: no '/', '@' or space in it)
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/@:]*:)[^\s/@]+(?=@)"), True),
]


_REMEMBERED: set[str] = set()


def remember_secret(value: str | None) -> None:
    """Scrub ``value`` from every later :func:`redact_text` in this process (ignored when too short)."""
    if value and len(value) >= MIN_LITERAL_CHARS:
        _REMEMBERED.add(value)


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """Hide the value after a secret flag (``--api-key X``) and in ``--api-key=X`` forms."""
    literals = tuple(secrets)
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
        out.append(redact_text(arg, literals))
    return out


def secret_values(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The literal secrets a process is given: values after secret flags and of secret-named variables,
    so whatever the process echoes them with (its log, an error page) can be scrubbed."""
    found = [value for name, value in env.items() if is_secret_name(name) and value]
    for index, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in _SECRET_FLAGS:
            if sep:
                found.append(value)
            elif index + 1 < len(argv):
                found.append(argv[index + 1])
    return found


def is_secret_name(name: str) -> bool:
    """True for an environment variable (or mapping key) whose name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: (REDACTED if is_secret_name(name) else redact_text(value)) for name, value in env.items()}


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret form, and each literal in ``secrets``, replaced by ``***``."""
    literals = _REMEMBERED.union(s for s in secrets if len(s) >= MIN_LITERAL_CHARS)
    for literal in sorted(literals, key=len, reverse=True):
        text = text.replace(literal, REDACTED)
    for pattern, keep_prefix in _SECRET_TEXT:
        replacement = r"\g<1>" + REDACTED if keep_prefix else REDACTED
        text = pattern.sub(replacement, text)
    return text


JsonData = dict[str, "JsonData"] | list["JsonData"] | str | int | float | bool | None


def redact_data(data: JsonData) -> JsonData:
    """A copy of JSON-like data (a dumped scenario) with secrets hidden.

    A mapping value whose key names a secret (``env: {HF_TOKEN: ...}``, ``api_key: ...``) is
    replaced whole; lists of strings are treated as argument lists (``extra_args``); every other
    string goes through :func:`redact_text`. Keys ending in ``_env`` name a variable, not its value,
    and stay.
    """
    if isinstance(data, dict):
        out: dict[str, JsonData] = {}
        for key, value in data.items():
            if isinstance(value, str) and is_secret_name(key) and not key.endswith("_env"):
                out[key] = REDACTED
            else:
                out[key] = redact_data(value)
        return out
    if isinstance(data, list):
        if all(isinstance(item, str) for item in data):
            return list(redact_argv([item for item in data if isinstance(item, str)]))
        return [redact_data(item) for item in data]
    if isinstance(data, str):
        return redact_text(data)
    return data
