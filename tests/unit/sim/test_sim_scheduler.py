"""The simulated engine core on a virtual clock: batching, prefix caching, memory, tiers."""

from __future__ import annotations

import pytest

from harness.sim.scheduler import EngineCore, Event, FinishEvent, Phase, SimRequest, TokenEvent
from harness.sim.settings import SimSettings
from offload.profiles import BUILTIN_PROFILES, OffloadProfile, OffloadTier


def make_core(offload: str | OffloadProfile = "hbm", **overrides: object) -> EngineCore:
    profile = BUILTIN_PROFILES[offload] if isinstance(offload, str) else offload
    fields: dict[str, object] = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "offload": profile}
    fields.update(overrides)
    return EngineCore(SimSettings.model_validate(fields))


class Client:
    """Collects a request's events."""

    def __init__(self, core: EngineCore, prompt: list[int], max_tokens: int = 4, name: str = "r") -> None:
        self.events: list[Event] = []
        self.request = SimRequest(name, prompt, max_tokens, self.events.append)
        self.core = core

    def submit(self, now: float) -> Client:
        self.core.add_request(self.request, now)
        return self

    @property
    def tokens(self) -> int:
        return sum(isinstance(e, TokenEvent) for e in self.events)

    @property
    def finish(self) -> FinishEvent:
        last = self.events[-1]
        assert isinstance(last, FinishEvent)
        return last

    @property
    def ttft(self) -> float:
        assert self.request.first_token_at is not None
        return self.request.first_token_at - self.request.arrival


def run(core: EngineCore, now: float = 0.0, max_steps: int = 100_000) -> float:
    """Run steps until the engine is idle; returns the virtual time it ends at."""
    for _ in range(max_steps):
        if not core.has_work:
            return now
        plan = core.plan(now)
        if plan is None:
            wakeup = core.next_wakeup()
            assert wakeup is not None and wakeup > now, "nothing runnable and nothing loading"
            now = wakeup
            continue
        assert plan.work.tokens <= core.settings.max_batch_tokens
        now += plan.seconds
        core.complete(plan, now)
    raise AssertionError("the engine did not go idle")


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 + 16 for i in range(n)]


def test_single_request_ttft_is_the_chunked_prefill_time() -> None:
    core = make_core()
    client = Client(core, prompt(20_000), max_tokens=3).submit(0.0)
    end = run(core)
    assert client.tokens == 3
    assert client.finish.usage.prompt_tokens == 20_000 and client.finish.usage.completion_tokens == 3
    assert client.ttft == pytest.approx(core.time_model.prefill_seconds(20_000, chunk_tokens=8192))
    assert end > client.ttft
    assert core.stats.steps == 3 + 2  # three prefill chunks, two decode steps
    assert core.pool.used == 0


def test_concurrent_requests_share_steps() -> None:
    alone = make_core()
    Client(alone, prompt(1000), max_tokens=50).submit(0.0)
    one = run(alone)
    core = make_core()
    clients = [Client(core, prompt(1000, seed=s), max_tokens=50, name=f"r{s}").submit(0.0) for s in range(8)]
    together = run(core)
    assert all(c.tokens == 50 for c in clients)
    assert together < 3 * one  # 8 requests decode in the same steps, not 8x the time
    assert core.stats.steps < 8 * alone.stats.steps


def test_hbm_prefix_cache_hits_the_second_time() -> None:
    core = make_core()
    first = Client(core, prompt(5000), max_tokens=2).submit(0.0)
    end = run(core)
    second = Client(core, prompt(5000), max_tokens=2).submit(end)
    run(core, end)
    assert first.finish.usage.cached_tokens == 0
    assert second.finish.usage.cached_tokens == 4992  # full blocks below the last token
    assert second.ttft < first.ttft / 10
    assert core.stats.prefix_cache_queries == 10_000 and core.stats.prefix_cache_hits == 4992


def test_reset_and_disabled_prefix_cache() -> None:
    core = make_core()
    Client(core, prompt(5000), max_tokens=2).submit(0.0)
    end = run(core)
    core.reset_prefix_cache()
    again = Client(core, prompt(5000), max_tokens=2).submit(end)
    run(core, end)
    assert again.finish.usage.cached_tokens == 0

    off = make_core("off")
    Client(off, prompt(5000), max_tokens=2).submit(0.0)
    end = run(off)
    repeat = Client(off, prompt(5000), max_tokens=2).submit(end)
    run(off, end)
    assert repeat.finish.usage.cached_tokens == 0 and off.stats.prefix_cache_queries == 0
    forced_off = make_core("hbm", prefix_caching=False)
    assert not forced_off.pool.caching


