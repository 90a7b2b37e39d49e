"""The simulator's KV state: hash chains, the HBM block pool, and offload tier timing."""

from __future__ import annotations

import pytest

from harness.sim.kvcache import BlockPool, OffloadTiers, chain_hashes
from offload.profiles import OffloadProfile, OffloadTier


def test_hash_chain_shares_prefixes_and_extends() -> None:
    a = list(range(100))
    b = [*range(50), 999, *range(51, 100)]
    ha, hb = chain_hashes(a, 16), chain_hashes(b, 16)
    assert len(ha) == 6  # only full blocks
    assert ha[:3] == hb[:3]  # blocks 0-2 (tokens 0-47) are equal
    assert all(x != y for x, y in zip(ha[3:], hb[3:], strict=True))  # a change poisons everything after
    # the chain can be extended from where it stopped
    assert chain_hashes(a, 16, start=48, parent=ha[2]) == ha[3:]


def test_pool_prefix_hits_and_capacity() -> None:
    pool = BlockPool(num_blocks=10, block_tokens=4)
    hashes = chain_hashes(list(range(24)), 4)  # 6 blocks
    blocks = pool.allocate(6)
    for block, block_hash in zip(blocks, hashes, strict=True):
        pool.register(block, block_hash)
    assert pool.used == 6 and pool.available == 4
    # a second sequence with the same first 4 blocks hits them while they are in use
    hits = pool.lookup(chain_hashes([*range(16), 7, 7, 7, 7], 4), max_blocks=10)
    assert hits == blocks[:4]
    pool.touch(hits)
    assert pool.used == 6  # shared, not copied
    with pytest.raises(MemoryError):
        pool.allocate(5)
    pool.release(hits)
    pool.release(blocks)
    assert pool.used == 0 and pool.available == 10 and pool.cached_blocks == 6
    assert pool.lookup(hashes, max_blocks=3) == blocks[:3]  # capped (a request recomputes its last token)


def test_pool_evicts_least_recently_freed_first() -> None:
    pool = BlockPool(num_blocks=4, block_tokens=2)
    evicted: list[int] = []
    pool.on_evict = evicted.append
    first, second = chain_hashes([1, 1, 1, 1], 2), chain_hashes([2, 2, 2, 2], 2)
    for chain in (first, second):
        blocks = pool.allocate(2)
        for block, block_hash in zip(blocks, chain, strict=True):
            pool.register(block, block_hash)
        pool.release(blocks)
    assert pool.available == 4 and pool.cached_blocks == 4
    # reuse the first sequence: it becomes the most recently used
    hits = pool.lookup(first, 2)
    pool.touch(hits)
    pool.release(hits)
    pool.allocate(2)
    # blocks are released tail first, so the tail of `second` goes before its head
    assert evicted == [second[1], second[0]]
    assert len(pool.lookup(first, 2)) == 2 and pool.lookup(second, 2) == []


def test_can_allocate_counts_idle_hits() -> None:
    pool = BlockPool(num_blocks=4, block_tokens=2)
    chain = chain_hashes([5, 5, 5, 5], 2)
    blocks = pool.allocate(2)
    for block, block_hash in zip(blocks, chain, strict=True):
        pool.register(block, block_hash)
    pool.release(blocks)
    hits = pool.lookup(chain, 2)
    # 4 blocks available, but 2 of them are the hits themselves
    assert pool.can_allocate(hits, 2) and not pool.can_allocate(hits, 3)


def test_reset_keeps_referenced_blocks_but_forgets_them() -> None:
    pool = BlockPool(num_blocks=4, block_tokens=2)
    chain = chain_hashes([1, 2, 3, 4, 5, 6], 2)
    blocks = pool.allocate(3)
    for block, block_hash in zip(blocks, chain, strict=True):
        pool.register(block, block_hash)
    pool.release(blocks[2:])  # one block idle in the cache, two still held
    assert pool.reset() == 3
    assert pool.lookup(chain, 3) == [] and pool.used == 2
    pool.release(blocks[:2])
    assert pool.available == 4 and pool.cached_blocks == 0


