"""Agent trace formats (Bailian, Claude-Code, token-level, text), read into :class:`~workloads.trace.TraceRequest`.

Every format maps its calls onto the same contract: ``call_id`` (the call's own id), ``parent``
(0-based position in :attr:`Trace.requests` of the call it waits for; None for a root), ``call_type``
(normal, subagent or side), ``session``, ``turn``, and the prompt as ``hash_ids`` (block-hash
traces), ``token_ids`` (token traces) or ``text``/``messages`` (text traces). Times become
milliseconds on the trace's clock. The formats (docs/traces.md; a JSON Schema each,
``docs/trace-<format>.schema.json``):

* ``bailian`` (Alibaba's Qwen Bailian usage traces), one call per line: ``chat_id``,
  ``parent_chat_id`` (−1 for a root, else an earlier line's ``chat_id``; one that no line has, a parent
  from before the trace's start, also makes a root), ``timestamp`` (s),
  ``input_length``, ``output_length``, ``type`` (free text, e.g. the request's modality), ``turn``,
  ``hash_ids`` (16-token blocks). The parent is ``parent_chat_id``; the session is the root's id.
* ``claude-code`` (SemiAnalysis/Weka Claude-Code traces), one conversation per line: ``id``,
  ``block_size`` (64), ``hash_id_scope`` (``global``: equal ids are equal blocks across
  conversations; ``conversation``: ids are the conversation's own, so they are namespaced by
  ``id``), ``requests`` of ``{t (s), in, out, hash_ids, type}``, ``type`` one of normal, subagent,
  side, and an optional ``agent`` naming the subagent a subagent call belongs to. Parents, in the
  conversation's request order:

  - a normal call waits for the previous normal call (the first normal call is a root);
  - a subagent call waits for the previous call of its own subagent chain; a chain's first call
    waits for the normal call before it. Chains are named by ``agent``; without it, the subagent
    calls after one normal call form one chain (give ``agent`` to tell concurrent subagents apart);
  - a side call (a title, a summary) waits for the normal call before it.

* ``tokens``, one call per line: ``session_id``, ``turn_idx``, ``input_toks``, ``output_toks``,
  ``arrival_time_ns``, ``token_ids`` (the prompt, ``input_toks`` of them). The parent is the
  session's previous call (``turn_idx`` must grow within a session).
* ``text`` (LMCache's unified agent trace), one call per line: ``session_id``, ``timestamp`` (s),
  ``input`` (the full prompt: a string, or a list of ``{role, content}`` messages), ``output`` (the
  recorded answer) and optionally ``output_length`` (tokens to generate; default
  ceil(characters of ``output`` / 4)). ``input_length`` is ceil(characters / 4), an estimate until
  the engine tokenizes it. The parent is the session's previous call.

Format detection (:func:`detect_format`) looks at the first line's fields only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from common.jsonfile import clipped, short_repr

from .trace_model import HEADER_KEY, CallType, HashId, TraceError, TraceFormat, TraceRequest, _Line

AgentFormat = Literal["bailian", "claude-code", "tokens", "text"]
AGENT_FORMATS: tuple[AgentFormat, ...] = ("bailian", "claude-code", "tokens", "text")
DEFAULT_BLOCK_TOKENS: dict[AgentFormat, int] = {"bailian": 16, "claude-code": 64, "tokens": 16, "text": 16}
"""The block size of each format's hash ids (bailian 16, claude-code 64); for token and text traces the
finest block the ceilings are computed at (they have no blocks of their own)."""
CALL_TYPES: tuple[CallType, ...] = ("normal", "subagent", "side")
HASH_ID_SCOPES = ("global", "conversation")
CHARS_PER_TOKEN = 4
"""Characters per token assumed for a text trace's lengths before the engine tokenizes it."""


