"""Writes the four bundled agent-trace samples (``workloads/data/sample-*.jsonl``): synthetic, seeded, with branching.

Run ``python3 -m tests.unit.workloads.agent_samples`` from the repository root to rewrite them;
``test_agent_trace.py`` checks that the shipped files are exactly what this writes.

* bailian (16-token blocks): 8 sessions of 5 calls sharing a 640-token system prompt; each session a tree
  root → c1 → {c2 → c3, b1} (c1 has two children), a child resending its parent's whole blocks plus new ones.
* claude-code (64-token blocks): 3 conversations; ``c-main`` (global ids) runs two concurrent subagents
  (``agent`` a1, a2) after its second normal call and a side call; ``c-scoped`` (conversation-scoped ids)
  one unnamed subagent chain and a side call; ``c-other`` (global ids) shares ``c-main``'s system blocks.
* tokens: 4 sessions of 5 turns (a 50-token shared system prefix; session ``s3`` forks ``s0``'s first turn).
* text: 3 sessions of 5 calls, strings and message lists, growing prompts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parents[3] / "workloads" / "data"
SAMPLES = ("bailian", "claude-code", "tokens", "text")


def bailian() -> list[dict[str, object]]:
    rng = random.Random(35)
    next_id = 1000
    system = list(range(1, 41))
    rows: list[dict[str, object]] = []

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    for session in range(8):
        _bailian_session(session, rng, fresh, system, rows)
    rows.sort(key=lambda row: float(row["timestamp"]))  # type: ignore[arg-type]
    return rows


def _bailian_session(
    session: int,
    rng: random.Random,
    fresh: Callable[[int], list[int]],
    system: list[int],
    rows: list[dict[str, object]],
) -> None:
    """One session's tree root → c1 → {c2 → c3, b1}, starting at 4 s × session."""
    block = 16
    start = session * 4.0
    calls: dict[str, tuple[list[int], float]] = {}

    def add(name: str, parent: str | None, ids: list[int], t: float, turn: int) -> None:
        input_length = len(ids) * block - rng.randrange(0, 12)
        rows.append(
            {
                "chat_id": f"{session}-{name}",
                "parent_chat_id": -1 if parent is None else f"{session}-{parent}",
                "timestamp": round(t, 3),
                "input_length": input_length,
                "output_length": rng.randrange(8, 40),
                "type": "text",
                "turn": turn,
                "hash_ids": ids,
            }
        )
        calls[name] = (ids, t)

    def child(parent: str) -> list[int]:
        ids, _ = calls[parent]
        return ids[:-1] + fresh(rng.randrange(20, 45))  # the parent's whole blocks, then new ones

    add("root", None, system + fresh(260), start, 1)
    add("c1", "root", child("root"), start + rng.uniform(3, 6), 2)
    add("c2", "c1", child("c1"), calls["c1"][1] + rng.uniform(3, 6), 3)
    add("b1", "c1", child("c1"), calls["c1"][1] + rng.uniform(1, 5), 3)
    add("c3", "c2", child("c2"), calls["c2"][1] + rng.uniform(3, 6), 4)


