"""Removes API keys and tokens from command lines, environments, scenarios and free text before they are stored.

The one place for redaction rules. What counts as a secret:

* the value after a secret flag in an argument list (``--api-key X``, ``--hf-token=X``,
  ``--ssl-keyfile-password X``): a flag one of whose words (split at ``-`` and ``_``) is in
  :data:`SECRET_FLAG_WORDS` -- ``--tokenizer`` and ``--max-num-batched-tokens`` are not secret;
* the value of an environment variable whose *name* says key, token, secret, password or credential;
* in free text: ``Bearer X``, ``api_key=X``/``token: X``, OpenAI (``sk-``) and Hugging Face (``hf_``)
  tokens, and the password in a URL (``http://user:PASSWORD@host``);
* any literal string known to be secret, wherever it appears and whatever prefix a server echoes it
  with: the ones a caller passes, and the ones this process registered with :func:`remember_secret`
  (the API key kvbench sends, the tokens an engine it starts is given), so every redacted line --
  stored error text, log tails, console errors -- scrubs them without knowing where they came from;
  in every encoding a server may echo it in (:func:`encodings`: as is, JSON-escaped, percent-encoded,
  base64), and the credentials of an ``Authorization: Basic``/``Bearer`` header whatever they are;
* in a scenario (:func:`redact_data`): all of the above, applied to every string, list of
  arguments and mapping of environment variables in it.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote, quote_plus

REDACTED = "***"
MIN_LITERAL_CHARS = 4
"""Literal secrets shorter than this are not searched for (they would redact ordinary words)."""
SECRET_FLAG_WORDS = frozenset(
    {"key", "apikey", "token", "password", "passwd", "passphrase", "pwd", "secret", "credential", "credentials"}
)
"""A command-line flag with one of these words in its name carries a secret value."""
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# (pattern, keep): with keep, group 1 is a prefix that stays ("Bearer ", "api_key=", "http://user:").
_SECRET_TEXT: list[tuple[re.Pattern[str], bool]] = [
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"), True),
    # Basic credentials are base64("user:password"): whatever the user, the whole value goes
    (re.compile(r"(?i)(\bbasic\s+)[A-Za-z0-9+/]{6,}={0,2}"), True),
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


def is_secret_flag(arg: str) -> bool:
    """True for ``--ssl-keyfile-password`` (or ``--api-key=X``): a flag with a word of :data:`SECRET_FLAG_WORDS`."""
    flag = arg.partition("=")[0]
    if not flag.startswith("-"):
        return False
    return any(word in SECRET_FLAG_WORDS for word in re.split(r"[-_]+", flag.strip("-").lower()))


def _takes_next(argv: Sequence[str], index: int) -> bool:
    """A secret flag without ``=`` takes the next argument as its value, unless that is another flag."""
    return index + 1 < len(argv) and not argv[index + 1].startswith("-")


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """Hide the value after a secret flag (``--api-key X``, ``--ssl-keyfile-password X``) and in ``--flag=X`` forms."""
    literals = tuple(secrets)
    out: list[str] = []
    hide_next = False
    for index, arg in enumerate(argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, sep, _ = arg.partition("=")
        if is_secret_flag(arg):
            if sep:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = _takes_next(argv, index)
            continue
        out.append(redact_text(arg, literals))
    return out


def secret_values(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The literal secrets a process is given: values after secret flags and of secret-named variables,
    so whatever the process echoes them with (its log, an error page) can be scrubbed."""
    found = [value for name, value in env.items() if is_secret_name(name) and value]
    for index, arg in enumerate(argv):
        _, sep, value = arg.partition("=")
        if is_secret_flag(arg):
            if sep:
                found.append(value)
            elif _takes_next(argv, index):
                found.append(argv[index + 1])
    return found


def is_secret_name(name: str) -> bool:
    """True for an environment variable (or mapping key) whose name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: (REDACTED if is_secret_name(name) else redact_text(value)) for name, value in env.items()}


@lru_cache(maxsize=256)
def encodings(literal: str) -> tuple[str, ...]:
    """The forms a server may echo a secret in: as is, JSON-escaped (once and twice, ``/`` as ``\\/``),
    percent-encoded (``%2F`` and ``%2f``, ``+`` for a space) and base64 (standard and URL-safe)."""
    forms = {literal}
    for escaped in (json.dumps(literal)[1:-1], json.dumps(literal, ensure_ascii=False)[1:-1]):
        forms |= {escaped, escaped.replace("/", "\\/"), json.dumps(escaped)[1:-1]}
    for encoded in (quote(literal, safe=""), quote(literal), quote_plus(literal)):
        forms |= {encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded)}
    raw = literal.encode("utf-8")
    for coded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        forms |= {coded.decode("ascii"), coded.decode("ascii").rstrip("=")}
    return tuple(sorted((form for form in forms if len(form) >= MIN_LITERAL_CHARS), key=len, reverse=True))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret form, and each literal in ``secrets`` in any of its
    :func:`encodings`, replaced by ``***``."""
    literals = _REMEMBERED.union(s for s in secrets if len(s) >= MIN_LITERAL_CHARS)
    forms = {form for literal in literals for form in encodings(literal)}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
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


def scrub_file(path: Path, secrets: Iterable[str] = ()) -> bool:
    """Rewrite a log a process has finished writing with :func:`redact_text` applied to every line.

    For what a process printed itself (an engine that logs its own arguments, tokens included):
    its stdout goes straight to the file, so the file is scrubbed once the process is gone. Bytes
    that are not UTF-8 stay as they were; the file keeps its mode. True when something was hidden.
    """
    literals = tuple(secrets)
    try:
        original = path.read_bytes()
    except FileNotFoundError:
        return False
    text = original.decode("utf-8", errors="surrogateescape")
    scrubbed = "".join(redact_text(line, literals) for line in text.splitlines(keepends=True))
    if scrubbed == text:
        return False
    tmp = path.with_name(path.name + ".scrub")
    tmp.write_bytes(scrubbed.encode("utf-8", errors="surrogateescape"))
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)
    return True
