"""KV-cache state of the simulator: the paged HBM block pool and the offload tiers below it.

HBM (:class:`BlockPool`) works like vLLM's paged KV cache with automatic prefix caching: memory is
cut into fixed blocks of ``block_tokens`` tokens; a *full* block is identified by a hash chain
(its tokens and the hash of the block before it), so equal prefixes share blocks; a block nobody
references stays cached until it is evicted, least recently freed first, to make room.

Offload tiers (:class:`OffloadTiers`) work like LMCache: the KV of a finished request is stored in
chunks of ``chunk_tokens`` (keyed by their own hash chain) in every tier, in the background, at the
tier's write bandwidth -- a chunk can only be loaded once its write has finished. A new request
looks up its longest run of stored chunks from the start of the prompt; loading a chunk costs its
bytes at ``min(tier read bandwidth, host link bandwidth)`` plus the tier's latency. Each tier has a
capacity and evicts least recently used chunks.

Neither class sleeps or reads a clock: times are passed in, so the scheduler (and tests) decide
what "now" is. Hashes are Python hashes of int tuples, which are not randomised per process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offload.profiles import OffloadProfile, OffloadTier

ROOT_HASH = 0x6B76_6265_6E63_68  # arbitrary fixed seed of every hash chain ("kvbench")


def chain_hashes(tokens: Sequence[int], size: int, start: int = 0, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of the full ``size``-token blocks of ``tokens`` from index ``start`` on.

    ``parent`` is the hash of the block that ends at ``start`` (``ROOT_HASH`` at 0), so a chain can
    be extended as a sequence grows without rehashing what came before.
    """
    hashes: list[int] = []
    append = hashes.append
    for begin in range(start, len(tokens) - size + 1, size):
        parent = hash((parent, *tokens[begin : begin + size]))
        append(parent)
    return hashes


class Block:
    """One KV block in HBM. ``block_hash`` is set once the block is full and cached."""

    __slots__ = ("block_hash", "refs")

    def __init__(self) -> None:
        self.block_hash: int | None = None
        self.refs = 1


