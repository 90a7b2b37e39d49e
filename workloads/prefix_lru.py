"""A prefix cache counted in tokens, least recently used out: what a trace's requests would find cached.

A prompt is a sequence of blocks ``(key, tokens)``; its last block may be partial (fewer tokens than the block
size). A lookup hits block after block from the start while the cache holds at least the block's tokens, and
stops at the first block it holds fewer of (a partial hit counts its cached tokens). Then every block of the
prompt is cached at its larger size and becomes the most recent; while more than ``capacity`` tokens are held
(None: infinite), the least recently used block goes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class PrefixLru:
    """``capacity`` tokens (None: infinite) of prompt blocks, least recently used evicted first."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[Hashable, int] = OrderedDict()
        self._used = 0

    def visit(self, blocks: Sequence[tuple[Hashable, int]]) -> tuple[int, int]:
        """(hit tokens, whole blocks hit) of a prompt's ``blocks`` ``(key, tokens)``, which are then cached."""
        cache = self._cache
        hit_tokens = hit_blocks = 0
        for key, size in blocks:
            cached = cache.get(key, 0)
            hit_tokens += min(cached, size)
            if cached < size:
                break
            hit_blocks += 1
        for key, size in blocks:
            cached = cache.pop(key, 0)
            cache[key] = max(cached, size)
            self._used += max(cached, size) - cached
        if self.capacity is not None:
            while self._used > self.capacity and cache:
                _, size = cache.popitem(last=False)
                self._used -= size
        return hit_tokens, hit_blocks
