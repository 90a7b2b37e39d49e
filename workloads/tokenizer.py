"""The tokenizer a workload builds its prompts with: the engine's own, so token counts are exact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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
