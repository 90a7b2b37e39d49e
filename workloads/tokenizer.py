"""The tokenizer a workload builds its prompts with: the engine's own, so token counts are exact."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    """Exact token counts for the engine's own tokenizer (token ids are the engine's)."""

    async def encode(self, text: str) -> list[int]: ...

    async def decode(self, token_ids: Sequence[int]) -> str: ...
