"""``kvbench trace stats --json`` on each bundled agent sample agrees, within 0.01, with a naive O(n²) prefix scan
written here from the raw JSON lines (it calls no kvbench code): the infinite-cache hit rate in tokens and in
blocks, at the trace's own block size and re-blocked to every coarser size it divides, with and without a
context cap; and the depth of the longest parent chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import kvbench, kvbench_env

from . import agent_samples

REPO = Path(__file__).resolve().parents[3]
Row = dict[str, Any]
"""One raw JSON line (the reference reads the files itself)."""
Prompt = tuple[list[object], list[int], int]
"""(block identities, block sizes, prompt length) of one call in arrival order."""


def rows(name: str) -> list[Row]:
    return [json.loads(line) for line in agent_samples.path(name).read_text().splitlines() if line.strip()]


def hash_prompts(name: str) -> tuple[int, list[tuple[list[object], int]]]:
    """(fine block size, [(fine ids, prompt tokens)] in arrival order) of a block-hash sample."""
    if name == "bailian":
        data = sorted(rows(name), key=lambda row: float(row["timestamp"]))
        return 16, [(list(row["hash_ids"]), int(row["input_length"])) for row in data]
    calls: list[tuple[float, int, int, list[object], int]] = []
    for number, row in enumerate(rows(name)):
        scoped = row["hash_id_scope"] == "conversation"
        for k, call in enumerate(row["requests"]):
            ids = [f"{row['id']}:{h}" if scoped else h for h in call["hash_ids"]]
            calls.append((float(call["t"]), number, k, ids, int(call["in"])))
    calls.sort(key=lambda c: (c[0], c[1], c[2]))
    return 64, [(c[3], c[4]) for c in calls]


def coarse(ids: list[object], length: int, fine: int, factor: int) -> Prompt:
    sizes = [fine] * (len(ids) - 1) + [length - fine * (len(ids) - 1)]
    keys: list[object] = [tuple(ids[s : s + factor]) for s in range(0, len(ids), factor)]
    return keys, [sum(sizes[s : s + factor]) for s in range(0, len(ids), factor)], length


def scan(prompts: list[Prompt]) -> tuple[float, float]:
    """Each call against every earlier one: the longest shared prefix of blocks, a block counting up to the size
    it had in the earlier call. Returns (token hit rate, block hit rate)."""
    hit_tokens = hit_blocks = tokens = blocks = 0
    for i, (keys, sizes, length) in enumerate(prompts):
        best_tokens = best_blocks = 0
        for earlier_keys, earlier_sizes, _ in prompts[:i]:
            got_tokens = got_blocks = 0
            for m in range(min(len(keys), len(earlier_keys))):
                if keys[m] != earlier_keys[m]:
                    break
                if earlier_sizes[m] < sizes[m]:
                    got_tokens += earlier_sizes[m]
                    break
                got_tokens += sizes[m]
                got_blocks += 1
            best_tokens, best_blocks = max(best_tokens, got_tokens), max(best_blocks, got_blocks)
        hit_tokens += best_tokens
        hit_blocks += best_blocks
        tokens += length
        blocks += len(keys)
    return hit_tokens / tokens, hit_blocks / blocks


def lcp_scan(sequences: list[list[int]], block: int) -> tuple[float, float]:
    """Longest common prefix with any earlier sequence, in whole blocks."""
    hit_tokens = hit_blocks = tokens = blocks = 0
    for i, sequence in enumerate(sequences):
        best = 0
        for earlier in sequences[:i]:
            n = 0
            while n < min(len(sequence), len(earlier)) and sequence[n] == earlier[n]:
                n += 1
            best = max(best, n)
        hit_tokens += best // block * block
        hit_blocks += best // block
        tokens += len(sequence)
        blocks += -(-len(sequence) // block)
    return hit_tokens / tokens, hit_blocks / blocks


def sequences(name: str, cap: int | None) -> list[list[int]]:
    if name == "tokens":
        data = sorted(rows(name), key=lambda row: int(row["arrival_time_ns"]))
        return [list(row["token_ids"]) for row in data if cap is None or int(row["input_toks"]) <= cap]
    out = []
    for row in sorted(rows(name), key=lambda row: float(row["timestamp"])):
        prompt = row["input"]
        text = prompt if isinstance(prompt, str) else "".join(f"{m['role']}: {m['content']}\n" for m in prompt)
        if cap is None or -(-len(text) // 4) <= cap:  # a text trace's lengths are characters / 4, rounded up
            out.append([ord(char) for char in text])
    return out


def reference(name: str, block: int, cap: int | None) -> tuple[float, float]:
    if name in ("tokens", "text"):
        return lcp_scan(sequences(name, cap), block)
    fine, prompts = hash_prompts(name)
    kept = [(ids, length) for ids, length in prompts if cap is None or length <= cap]
    return scan([coarse(ids, length, fine, block // fine) for ids, length in kept])


def stats(name: str, *extra: str) -> Row:
    done = kvbench("trace", "stats", str(agent_samples.path(name)), "--json", *extra, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    data: Row = json.loads(done.stdout)
    return data


def median_length(name: str) -> int:
    lengths: list[int] = [200]  # text: about the samples' median prompt in characters / 4
    if name == "bailian":
        lengths = [r["input_length"] for r in rows(name)]
    elif name == "claude-code":
        lengths = [c["in"] for row in rows(name) for c in row["requests"]]
    elif name == "tokens":
        lengths = [r["input_toks"] for r in rows(name)]
    return sorted(lengths)[len(lengths) // 2]


@pytest.mark.parametrize("name", agent_samples.SAMPLES)
def test_the_ceilings_match_a_naive_prefix_scan(name: str) -> None:
    for cap in (None, median_length(name)):
        data = stats(name, *(() if cap is None else ("--max-context", str(cap))))
        ceilings = data["ceilings"]
        assert isinstance(ceilings, dict)
        by_block = ceilings["by_block"]
        own = {"bailian": 16, "claude-code": 64, "tokens": 16, "text": 16}[name]
        assert [entry["block_tokens"] for entry in by_block] == [b for b in (16, 64, 256, 512) if b >= own]
        for entry in by_block:
            tokens, blocks = reference(name, entry["block_tokens"], cap)
            assert entry["token_hit_rate"] == pytest.approx(tokens, abs=0.01), (cap, entry)
            assert entry["block_hit_rate"] == pytest.approx(blocks, abs=0.01), (cap, entry)
        if cap is None:
            assert data["infinite_cache_hit_rate"] == pytest.approx(reference(name, own, None)[0], abs=0.01)
            assert data["infinite_cache_block_hit_rate"] == pytest.approx(reference(name, own, None)[1], abs=0.01)
            assert ceilings["excluded_calls"] == 0
        else:
            assert ceilings["max_context"] == cap and ceilings["excluded_calls"] > 0
    # a coarser block never hits more than a finer one (a coarse block hits only if all its fine blocks do)
    rates = [entry["token_hit_rate"] for entry in by_block]
    assert rates == sorted(rates, reverse=True)


def test_a_tier_large_enough_is_the_ceiling_and_a_small_one_is_below_it() -> None:
    big = stats("bailian", "--tier-tokens", "100000000")["ceilings"]
    small = stats("bailian", "--tier-tokens", "8000")["ceilings"]
    assert isinstance(big, dict) and isinstance(small, dict)
    ceiling = big["by_block"][0]["token_hit_rate"]
    assert big["tier_hit_rate"] == pytest.approx(ceiling)
    assert small["tier_hit_rate"] < ceiling - 0.1


def test_the_shape_of_the_bailian_sample() -> None:
    data = rows("bailian")
    parent = {row["chat_id"]: row["parent_chat_id"] for row in data}

    def depth(call: object) -> int:
        return 1 if parent[call] == -1 else 1 + depth(parent[call])

    shape = stats("bailian")["shape"]
    assert isinstance(shape, dict)
    assert shape["depth_max"] == max(depth(c) for c in parent)
    assert shape["roots"] == sum(1 for p in parent.values() if p == -1)
    children = [sum(1 for p in parent.values() if p == c) for c in parent]
    assert shape["children_max"] == max(children) and shape["branching_calls"] == sum(1 for c in children if c >= 2)
    assert shape["sessions"] == shape["roots"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--format", "bogus"), "--format 'bogus': allowed values are auto, mooncake, kvbench, bailian"),
        (("--max-context", "0"), "--max-context 0: must be a positive token count"),
    ],
)
def test_bad_stats_options_are_one_line(extra: tuple[str, ...], expected: str) -> None:
    stats_argv = ("trace", "stats", str(agent_samples.path("bailian")), *extra)
    done = kvbench(*stats_argv, cwd=REPO, timeout=120, env=kvbench_env(COLUMNS="400"))
    assert done.returncode != 0 and expected in done.stderr + done.stdout