def test_requests_wait_when_hbm_is_short() -> None:
    core = make_core(num_gpu_blocks_override=300)  # 4800 tokens of KV
    assert core.kv_cache_tokens == 4800 and core.max_model_len == 4800
    first = Client(core, prompt(3000), max_tokens=8, name="a").submit(0.0)
    second = Client(core, prompt(3000, seed=1), max_tokens=8, name="b").submit(0.0)
    plan = core.plan(0.0)
    assert plan is not None
    assert core.num_running == 1 and core.num_waiting == 1
    core.complete(plan, plan.seconds)
    run(core, plan.seconds)
    assert first.tokens == 8 and second.tokens == 8
    assert second.ttft > first.ttft + core.time_model.prefill_seconds(3000) * 0.9  # queued behind it
    with pytest.raises(ValueError, match="maximum context length"):
        Client(core, prompt(4795), max_tokens=8).submit(0.0)


def test_decode_growth_preempts_the_newest_request() -> None:
    core = make_core(num_gpu_blocks_override=300)
    capacity = core.kv_cache_tokens
    clients = [
        Client(core, prompt(capacity // 2 - 200, seed=s), max_tokens=1000, name=f"r{s}").submit(0.0) for s in range(2)
    ]
    run(core)
    assert core.stats.preemptions >= 1
    assert all(c.tokens == 1000 for c in clients)  # the preempted one was recomputed and finished
    assert core.pool.used == 0


def test_cpu_tier_serves_after_reset_once_written() -> None:
    core = make_core("cpu")
    cold = Client(core, prompt(8000), max_tokens=2).submit(0.0)
    end = run(core)
    core.reset_prefix_cache()
    # immediately after completion the background write is still going: at most a partial hit
    early = Client(core, prompt(8000), max_tokens=2).submit(end)
    run(core, end)
    assert early.finish.usage.cached_tokens < 7936
    core.reset_prefix_cache()
    later = Client(core, prompt(8000), max_tokens=2).submit(end + 5.0)
    run(core, end + 5.0)
    assert later.finish.usage.cached_tokens == 7936  # 31 chunks of 256 tokens
    load = 7936 * core.deployment.kv_bytes_per_token / 25e9 + 10e-6  # cpu tier: 25 GB/s, 10 us
    rest = core.time_model.prefill_seconds(8000, 7936)
    assert later.ttft == pytest.approx(load + rest, rel=1e-6)
    assert later.ttft < cold.ttft / 3
    assert core.stats.external_hits >= 7936 and core.stats.external_queries == 3 * 8000


def test_loading_request_does_not_block_others() -> None:
    core = make_core("cpu")
    Client(core, prompt(8000), max_tokens=1).submit(0.0)
    end = run(core) + 5.0
    core.reset_prefix_cache()
    loader = Client(core, prompt(8000), max_tokens=1, name="loader").submit(end)
    other = Client(core, prompt(100, seed=9), max_tokens=1, name="other").submit(end)
    plan = core.plan(end)
    assert plan is not None and loader.request.phase is Phase.LOADING
    assert [r.request_id for r, _ in plan.prefills] == ["other"]
    run(core, end)
    assert other.ttft < loader.ttft


def test_a_finished_load_is_due_at_its_end_not_when_the_loop_woke() -> None:
    """A real-time engine loop wakes late on a busy host; the step after a load starts at the load's end."""
    core = make_core("cpu")
    Client(core, prompt(8000), max_tokens=1).submit(0.0)
    end = run(core) + 5.0
    core.reset_prefix_cache()
    loader = Client(core, prompt(8000), max_tokens=1).submit(end)
    assert core.plan(end) is None and loader.request.phase is Phase.LOADING
    ready = core.next_wakeup()
    assert ready is not None and ready > end
    assert core.overdue_since(ready - 1e-6) is None  # not finished yet: nothing to backdate
    assert core.overdue_since(ready + 0.003) == pytest.approx(ready)
    assert core.settings.calibration is None  # loads are backdated on any engine, not only calibrated ones


def test_eviction_writes_chunks_the_tiers_lost() -> None:
    tiny_cpu = OffloadProfile(name="tiny-cpu", tiers=(OffloadTier(kind="cpu", capacity_gb=0.04),))  # 1 chunk
    core = make_core(tiny_cpu, num_gpu_blocks_override=300)
    Client(core, prompt(1024), max_tokens=1).submit(0.0)
    end = run(core)
    cpu = core.tiers.tiers[0]
    assert cpu.capacity_chunks == 1 and cpu.evictions == 3  # 4 chunks written, 3 pushed out
    written = cpu.bytes_written
    # A big request evicts 58 of the 64 cached blocks from HBM, among them the blocks that end
    # chunks 0-3: chunk 3 is still in the tier, chunks 0-2 are written again. Then the big
    # request's own 18 chunks are written when it completes.
    Client(core, prompt(4700, seed=5), max_tokens=1).submit(end)
    run(core, end)
    assert core.pool.evictions == 58
    assert cpu.bytes_written == written + (3 + 18) * core.tiers.chunk_bytes


def test_abort_frees_blocks() -> None:
    core = make_core()
    client = Client(core, prompt(20_000), max_tokens=5).submit(0.0)
    plan = core.plan(0.0)
    assert plan is not None and core.pool.used > 0
    core.abort(client.request)
    core.complete(plan, plan.seconds)
    assert core.pool.used == 0 and not core.has_work and client.events == []
