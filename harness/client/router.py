"""Which replica of a fleet serves a request: the routing policies kvbench's client applies.

:class:`Router` picks a replica index for each request from the request's *routing key* (the
conversation it belongs to, set by the runner with :func:`routing_key`) and its prompt text:

* ``round_robin``: replicas in turn (request ``n`` goes to ``n mod N``);
* ``random``: uniformly at random (seeded);
* ``session_affinity``: consistent hashing of the routing key, so every turn of a conversation
  lands on the same replica (and heavy users make hot replicas); requests without a key go round robin;
* ``least_loaded``: the replica with the fewest requests in flight (ties: fewest sent, then lowest index);
* ``prefix_aware``: consistent hashing of the prompt's leading block hashes -- the first
  ``prefix_blocks`` blocks of ``block_chars`` characters each, hashed as a chain -- the way KV-aware
  routers approximate "the replica that holds this prefix". kvbench's client has text, not token
  ids, so blocks are characters (about 4 per token for English text);
* ``external``: a router kvbench does not control; every request goes to its URL (one client) and
  the serving replica is learnt afterwards, if at all (:data:`Attribution`).

Consistent hashing: each replica owns ``VNODES`` points on a 64-bit ring (BLAKE2b of
``"replica-i-v"``); a key goes to the first point at or after its own hash. Hashes are BLAKE2b, not
Python's ``hash``, so two processes (and two runs) route identically.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import hashlib
import random
from collections.abc import Iterator
from typing import Literal

Policy = Literal["round_robin", "random", "session_affinity", "least_loaded", "prefix_aware", "external"]
POLICIES: tuple[Policy, ...] = ("round_robin", "random", "session_affinity", "least_loaded", "prefix_aware", "external")
Attribution = Literal["header", "metrics", "none"]
"""How an external router's choice of replica is learnt (:class:`harness.client.fleet.FleetClient`)."""
ATTRIBUTIONS: tuple[Attribution, ...] = ("header", "metrics", "none")
VNODES = 64
"""Ring points per replica: with 64 the share of keys per replica is within a few % of 1/N."""

_ROUTING_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvbench_routing_key", default=None)


@contextlib.contextmanager
def routing_key(key: str | None) -> Iterator[None]:
    """Requests sent inside this block belong to conversation ``key`` (session affinity, ``moved``).

    A context variable rather than a parameter, so the request path (probe, load runner, client
    pool protocol) keeps one signature whether it talks to one engine or a fleet.
    """
    token = _ROUTING_KEY.set(key)
    try:
        yield
    finally:
        _ROUTING_KEY.reset(token)


def current_routing_key() -> str | None:
    return _ROUTING_KEY.get()


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing of keys onto ``replicas`` replicas (``VNODES`` points each)."""

    def __init__(self, replicas: int) -> None:
        points = sorted((stable_hash(f"replica-{r}-{v}"), r) for r in range(replicas) for v in range(VNODES))
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]

    def owner(self, key_hash: int) -> int:
        index = bisect.bisect_left(self._hashes, key_hash)
        return self._owners[index % len(self._owners)]


def prefix_hash(text: str, block_chars: int, blocks: int) -> int:
    """Chain hash of the first ``blocks`` full blocks of ``block_chars`` characters (all of a shorter text)."""
    parent = 0
    usable = min(blocks, max(1, len(text) // block_chars))
    for index in range(usable):
        parent = stable_hash(f"{parent}:{text[index * block_chars : (index + 1) * block_chars]}")
    return parent


class Router:
    """Picks a replica per request (see the module docstring); tracks in-flight counts."""

    def __init__(
        self, policy: Policy, replicas: int, *, seed: int = 0, block_chars: int = 1024, prefix_blocks: int = 4
    ) -> None:
        if replicas < 1:
            raise ValueError(f"a fleet needs at least one replica, got {replicas}")
        self.policy = policy
        self.replicas = replicas
        self.block_chars = block_chars
        self.prefix_blocks = prefix_blocks
        self.in_flight = [0] * replicas
        self.sent = [0] * replicas
        self._next = 0
        self._random = random.Random(seed)
        self._ring = HashRing(replicas)

    def pick(self, key: str | None, prompt: str) -> int:
        """The replica for a request of conversation ``key`` with prompt text ``prompt``."""
        if self.replicas == 1 or self.policy == "external":
            return 0
        if self.policy == "random":
            return self._random.randrange(self.replicas)
        if self.policy == "session_affinity" and key is not None:
            return self._ring.owner(stable_hash(key))
        if self.policy == "prefix_aware":
            return self._ring.owner(prefix_hash(prompt, self.block_chars, self.prefix_blocks))
        if self.policy == "least_loaded":
            return min(range(self.replicas), key=lambda r: (self.in_flight[r], self.sent[r], r))
        choice = self._next % self.replicas  # round_robin, and session_affinity without a key
        self._next += 1
        return choice

    def started(self, replica: int) -> None:
        self.in_flight[replica] += 1
        self.sent[replica] += 1

    def finished(self, replica: int) -> None:
        self.in_flight[replica] -= 1
