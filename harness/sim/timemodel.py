"""How long one engine step takes, from first principles (a roofline per step).

A step runs one forward pass over a batch that mixes prefill chunks and decode tokens. Its time is

    max(GPU, host) + store + intake + read,  GPU = max(compute, memory) + all-reduce,
    host = step overhead + host x sequences

Kernel launches are asynchronous, so the host prepares and launches a step's kernels while the GPU
runs earlier ones, and a step is as long as the slower of the two. Without CUDA graphs (vLLM's
``--enforce-eager``) the host part is large -- 16-17 ms per decode step of the 8B on one H100/H200,
56 ms for the 70B at TP=4 -- so a short step is host-bound while a long prefill chunk hides it.
(The additive form ``GPU + host`` fits held-out runs worse; docs/simulator.md has the table.)

* compute: the transformer layers cost ``2 x body_params`` FLOPs per token and the LM head
  ``2 x vocab x hidden`` per *sampled* token (the last prompt token, each decode token), at the
  FP8 peak for FP8 weights; causal attention costs ``4 x layers x heads x head_dim`` FLOPs per (query, key) pair
  -- QK^T and PV, two FLOPs per multiply-add each -- and a chunk of ``n`` new tokens after ``c``
  cached ones has ``n*c + n(n+1)/2`` pairs, which makes long prefills superlinear. Attention runs
  at the BF16 peak whatever the weight dtype (vLLM dequantises an FP8 KV cache in the kernel).
  Both divide by ``tp`` and by the achieved FLOP rate ``peak x mfu``.
* memory: every step streams this GPU's share of the weights once (all but the input embedding
  table, which is only indexed), plus the KV cache it reads
  (decode: the whole context of every sequence; prefill: the cached context and the new KV),
  at ``hbm_bandwidth x hbm_efficiency``.
* all-reduce (tp > 1): Megatron-style tensor parallelism all-reduces the hidden state twice per
  layer (after attention and after the MLP); each costs a latency plus the ring volume
  ``2(tp-1)/tp x tokens x hidden x 2 bytes`` at the NCCL bus bandwidth. vLLM does not overlap it
  with compute, so it adds.
* step overhead: scheduling, input preparation and kernel launches of one engine step (calibrated: plus the
  offload backend's ``step_extra_s``, its connector's own work in every step). A step that runs a prompt's
  prefill chunk may have its own (``Efficiencies.prefill_host_s``, calibrated where it binds): without CUDA
  graphs vLLM's prefill of a short prompt takes about as long whatever its length, about twice a decode
  step on the 8B, until the GPU's work outlasts it.
* host x sequences (calibrated only, ``step_s_per_seq``; 0 otherwise): host seconds per sequence the
  step runs (one per decode token, one per prefill chunk). Without CUDA graphs (vLLM's
  ``--enforce-eager``) the engine prepares inputs, samples and processes outputs in Python per
  running request, so this part grows with the batch; it is fitted from a sweep's inter-token gaps
  against the number of requests decoding at once.
* intake (calibrated only): the engine-blocking share of newly arrived requests' per-request
  overhead (prefix-block hashing of their prompts, connector lookups: CPU work in the engine's own
  process that stalls the step of every running request), plus the offload backend's
  ``busy_intake_s`` for a request that arrived while others were running, charged by the scheduler
  to the first step that starts after each request arrived (:attr:`StepWork.intake_s`).
* read (calibrated only, ``decode_s_per_ktoken``; 0 otherwise): seconds per 1,000 KV-cache tokens that the step's
  decode tokens attend to (the running sequences' contexts), added to the step. The GPU's memory part already
  reads them, but in eager mode on an idle engine the host's work hides it; under load it does not (on one H200,
  fitted on an agentic run: 0.072 ms per 1,000 tokens, 131 kB each at about 1.8 TB/s), so it is fitted on load
  runs' decode steps only (:func:`harness.calibrate.fit.fit_decode_read`).
* store (calibrated offload backends only): seconds per prefilled token that a backend such as
  LMCache blocks the step while it copies the new KV to its tier (``store_s_per_token``; 0 for
  the datasheet model, where tier writes run in the background after a request finishes), plus a
  fixed ``store_latency_s`` per request whose prefill the step completes (the backend's save path:
  looking up and hashing the request's chunks, allocating tier memory, synchronising the copy).

:class:`Efficiencies` replaces the datasheet efficiency factors with fitted ones (see
:mod:`harness.sim.calibration`): ``linear`` scales the GEMM peak, ``attention`` the attention
peak, ``hbm`` the HBM bandwidth; ``None`` keeps the hardware profile's value.

Everything is aggregated per step (tokens, attention pairs, KV tokens read), so the cost of the
bookkeeping does not grow with the number of blocks or the context length.
"""