def detect_format(path: str, first: _Line) -> TraceFormat:
    """The format of a trace from the fields of its first line (a one-line error when no format fits)."""
    keys = set(first.data)
    if HEADER_KEY in keys or "session" in keys:
        return "kvbench"
    if "requests" in keys and "block_size" in keys:
        return "claude-code"
    if "chat_id" in keys:
        return "bailian"
    if "token_ids" in keys or "arrival_time_ns" in keys:
        return "tokens"
    if "session_id" in keys and "input" in keys:
        return "text"
    if "hash_ids" in keys and "timestamp" in keys:
        return "mooncake"
    shown = clipped(", ".join(sorted(keys)[:8])) or "none"
    raise TraceError(
        f"{path}:{first.number}: cannot tell the trace format from the first line's fields ({shown}); name it "
        "(trace stats --format, a scenario's workload.format): one of mooncake, kvbench, bailian, claude-code, "
        "tokens, text"
    )


@dataclass(frozen=True, slots=True)
class _Call:
    """A parsed call before its position in the trace is known (parents by key)."""

    line: int
    order: int
    timestamp_ms: float
    request: TraceRequest
    key: object
    parent_key: object | None


def _id(line: _Line, field: str, value: object) -> HashId:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise line.error(field, f"must be a string or an integer, got {value!r}")
    return value