def test_caching_off_never_hits() -> None:
    pool = BlockPool(num_blocks=4, block_tokens=2, caching=False)
    chain = chain_hashes([1, 2, 3, 4], 2)
    blocks = pool.allocate(2)
    for block, block_hash in zip(blocks, chain, strict=True):
        pool.register(block, block_hash)
    pool.release(blocks)
    assert pool.lookup(chain, 2) == [] and pool.cached_blocks == 0 and pool.available == 4


def tiers(*tiers: OffloadTier, chunk_tokens: int = 16, link: float = 1e12) -> OffloadTiers:
    profile = OffloadProfile(name="t", tiers=tiers, chunk_tokens=chunk_tokens)
    return OffloadTiers(profile, kv_bytes_per_token=1_000_000, host_link_bytes_per_s=link)


def test_tier_write_is_background_and_gates_loads() -> None:
    # 16 MB chunks, 1 GB/s write -> 16 ms per chunk, 1 ms latency
    offload = tiers(OffloadTier(kind="cpu", capacity_gb=1, read_gbps=2, write_gbps=1, latency_us=1000))
    keys = chain_hashes(list(range(64)), 16)  # 4 chunks
    assert offload.store(keys, now=10.0) == 4
    cpu = offload.tiers[0]
    assert cpu.chunks[keys[0]] == pytest.approx(10.0 + 0.001 + 0.016)
    assert cpu.chunks[keys[3]] == pytest.approx(10.0 + 0.001 + 4 * 0.016)
    assert offload.store(keys, now=10.5) == 0  # already there: no second write
    # at 10.040 only the first two chunks are written: a partial hit
    early = offload.lookup(keys, max_tokens=63, skip_tokens=0, now=10.040)
    assert early.tokens == 32
    late = offload.lookup(keys, max_tokens=63, skip_tokens=0, now=20.0)
    assert late.tokens == 48  # capped below the prompt length: the last token is always computed
    # 48 tokens x 1 MB at 2 GB/s = 24 ms, plus 1 ms latency
    assert late.ready_at == pytest.approx(20.0 + 0.001 + 0.024)
    assert late.by_tier == (("cpu", 48),)


def test_tier_load_is_capped_by_the_host_link_and_skips_hbm_hits() -> None:
    offload = tiers(OffloadTier(kind="cpu", capacity_gb=1, read_gbps=100, latency_us=0), link=10e9)
    keys = chain_hashes(list(range(64)), 16)
    offload.store(keys, now=0.0)
    hit = offload.lookup(keys, max_tokens=64, skip_tokens=20, now=100.0)
    assert hit.tokens == 64 - 20
    assert hit.load_bytes == 44 * 1_000_000
    assert hit.ready_at == pytest.approx(100.0 + 44e6 / 10e9)  # link, not the 100 GB/s tier


def test_tier_capacity_evicts_lru_and_lower_tier_serves() -> None:
    offload = tiers(
        OffloadTier(kind="cpu", capacity_gb=0.032, read_gbps=10, write_gbps=10, latency_us=0),  # 2 chunks
        OffloadTier(kind="disk", capacity_gb=1, read_gbps=1, write_gbps=1, latency_us=0),
    )
    keys = chain_hashes(list(range(64)), 16)
    offload.store(keys, now=0.0)
    cpu, disk = offload.tiers
    assert len(cpu.chunks) == 2 and cpu.evictions == 2 and len(disk.chunks) == 4
    assert offload.holds(keys[0])
    hit = offload.lookup(keys, max_tokens=64, skip_tokens=0, now=100.0)
    assert hit.tokens == 64
    assert hit.by_tier == (("cpu", 32), ("disk", 32))
    # chunks 0-1 from disk (1 GB/s), then 2-3 from cpu (10 GB/s), tier after tier
    assert hit.ready_at == pytest.approx(100.0 + 32e6 / 1e9 + 32e6 / 10e9)


def test_tier_lookup_stops_at_the_first_missing_chunk() -> None:
    offload = tiers(OffloadTier(kind="cpu", capacity_gb=1))
    keys = chain_hashes(list(range(64)), 16)
    offload.store([keys[0], keys[2], keys[3]], now=0.0)
    assert offload.lookup(keys, max_tokens=64, skip_tokens=0, now=100.0).tokens == 16