from __future__ import annotations

from dataclasses import dataclass

from offload.shapes import Deployment

STEP_OVERHEAD_S = 1.0e-3
"""Per-step CPU work of a vLLM V1 engine step with CUDA graphs (about a millisecond)."""

ACTIVATION_BYTES = 2
"""Activations and all-reduce payloads stay 16-bit even with FP8 weights."""


@dataclass(frozen=True)
class Efficiencies:
    """Achieved fractions of peak (dimensionless) and per-step costs in seconds; None = the profile's."""

    linear: float | None = None
    """Fraction of the dtype's dense peak reached by the GEMMs (the profile's ``mfu`` if None)."""
    attention: float | None = None
    """Fraction of the BF16 dense peak reached by attention (the profile's ``mfu`` if None)."""
    hbm: float | None = None
    """Fraction of the HBM bandwidth reached by memory-bound steps (the profile's if None)."""
    step_overhead_s: float = STEP_OVERHEAD_S
    store_s_per_token: float = 0.0
    """Seconds a step is blocked per prefilled token while the offload backend stores its KV."""
    store_latency_s: float = 0.0
    """Seconds a step is blocked per request whose prefill it completes (the backend's per-request save cost)."""
    step_s_per_seq: float = 0.0
    """Host seconds per sequence in a step (eager mode's per-request Python work; 0: all in the overhead)."""
    prefill_host_s: float | None = None
    """Host seconds of a step that runs a prompt's prefill chunk, in place of ``step_overhead_s`` (None: the
    same as a decode step's). Eager mode's short-prompt floor: on one H200, vLLM 0.26.0 --enforce-eager
    took 42-43 ms per 8B prefill from 250 to 1,500 tokens (its own prefill histogram) against 17-21 ms
    per decode step."""
    step_extra_s: float = 0.0
    """The offload backend's own host seconds in every step, prefill or decode (its connector's bookkeeping)."""
    decode_s_per_ktoken: float = 0.0
    """Seconds per 1,000 KV-cache tokens that the step's decode tokens attend to, added to the step (eager
    mode's decode attention, not hidden behind the host's work; 0: the KV read only in the GPU's memory part)."""


@dataclass
class StepWork:
    """What one step computes, aggregated over the batch."""

    tokens: int = 0
    """New tokens run through the model (prefill chunk tokens + one per decoding sequence)."""
    sampled: int = 0
    """Tokens whose logits are computed (a prompt's last token, every decode token)."""
    attention_pairs: int = 0
    """Sum over new tokens of the number of keys each attends to (itself included)."""
    kv_tokens: int = 0
    """KV-cache tokens read or written by attention in this step."""
    prefill_tokens: int = 0
    """Prompt tokens computed in this step (what a blocking offload store copies out)."""
    prompts_done: int = 0
    """Requests whose prefill this step completes (each pays the backend's per-request store latency)."""
    sequences: int = 0
    """Sequences in the step: one per prefill chunk, one per decode token (each costs ``step_s_per_seq``)."""
    intake_s: float = 0.0
    """Seconds of engine-blocking intake work of newly arrived requests charged to this step."""
    decode_kv_tokens: int = 0
    """KV-cache tokens the step's decode tokens attend to (the running sequences' contexts)."""

    def add_prefill(self, new_tokens: int, cached_tokens: int, last: bool = True) -> None:
        """A prefill chunk of ``new_tokens`` after ``cached_tokens`` already in the KV cache.

        ``last``: the chunk ends the prompt, so its final token is sampled.
        """
        self.tokens += new_tokens
        self.prefill_tokens += new_tokens
        self.sampled += 1 if last else 0
        self.prompts_done += 1 if last else 0
        self.sequences += 1
        self.attention_pairs += new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
        self.kv_tokens += cached_tokens + new_tokens

    def add_decode(self, context_tokens: int) -> None:
        """One decode token whose sequence has ``context_tokens`` tokens in the KV cache."""
        self.tokens += 1
        self.sampled += 1
        self.sequences += 1
        self.attention_pairs += context_tokens + 1
        self.kv_tokens += context_tokens + 1
        self.decode_kv_tokens += context_tokens + 1