class BlockPool:
    """A fixed number of HBM blocks, with prefix caching and LRU eviction of unreferenced blocks.

    A block is in exactly one of three states: *free* (counted, no object), *referenced* (held by
    one or more requests) or *cached* (full, hashed, unreferenced, waiting in the LRU list).
    """

    def __init__(self, num_blocks: int, block_tokens: int, caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("the block pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.caching = caching
        self._free = num_blocks
        self._cached: dict[int, Block] = {}
        self._lru: OrderedDict[int, Block] = OrderedDict()
        self.evictions = 0
        self.on_evict: Callable[[int], None] | None = None
        """Called with the hash of each cached block that is evicted (to offload it)."""

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free ones and cached, unreferenced ones."""
        return self._free + len(self._lru)

    @property
    def used(self) -> int:
        """Blocks referenced by requests (what vLLM's kv_cache_usage_perc counts)."""
        return self.num_blocks - self.available

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[Block]:
        """The cached blocks of the longest cached prefix of ``hashes`` (not yet referenced)."""
        if not self.caching:
            return []
        found: list[Block] = []
        cached = self._cached
        for block_hash in hashes[:max_blocks]:
            block = cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def can_allocate(self, hits: Sequence[Block], new_blocks: int) -> bool:
        """Whether ``hits`` can be referenced and ``new_blocks`` allocated on top of them."""
        idle_hits = sum(1 for block in hits if block.refs == 0)
        return new_blocks <= self.available - idle_hits

    def touch(self, hits: Sequence[Block]) -> None:
        """Reference cache hits (taking idle ones off the LRU list)."""
        for block in hits:
            if block.refs == 0:
                assert block.block_hash is not None
                del self._lru[block.block_hash]
            block.refs += 1

    def allocate(self, count: int) -> list[Block]:
        """``count`` new blocks, evicting the least recently freed cached blocks if needed."""
        if count > self.available:
            raise MemoryError(f"asked for {count} blocks, {self.available} available")
        from_free = min(count, self._free)
        self._free -= from_free
        for _ in range(count - from_free):
            block_hash, block = self._lru.popitem(last=False)
            del self._cached[block_hash]
            block.block_hash = None
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(block_hash)
        return [Block() for _ in range(count)]

    def register(self, block: Block, block_hash: int) -> None:
        """Mark a referenced, now full block as holding the content ``block_hash``.

        If another block already holds that content (two requests computed the same prefix at
        once), this one stays anonymous and returns to the free pool when released, as in vLLM.
        """
        if self.caching and block.block_hash is None and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference from each block; unreferenced cached blocks join the LRU tail.

        Blocks are released last-first, so the tail of a sequence is evicted before its head.
        """
        for block in reversed(blocks):
            block.refs -= 1
            if block.refs > 0:
                continue
            block_hash = block.block_hash
            if block_hash is not None and self._cached.get(block_hash) is block:
                self._lru[block_hash] = block
            else:
                block.block_hash = None
                self._free += 1

    def reset(self) -> int:
        """Forget every cached block (``POST /reset_prefix_cache``); returns how many were dropped.

        Referenced blocks stay allocated, but are no longer found by lookups and go back to the
        free pool when their requests release them.
        """
        dropped = len(self._cached)
        for block in self._lru.values():
            block.block_hash = None
        self._free += len(self._lru)
        self._lru.clear()
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        return dropped


@dataclass
class TierState:
    """One offload tier: its chunks (key -> time the write finished), bandwidths and LRU."""

    tier: OffloadTier
    capacity_chunks: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float
    chunks: OrderedDict[int, float] = field(default_factory=OrderedDict)
    write_busy_until: float = 0.0
    read_busy_until: float = 0.0
    bytes_written: float = 0.0
    bytes_read: float = 0.0
    evictions: int = 0
    # fault injection (harness.sim.faults): a slow tier, a full tier that refuses writes
    slow_factor: float = 1.0
    refuse_writes: bool = False
    refused_writes: int = 0
    instant_writes: bool = False
    """Calibrated backends: a chunk is ready when its request finishes (its cost is the blocking
    store in the prefill steps, see :class:`harness.sim.timemodel.Efficiencies`)."""

    @property
    def kind(self) -> str:
        return self.tier.kind

    def drop_all(self) -> int:
        """Forget every chunk (a full-tier fault: other data took the space); returns how many."""
        dropped = len(self.chunks)
        self.chunks.clear()
        self.evictions += dropped
        return dropped

    def ready(self, key: int, now: float) -> bool:
        written = self.chunks.get(key)
        return written is not None and written <= now

    def store(self, key: int, nbytes: float, now: float) -> bool:
        """Queue the write of one chunk behind earlier writes; False if it was already there."""
        if key in self.chunks:
            self.chunks.move_to_end(key)
            return False
        if self.refuse_writes:
            self.refused_writes += 1
            return False
        if self.instant_writes:
            self._insert(key, now, nbytes)
            return True
        start = max(now, self.write_busy_until)
        if start == now:
            start += self.latency_s * self.slow_factor  # an idle tier pays its latency before the first byte
        self.write_busy_until = start + nbytes / self.write_bytes_per_s * self.slow_factor
        self._insert(key, self.write_busy_until, nbytes)
        return True

    def _insert(self, key: int, ready_at: float, nbytes: float) -> None:
        self.chunks[key] = ready_at
        self.bytes_written += nbytes
        while len(self.chunks) > self.capacity_chunks:
            self.chunks.popitem(last=False)
            self.evictions += 1


@dataclass(frozen=True)
class TierHit:
    """The result of an offload lookup: tokens found and when they are in HBM."""

    tokens: int
    ready_at: float
    load_bytes: float
    by_tier: tuple[tuple[str, int], ...]
    """(tier kind, tokens loaded from it) for the tiers that served the hit."""
    transfer_s: float = 0.0
    """Seconds the tiers spend on this load (latency + bytes / bandwidth), without queueing."""


@dataclass(frozen=True)
class StoredPrefix:
    """The longest run of stored chunks from the start of a prompt, and where each chunk lives."""

    tokens: int
    """Prompt tokens covered (a multiple of ``chunk_tokens``)."""
    sources: tuple[int, ...]
    """Index of the (first, fastest) tier holding each chunk."""


class OffloadTiers:
    """The offload tiers of one profile, fastest (first in the profile) first.

    ``shared_chunks``: a fleet's shared tier -- the ``shared`` tier keeps its chunk index (and so
    its capacity) in this mapping, which every replica of the fleet uses: one dictionary for engine
    cores in one process (:mod:`harness.calibrate.fleet_whatif`), a directory for simulator processes
    (:class:`~harness.sim.shared_tier.DirectoryChunks`). Each replica keeps its own read and write
    queues (its own network link); the storage's aggregate bandwidth is not modelled.
    """

    def __init__(
        self,
        profile: OffloadProfile,
        kv_bytes_per_token: int,
        host_link_bytes_per_s: float,
        instant_writes: bool = False,
        *,
        shared_chunks: OrderedDict[int, float] | None = None,
    ) -> None:
        self.chunk_tokens = profile.chunk_tokens
        self.kv_bytes_per_token = kv_bytes_per_token
        self.chunk_bytes = float(profile.chunk_tokens * kv_bytes_per_token)
        self.tiers: list[TierState] = []
        for tier in profile.tiers:
            # every byte between a tier and HBM crosses the host links (PCIe) of the GPUs;
            # ``host_link_bytes_per_s`` is their sum (one link per tensor-parallel GPU)
            link = host_link_bytes_per_s
            state = TierState(
                tier=tier,
                capacity_chunks=max(1, int(tier.capacity_gb * 1e9 // self.chunk_bytes)),
                read_bytes_per_s=min(tier.effective_read_gbps * 1e9, link),
                write_bytes_per_s=min(tier.effective_write_gbps * 1e9, link),
                latency_s=tier.effective_latency_us * 1e-6,
                instant_writes=instant_writes,
            )
            if tier.kind == "shared" and shared_chunks is not None:
                state.chunks = shared_chunks
            self.tiers.append(state)

    @property
    def enabled(self) -> bool:
        return bool(self.tiers)

    def chunk_hashes(self, tokens: Sequence[int], start: int = 0, parent: int = ROOT_HASH) -> list[int]:
        return chain_hashes(tokens, self.chunk_tokens, start, parent)

    def store(self, chunk_keys: Sequence[int], now: float) -> int:
        """Write chunks to every tier (background, in order); returns chunks newly written."""
        written = 0
        for tier in self.tiers:
            for key in chunk_keys:
                written += tier.store(key, self.chunk_bytes, now)
        return written

    def holds(self, key: int) -> bool:
        return any(key in tier.chunks for tier in self.tiers)

    def find(self, chunk_keys: Sequence[int], max_tokens: int, now: float) -> StoredPrefix:
        """The longest prefix of ``chunk_keys`` whose chunks are stored (written by ``now``).

        ``max_tokens`` caps it (a request must compute at least its last token). Found chunks
        become the most recently used in their tier.
        """
        sources: list[int] = []
        for index, key in enumerate(chunk_keys):
            if (index + 1) * self.chunk_tokens > max_tokens:
                break
            source = next((i for i, tier in enumerate(self.tiers) if tier.ready(key, now)), None)
            if source is None:
                break
            self.tiers[source].chunks.move_to_end(key)
            sources.append(source)
        return StoredPrefix(len(sources) * self.chunk_tokens, tuple(sources))

    def _tokens_per_tier(self, prefix: StoredPrefix, begin: int, end: int) -> list[int]:
        """Tokens of ``[begin, end)`` that each tier serves (chunks may be cut at the edges)."""
        per_tier = [0] * len(self.tiers)
        size = self.chunk_tokens
        for index, source in enumerate(prefix.sources):
            low, high = max(index * size, begin), min((index + 1) * size, end)
            if high > low:
                per_tier[source] += high - low
        return per_tier

    def load(self, prefix: StoredPrefix, begin: int, end: int, now: float, commit: bool = True) -> TierHit:
        """Load tokens ``[begin, end)`` of a stored prefix into HBM, starting at ``now``.

        Each tier used costs ``latency + bytes / read bandwidth`` (times its slow-fault factor),
        queued behind earlier loads from the same tier; a load spread over several tiers loads tier
        after tier. ``commit=False`` only estimates (the tiers' queues and counters stay as they
        are), which is how the bidirectional split is chosen.
        """
        ready = now
        total_bytes = 0.0
        transfer = 0.0
        by_tier: list[tuple[str, int]] = []
        for tier, tokens in zip(self.tiers, self._tokens_per_tier(prefix, begin, end), strict=True):
            if tokens == 0:
                continue
            nbytes = tokens * self.kv_bytes_per_token
            seconds = (tier.latency_s + nbytes / tier.read_bytes_per_s) * tier.slow_factor
            ready = max(ready, tier.read_busy_until) + seconds
            transfer += seconds
            total_bytes += nbytes
            by_tier.append((tier.kind, tokens))
            if commit:
                tier.read_busy_until = ready
                tier.bytes_read += nbytes
        return TierHit(max(0, end - begin), ready, total_bytes, tuple(by_tier), transfer)

    def lookup(self, chunk_keys: Sequence[int], max_tokens: int, skip_tokens: int, now: float) -> TierHit:
        """Find and schedule the load of the longest stored prefix (:meth:`find`, then :meth:`load`).

        ``max_tokens`` caps the hit (a request must compute at least its last token);
        ``skip_tokens`` are already in HBM and are not loaded again.
        """
        prefix = self.find(chunk_keys, max_tokens, now)
        if prefix.tokens <= skip_tokens:
            return TierHit(0, now, 0.0, ())
        return self.load(prefix, skip_tokens, prefix.tokens, now)