def _count(line: _Line, field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise line.error(field, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _seconds(line: _Line, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise line.error(field, f"must be a finite number >= 0 (seconds), got {value!r}")
    return float(value) * 1000.0


def _hash_list(line: _Line, field: str, value: object, input_length: int, block: int) -> list[HashId]:
    if not isinstance(value, list) or not value:
        raise line.error(field, f"must be a non-empty list of block ids, got {type(value).__name__}")
    ids: list[HashId] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise line.error(field, f"ids must be integers or strings, got {short_repr(item)}")
        ids.append(item)
    needed = -(-input_length // block)
    if len(value) != needed:
        raise line.error(
            field,
            f"{len(value)} ids of {block} tokens do not cover {input_length} input tokens "
            f"(needs ceil({input_length}/{block}) = {needed} ids)",
        )
    return ids


def parse_agent_trace(
    format: AgentFormat, lines: Iterable[_Line], block_tokens: int | None, path: str
) -> tuple[int, list[TraceRequest]]:
    """(block size, requests in arrival order with parents as positions) of an agent trace's lines, read once
    (a stream: each line's data is dropped once its calls are made)."""
    block = block_tokens or DEFAULT_BLOCK_TOKENS[format]
    calls: list[_Call]
    if format == "bailian":
        calls = [_bailian(line, block) for line in lines]
    elif format == "claude-code":
        block, calls = _claude_code(lines, block_tokens)
    elif format == "tokens":
        calls = _per_session(_tokens(line) for line in lines)
    else:
        calls = _per_session(_text(line) for line in lines)
    known = {call.key for call in calls}
    # stable: calls with equal times keep the file's order (a conversation's own order for claude-code); taken
    # from the end of the reversed list, so each parsed call is freed once its request with a parent is made
    calls.sort(key=lambda call: (call.timestamp_ms, call.line, call.order))
    calls.reverse()
    position: dict[object, int] = {}
    requests: list[TraceRequest] = []
    while calls:
        call, index = calls.pop(), len(requests)
        if call.key in position:
            raise _Line(path, call.line, {}).error(_key_field(format), f"{call.request.call_id!r} appears twice")
        parent: int | None = None
        # a parent no line has (it arrived before the trace's first line) makes the call a root, as in a window
        if call.parent_key is not None and call.parent_key in known:
            if call.parent_key not in position:
                raise _Line(path, call.line, {}).error(
                    _parent_field(format),
                    f"{call.request.call_id!r} waits for {_shown(call.parent_key)}, which is not an earlier call "
                    "of the trace (a parent must arrive no later than its child)",
                )
            parent = position[call.parent_key]
        position[call.key] = index
        session = requests[parent].session if parent is not None and format == "bailian" else call.request.session
        requests.append(replace(call.request, parent=parent, session=session))
    return block, requests


def _shown(key: object) -> str:
    return repr(key[-1]) if isinstance(key, tuple) else repr(key)


def _key_field(format: AgentFormat) -> str:
    return {"bailian": "chat_id", "claude-code": "requests", "tokens": "turn_idx", "text": "session_id"}[format]


def _parent_field(format: AgentFormat) -> str:
    return {"bailian": "parent_chat_id", "claude-code": "requests", "tokens": "turn_idx", "text": "session_id"}[format]


# -- bailian ----------------------------------------------------------------------------------------


def _bailian(line: _Line, block: int) -> _Call:
    chat_id = _id(line, "chat_id", line.require("chat_id"))
    parent_raw = line.require("parent_chat_id")
    parent = None if parent_raw == -1 else _id(line, "parent_chat_id", parent_raw)
    input_length = line.integer("input_length", 1)
    kind = line.require("type")
    if not isinstance(kind, str):
        raise line.error("type", f"must be a string, got {kind!r}")
    request = TraceRequest(
        line=line.number,
        timestamp_ms=_seconds(line, "timestamp", line.require("timestamp")),
        input_length=input_length,
        output_length=line.integer("output_length", 0),
        hash_ids=line.ids(_hash_list(line, "hash_ids", line.require("hash_ids"), input_length, block)),
        session=str(chat_id),
        turn=line.integer("turn", 0),
        call_id=str(chat_id),
        call_type="normal",
    )
    return _Call(line.number, 0, request.timestamp_ms, request, chat_id, parent)


# -- claude-code ------------------------------------------------------------------------------------


def _claude_code(lines: Iterable[_Line], asked: int | None) -> tuple[int, list[_Call]]:
    block: int | None = asked
    block_line = 0
    calls: list[_Call] = []
    for line in lines:
        size = line.integer("block_size", 1)
        if block is not None and size != block:
            source = "--block-tokens" if block_line == 0 else f"line {block_line}"
            raise line.error("block_size", f"{size}, but {source} says {block}; a trace has one block size")
        block, block_line = size, block_line or line.number
        calls.extend(_conversation(line, size))
    return block or DEFAULT_BLOCK_TOKENS["claude-code"], calls


def _conversation(line: _Line, block: int) -> list[_Call]:
    conversation = str(_id(line, "id", line.require("id")))
    scope = line.require("hash_id_scope")
    if scope not in HASH_ID_SCOPES:
        raise line.error("hash_id_scope", f"{scope!r}; allowed: {', '.join(HASH_ID_SCOPES)}")
    raw = line.require("requests")
    if not isinstance(raw, list) or not raw:
        raise line.error("requests", "must be a non-empty list of calls")
    calls: list[_Call] = []
    last_normal: int | None = None
    chains: dict[object, int] = {}
    previous_ms = 0.0
    for k, item in enumerate(raw):
        where = f"requests[{k}]"
        if not isinstance(item, dict):
            raise line.error(where, f"must be an object, got {type(item).__name__}")
        for field in ("t", "in", "out", "hash_ids", "type"):
            if field not in item:
                raise line.error(f"{where}.{field}", "missing")
        stamp = _seconds(line, f"{where}.t", item["t"])
        if stamp < previous_ms:
            raise line.error(
                f"{where}.t", f"{stamp / 1000:g} s is earlier than the call before (calls are in time order)"
            )
        previous_ms = stamp
        input_length = _count(line, f"{where}.in", item["in"], 1)
        ids = _hash_list(line, f"{where}.hash_ids", item["hash_ids"], input_length, block)
        kind = item["type"]
        if kind not in CALL_TYPES:
            raise line.error(f"{where}.type", f"{kind!r}; allowed: {', '.join(CALL_TYPES)}")
        parent: int | None
        if kind == "normal":
            parent, last_normal = last_normal, k
        elif kind == "side":
            parent = last_normal
        else:
            agent = item.get("agent")
            chain: object = ("after", last_normal) if agent is None else ("agent", _id(line, f"{where}.agent", agent))
            parent = chains.get(chain, last_normal)
            chains[chain] = k
        scoped = line.ids(ids if scope == "global" else (f"{conversation}/{h}" for h in ids))
        request = TraceRequest(
            line=line.number,
            timestamp_ms=stamp,
            input_length=input_length,
            output_length=_count(line, f"{where}.out", item["out"], 0),
            hash_ids=scoped,
            session=conversation,
            turn=k + 1,
            call_id=f"{conversation}#{k}",
            call_type=kind,
        )
        key = (conversation, k)
        calls.append(_Call(line.number, k, stamp, request, key, None if parent is None else (conversation, parent)))
    return calls


# -- tokens and text ----------------------------------------------------------------------------------


def _per_session(parsed: Iterable[tuple[_Line, _Call, int]]) -> list[_Call]:
    """Chains each session's calls in file order: a call's parent is its session's previous call."""
    last: dict[str | None, tuple[object, int]] = {}
    out: list[_Call] = []
    for line, call, turn in parsed:
        session = call.request.session
        before = last.get(session)
        if before is not None and turn <= before[1]:
            raise line.error("turn_idx", f"{turn} does not follow the session's previous turn {before[1]}")
        last[session] = (call.key, turn)
        parent = None if before is None else before[0]
        out.append(_Call(call.line, call.order, call.timestamp_ms, call.request, call.key, parent))
    return out


def _tokens(line: _Line) -> tuple[_Line, _Call, int]:
    session = str(_id(line, "session_id", line.require("session_id")))
    turn = line.integer("turn_idx", 0)
    input_length = line.integer("input_toks", 1)
    ids = line.require("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise line.error("token_ids", "must be a list of token ids (integers >= 0)")
    if len(ids) != input_length:
        raise line.error("token_ids", f"{len(ids)} ids, but input_toks is {input_length}")
    stamp_ns = line.integer("arrival_time_ns", 0)
    request = TraceRequest(
        line=line.number,
        timestamp_ms=stamp_ns / 1e6,
        input_length=input_length,
        output_length=line.integer("output_toks", 0),
        session=session,
        turn=turn,
        call_id=f"{session}#{turn}",
        call_type="normal",
        token_ids=tuple(ids),
    )
    return line, _Call(line.number, 0, request.timestamp_ms, request, line.number, None), turn


def _text(line: _Line) -> tuple[_Line, _Call, int]:
    session = str(_id(line, "session_id", line.require("session_id")))
    stamp = _seconds(line, "timestamp", line.require("timestamp"))
    raw = line.require("input")
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    if isinstance(raw, str) and raw:
        text = raw
    elif isinstance(raw, list) and raw:
        parsed: list[tuple[str, str]] = []
        for k, message in enumerate(raw):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise line.error(f"input[{k}]", "must be a message {role: string, content: string}")
            parsed.append((message["role"], message["content"]))
        messages = tuple(parsed)
    else:
        raise line.error("input", "must be a non-empty string or a non-empty list of {role, content} messages")
    output = line.require("output")
    if not isinstance(output, str):
        raise line.error("output", f"must be a string, got {type(output).__name__}")
    chars = len(text) if text is not None else len(prompt_string_of(messages or ()))
    output_length = (
        line.integer("output_length", 1) if "output_length" in line.data else max(1, -(-len(output) // CHARS_PER_TOKEN))
    )
    request = TraceRequest(
        line=line.number,
        timestamp_ms=stamp,
        input_length=max(1, -(-chars // CHARS_PER_TOKEN)),
        output_length=output_length,
        text=text,
        session=session,
        call_id=f"{session}@{line.number}",
        call_type="normal",
        messages=messages,
    )
    return line, _Call(line.number, 0, stamp, request, line.number, None), line.number


def prompt_string_of(messages: Sequence[tuple[str, str]]) -> str:
    """A message list as one string (``role: content`` per message, newline-separated): the characters a text
    trace's ceiling is computed on (a chat template adds tokens, but keeps shared prefixes shared)."""
    return "".join(f"{role}: {content}\n" for role, content in messages)