@dataclass(frozen=True)
class StepCost:
    """The parts of a step's time, in seconds (for tests and the ``profiles`` table)."""

    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float
    store_s: float = 0.0
    host_s: float = 0.0
    """Per-sequence host work (``step_s_per_seq`` x sequences)."""
    intake_s: float = 0.0
    """Engine-blocking intake work of newly arrived requests."""
    decode_read_s: float = 0.0
    """Decode attention's KV read that the step's other parts do not hide (``decode_s_per_ktoken``)."""

    @property
    def gpu_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.allreduce_s

    @property
    def total_s(self) -> float:
        # the host launches a step's kernels while the GPU runs earlier ones: the slower of the two binds
        return max(self.gpu_s, self.overhead_s + self.host_s) + self.store_s + self.intake_s + self.decode_read_s


class TimeModel:
    """Seconds per step for one deployment."""

    def __init__(self, deployment: Deployment, efficiencies: Efficiencies | None = None) -> None:
        self.deployment = deployment
        eff = efficiencies or Efficiencies()
        self.efficiencies = eff
        model, hw, tp = deployment.model, deployment.hardware, deployment.tp
        linear_flops = hw.peak_flops(deployment.dtype) * (eff.linear if eff.linear is not None else hw.mfu)
        attention_flops = hw.peak_bf16_flops * (eff.attention if eff.attention is not None else hw.mfu)
        self._linear_s_per_token = 2 * model.body_params / tp / linear_flops
        self._lm_head_s_per_sample = 2 * model.lm_head_params / tp / linear_flops
        self._attention_s_per_pair = 4 * model.layers * model.heads * model.head_dim / tp / attention_flops
        bandwidth = hw.hbm_bytes_per_s * (eff.hbm if eff.hbm is not None else hw.hbm_efficiency)
        self._weights_s = deployment.streamed_weight_bytes_per_gpu / bandwidth
        self._kv_s_per_token = deployment.kv_bytes_per_token_per_gpu / bandwidth
        if tp > 1:
            self._allreduce_fixed_s = 2 * model.layers * hw.allreduce_latency_s
            ring_bytes_per_token = 2 * (tp - 1) / tp * model.hidden_size * ACTIVATION_BYTES
            self._allreduce_s_per_token = 2 * model.layers * ring_bytes_per_token / hw.allreduce_bus_bytes_per_s
        else:
            self._allreduce_fixed_s = 0.0
            self._allreduce_s_per_token = 0.0
        self._overhead_s = eff.step_overhead_s + eff.step_extra_s
        prefill_host = eff.step_overhead_s if eff.prefill_host_s is None else eff.prefill_host_s
        self._prefill_overhead_s = prefill_host + eff.step_extra_s
        self._store_s_per_token = eff.store_s_per_token
        self._store_latency_s = eff.store_latency_s
        self._host_s_per_seq = eff.step_s_per_seq
        self._decode_s_per_kv_token = eff.decode_s_per_ktoken / 1000.0

    def cost(self, work: StepWork) -> StepCost:
        compute = (
            work.tokens * self._linear_s_per_token
            + work.sampled * self._lm_head_s_per_sample
            + work.attention_pairs * self._attention_s_per_pair
        )
        memory = self._weights_s + work.kv_tokens * self._kv_s_per_token
        allreduce = self._allreduce_fixed_s + work.tokens * self._allreduce_s_per_token if work.tokens else 0.0
        store = work.prefill_tokens * self._store_s_per_token + work.prompts_done * self._store_latency_s
        host = work.sequences * self._host_s_per_seq
        overhead = self._prefill_overhead_s if work.prefill_tokens else self._overhead_s
        read = work.decode_kv_tokens * self._decode_s_per_kv_token
        return StepCost(compute, memory, allreduce, overhead, store, host, work.intake_s, read)

    def step_seconds(self, work: StepWork) -> float:
        return self.cost(work).total_s

    def prefill_seconds(
        self, prompt_tokens: int, cached_tokens: int = 0, chunk_tokens: int = 8192, sample: bool = True
    ) -> float:
        """An unloaded prefill of ``prompt_tokens`` with ``cached_tokens`` already cached, chunked.

        ``sample=False``: the last chunk does not end the prompt (no LM head), as when only the
        head of a cached prefix is recomputed.
        """
        done = cached_tokens
        total = 0.0
        while done < prompt_tokens:
            work = StepWork()
            n = min(chunk_tokens, prompt_tokens - done)
            work.add_prefill(n, done, last=sample and done + n == prompt_tokens)
            total += self.step_seconds(work)
            done += n
        return total

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences, each with ``context_tokens`` of context."""
        work = StepWork()
        for _ in range(batch):
            work.add_decode(context_tokens)
        return self.step_seconds(work)
