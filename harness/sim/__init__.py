"""The built-in engine simulator: an OpenAI-compatible server whose latencies come from physics.

It answers the same HTTP API a vLLM server does (chat and text completions with streaming and
usage, ``/tokenize``, ``/reset_prefix_cache``, ``/metrics`` with vLLM's metric names), but instead
of running a model it *sleeps the modelled duration* of every engine step: prefill from FLOPs,
decode from bytes read, a paged HBM KV-cache with prefix caching, and offload tiers with capacity
and bandwidth. It exists for what-if planning ("what does a CPU tier buy Llama-3.1-70B at 128k?")
and for demos and CI on machines without a GPU.

Modules, from the bottom up:

* :mod:`.profiles` -- model and hardware figures (with sources) and a resolved :class:`Deployment`.
* :mod:`.timemodel` -- seconds per engine step from FLOPs, bytes and all-reduces.
* :mod:`.tokenizer` -- a deterministic, exactly reversible word-level tokenizer and chat template.
* :mod:`.kvcache` -- the HBM block pool with prefix caching, and the offload tiers.
* :mod:`.scheduler` -- continuous batching with chunked prefill (a pure state machine) and the
  asyncio loop that drives it in real time.
* :mod:`.settings` -- the JSON settings a server is started with.
* :mod:`.server` -- the aiohttp application; :mod:`.cli` -- ``kvbench sim serve|profiles``.
"""

from harness.client.scrape import VLLM
from harness.engines.kinds import EngineKind, register

from .config import SimEngineConfig
from .engine import SimEngine
from .fleet import shared_tier
from .power import simulated_power

register(
    EngineKind(
        "sim",
        SimEngineConfig,
        SimEngine,
        None,
        VLLM,
        "kvbench simulator",
        simulated=True,
        fleet_shared_tier=shared_tier,
        names_replica=True,
        power=simulated_power,
    )
)
