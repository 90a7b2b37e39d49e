"""The tokenizer a workload builds its prompts with: the engine's own where it offers one, so token counts are exact.

An endpoint without the engine's tokenizer (a plain OpenAI-compatible server, no ``POST /tokenize``) gets a
local one: a model directory's ``tokenizer.json`` (exact when it is the served model's), or
:class:`WordTokenizer`, kvbench's own. A tokenizer that says what it is (:class:`DescribedTokenizer`) lets a
run record which one built its prompts and whether its counts are the engine's (:func:`tokenizer_facts`);
then the server's ``usage.prompt_tokens`` gives the true lengths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from common.errors import KvbenchError


@dataclass(frozen=True)
class TokenIds:
    """A completion prompt as the engine's own token ids (:meth:`Tokenizer.prompt_ids`), sent instead of its text."""

    ids: tuple[int, ...]


class Tokenizer(Protocol):
    """Exact token counts for the engine's own tokenizer (token ids are the engine's)."""

    async def encode(self, text: str) -> list[int]: ...

    async def prompt_ids(self, text: str) -> list[int]:
        """The ids the engine itself makes of ``text`` as a completion prompt: :meth:`encode` plus the special
        tokens its tokenizer adds (e.g. Llama's BOS), so sending them skips the engine's tokenizing only."""
        ...

    async def decode(self, token_ids: Sequence[int]) -> str: ...


@runtime_checkable
class DescribedTokenizer(Protocol):
    """A tokenizer that says what it is (for the manifest and the report) and whether its counts are the engine's."""

    @property
    def description(self) -> str: ...

    @property
    def exact(self) -> bool:
        """True when its counts are the engine's own (the server's /tokenize, or the engine's tokenizer file)."""
        ...


ENGINE_TOKENIZER = "the engine's own tokenizer"


def tokenizer_facts(tokenizer: object) -> tuple[str, bool]:
    """(what the tokenizer is, whether its counts are the engine's); a tokenizer that does not say is the
    engine's own (every engine kind kvbench starts tokenizes with the engine's tokenizer)."""
    if isinstance(tokenizer, DescribedTokenizer):
        return tokenizer.description, tokenizer.exact
    return ENGINE_TOKENIZER, True


_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s", re.DOTALL)


class WordTokenizer:
    """kvbench's own tokenizer, for an endpoint that offers none: one token per word, digit or punctuation mark.

    A word with its leading space (`` model``) is one token, as in the BPE vocabularies of current LLMs for
    the common English words kvbench's prompts are made of (:mod:`workloads.text`); a digit, a punctuation mark
    (with an optional leading space) and any other character (newline, a second space, non-ASCII) are one
    token each. The pieces partition the text, so ``decode(encode(text)) == text`` and a prefix of the ids
    decodes to a prefix of the text (what :func:`workloads.text.fit_to_tokens` needs). Ids are assigned as
    pieces are first seen and mean nothing to any engine: :meth:`prompt_ids` refuses, and the server's
    ``usage.prompt_tokens`` gives a prompt's true length.
    """

    description: ClassVar[str] = "kvbench's word tokenizer (approximate: one token per word)"
    exact: ClassVar[bool] = False
    _ids: ClassVar[dict[str, int]] = {}
    _pieces: ClassVar[list[str]] = []

    def encode_sync(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        for piece in _PIECE.findall(text):
            token = ids.get(piece)
            if token is None:
                token = ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            out.append(token)
        return out

    async def encode(self, text: str) -> list[int]:
        return self.encode_sync(text)

    async def prompt_ids(self, text: str) -> list[int]:
        raise KvbenchError(
            "prompt: token_ids needs the engine's own token ids, and this endpoint has no /tokenize: use prompt: text, "
            "or give the served model's tokenizer (engine.vocab / --tokenizer DIR)"
        )

    async def decode(self, token_ids: Sequence[int]) -> str:
        pieces = self._pieces
        unknown = [token for token in token_ids if not 0 <= token < len(pieces)]
        if unknown:
            raise ValueError(f"token id {unknown[0]} was not made by this tokenizer")
        return "".join(pieces[token] for token in token_ids)