def claude_code() -> list[dict[str, object]]:
    rng = random.Random(36)
    block = 64
    counter = [5000]

    def fresh(count: int) -> list[int]:
        ids = list(range(counter[0], counter[0] + count))
        counter[0] += count
        return ids

    system = list(range(1, 9))

    def call(t: float, ids: list[int], kind: str, agent: str | None = None) -> dict[str, object]:
        row: dict[str, object] = {
            "t": round(t, 3),
            "in": len(ids) * block - rng.randrange(0, 40),
            "out": rng.randrange(10, 60),
            "hash_ids": ids,
            "type": kind,
        }
        if agent is not None:
            row["agent"] = agent
        return row

    # c-main: normal n0..n4; after n1 two concurrent subagents of 3 calls each; a side call after n2
    main: list[dict[str, object]] = []
    n = system + fresh(6)
    t = 0.0
    main.append(call(t, n, "normal"))
    t += 2.0
    n = n + fresh(3)
    main.append(call(t, n, "normal"))
    agents = {name: system + fresh(4) for name in ("a1", "a2")}
    for _ in range(3):
        for name in ("a1", "a2"):
            t += 0.5
            main.append(call(t, agents[name], "subagent", name))
            agents[name] = agents[name] + fresh(2)
    t += 1.0
    n = n + fresh(3)
    main.append(call(t, n, "normal"))
    t += 0.2
    main.append(call(t, n[:5] + fresh(1), "side"))
    for _ in range(2):
        t += 2.0
        n = n + fresh(3)
        main.append(call(t, n, "normal"))

    # c-scoped: its ids are its own (scope conversation); one unnamed subagent chain; a side call
    scoped: list[dict[str, object]] = []
    local = list(range(1, 11))
    t = 1.0
    for step in range(4):
        scoped.append(call(t, local, "normal"))
        if step == 1:
            sub = local[:3] + list(range(100, 104))
            for _ in range(3):
                t += 0.6
                scoped.append(call(t, sub, "subagent"))
                sub = sub + list(range(sub[-1] + 1, sub[-1] + 3))
            t += 0.1
            scoped.append(call(t, [*local[:4], 900], "side"))
        t += 2.5
        local = local + list(range(local[-1] + 1, local[-1] + 4))

    other: list[dict[str, object]] = []
    o = system + fresh(5)
    t = 3.0
    for _ in range(5):
        other.append(call(t, o, "normal"))
        t += 1.5
        o = o + fresh(2)

    return [
        {"id": "c-main", "block_size": block, "hash_id_scope": "global", "requests": main},
        {"id": "c-scoped", "block_size": block, "hash_id_scope": "conversation", "requests": scoped},
        {"id": "c-other", "block_size": block, "hash_id_scope": "global", "requests": other},
    ]


def tokens() -> list[dict[str, object]]:
    rng = random.Random(37)
    system = [rng.randrange(100, 30000) for _ in range(50)]
    prompts: dict[str, list[int]] = {}
    rows: list[dict[str, object]] = []
    for turn in range(5):
        for index in range(4):
            session = f"s{index}"
            if turn == 0:
                prompt = list(prompts["s0"]) if index == 3 else system + [rng.randrange(100, 30000) for _ in range(40)]
            else:
                answer = [rng.randrange(100, 30000) for _ in range(rng.randrange(10, 30))]
                prompt = prompts[session] + answer + [rng.randrange(100, 30000) for _ in range(rng.randrange(15, 40))]
            prompts[session] = prompt
            rows.append(
                {
                    "session_id": session,
                    "turn_idx": turn,
                    "input_toks": len(prompt),
                    "output_toks": rng.randrange(10, 30),
                    "arrival_time_ns": (turn * 4 + index) * 700_000_000,
                    "token_ids": prompt,
                }
            )
    return rows


def text() -> list[dict[str, object]]:
    rng = random.Random(38)
    words = ["cache", "block", "agent", "tool", "prefix", "token", "engine", "tier", "offload", "reuse"]

    def sentence(count: int) -> str:
        return " ".join(rng.choice(words) for _ in range(count)) + "."

    system = "You are a coding agent. " + sentence(40)
    rows: list[dict[str, object]] = []
    prompts: dict[str, str] = {"t0": system, "t2": system}
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    t = 0.0
    for _ in range(5):
        for session in ("t0", "t1", "t2"):
            answer = sentence(rng.randrange(5, 15))
            question = sentence(rng.randrange(8, 20))
            row: dict[str, object] = {"session_id": session, "timestamp": round(t, 3)}
            if session == "t1":
                messages = [*messages, {"role": "user", "content": question}]
                row["input"] = messages
                messages = [*messages, {"role": "assistant", "content": answer}]
            else:
                prompts[session] = prompts[session] + "\nUser: " + question
                row["input"] = prompts[session]
                prompts[session] = prompts[session] + "\nAssistant: " + answer
            row["output"] = answer
            rows.append(row)
            t += 0.9
    return rows


def render(name: str) -> str:
    rows = {"bailian": bailian, "claude-code": claude_code, "tokens": tokens, "text": text}[name]()
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


def path(name: str) -> Path:
    return DATA / f"sample-{name}.jsonl"


if __name__ == "__main__":
    for name in SAMPLES:
        path(name).write_text(render(name), encoding="utf-8")
        print(path(name))
