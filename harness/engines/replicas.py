"""Fleet fields of every engine kind's ``engine:`` section: how many replicas, on which GPUs.

A *fleet* is ``N`` replicas of one engine deployment, each its own process on its own GPUs, port and
log (:mod:`harness.engines.fleet` starts them). Every engine config model inherits
:class:`ReplicaFields`:

* ``replicas: N`` (default 1) -- the canonical spelling. ``parallelism.replicas`` (older scenarios,
  where it only counted GPUs) is accepted as an alias: giving both with different values is an error.
* ``gpus_per_replica`` (default ``tp × pp × dp``) -- GPUs one replica uses; at least ``tp × pp × dp``.
* ``gpus`` -- the GPU ids of the host to hand out: replica ``i`` gets
  ``gpus[i·g : (i+1)·g]`` (``g`` = gpus_per_replica) as ``CUDA_VISIBLE_DEVICES``, so replicas share a
  host without sharing a GPU. Its length must be ``replicas × gpus_per_replica``. Without it the
  engines inherit the parent's ``CUDA_VISIBLE_DEVICES`` (fine for one replica, or for CPU engines).

:meth:`ReplicaFields.replica_config` gives the single-replica config replica ``i`` starts with
(port ``port + i`` when a port is fixed, its ``CUDA_VISIBLE_DEVICES`` in ``env``); kinds with other
per-replica facts (``openai``: one URL per replica) override it.
"""

from __future__ import annotations

from typing import Protocol, Self

from pydantic import Field, model_validator

from common.schema import StrictModel
from harness.client.router import ATTRIBUTIONS, POLICIES, Attribution, Policy

from .routers import RouterSpec


class _Parallel(Protocol):
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def replicas(self) -> int: ...


class ReplicaFields(StrictModel):
    """``replicas``, ``gpus_per_replica`` and ``gpus`` of an ``engine:`` section (see the module docstring)."""

    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Engine replicas, each its own process on its own GPUs, port and log (default 1; "
        "parallelism.replicas is an alias).",
    )
    gpus_per_replica: int | None = Field(default=None, ge=1, description="GPUs one replica uses; default tp × pp × dp.")
    gpus: list[int] | None = Field(
        default=None,
        description="GPU ids to hand out: replica i gets gpus[i*g:(i+1)*g] as CUDA_VISIBLE_DEVICES "
        "(g = gpus_per_replica); length replicas × gpus_per_replica.",
    )

    def _parallel(self) -> _Parallel:
        parallel: _Parallel = getattr(self, "parallelism")  # noqa: B009 - every engine config has one
        return parallel

    @model_validator(mode="after")
    def _fleet_consistent(self) -> Self:
        alias = self._parallel().replicas
        if self.replicas is not None and alias != 1 and alias != self.replicas:
            raise ValueError(
                f"replicas ({self.replicas}) and its alias parallelism.replicas ({alias}) disagree; set one"
            )
        per_deployment = self._parallel().tp * self._parallel().pp * self._parallel().dp
        if self.gpus_per_replica is not None and self.gpus_per_replica < per_deployment:
            raise ValueError(f"gpus_per_replica ({self.gpus_per_replica}) is less than tp × pp × dp ({per_deployment})")
        if self.gpus is not None:
            want = self.fleet_size * self.replica_gpus
            if len(self.gpus) != want:
                raise ValueError(f"gpus lists {len(self.gpus)} ids; replicas × gpus_per_replica = {want}")
            if len(set(self.gpus)) != len(self.gpus) or min(self.gpus) < 0:
                raise ValueError(f"gpus must be distinct non-negative GPU ids, got {self.gpus}")
        return self

    @property
    def fleet_size(self) -> int:
        """Replicas in the fleet (``replicas``, else its alias ``parallelism.replicas``)."""
        return self.replicas if self.replicas is not None else self._parallel().replicas

    @property
    def replica_gpus(self) -> int:
        """GPUs per replica."""
        parallel = self._parallel()
        return self.gpus_per_replica or parallel.tp * parallel.pp * parallel.dp

    @property
    def fleet_gpus(self) -> int:
        """GPUs of the whole fleet (the denominator of RPS per GPU)."""
        return self.fleet_size * self.replica_gpus

    def visible_devices(self, index: int) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` of replica ``index`` (None: inherit the parent's)."""
        if self.gpus is None:
            return None
        size = self.replica_gpus
        return ",".join(str(gpu) for gpu in self.gpus[index * size : (index + 1) * size])

    def replica_config(self, index: int) -> Self:
        """The one-replica config replica ``index`` starts with: its port and GPUs, no fleet fields."""
        if not 0 <= index < self.fleet_size:
            raise IndexError(f"replica {index} of a fleet of {self.fleet_size}")
        parallelism = getattr(self, "parallelism")  # noqa: B009 - every engine config has one
        update: dict[str, object] = {
            "replicas": None,
            "gpus": None,
            "gpus_per_replica": None,
            "parallelism": parallelism.model_copy(update={"replicas": 1}),
        }
        fields = type(self).model_fields
        port = getattr(self, "port", None)
        if "port" in fields and isinstance(port, int):
            update["port"] = port + index
        devices = self.visible_devices(index)
        if devices is not None and "env" in fields:
            env: dict[str, str] = dict(getattr(self, "env"))  # noqa: B009
            env["CUDA_VISIBLE_DEVICES"] = devices
            update["env"] = env
        return self.model_copy(update=update)


class RoutingSpec(StrictModel):
    """The scenario's ``routing:`` section: how a fleet's requests are spread over its replicas.

    ``policy`` is one of :data:`harness.client.router.POLICIES` (that module says what each does).
    ``external`` sends everything to a router that picks the replica itself: either one kvbench
    starts per arm in front of the replicas it started (``router``, :mod:`harness.engines.routers`)
    or one already running at ``engine.base_url`` (kind ``openai``). ``attribution`` says how kvbench
    then learns which replica served a request: ``header`` (the router names it in the response
    header ``replica_header``), ``metrics`` (the one replica whose ``/metrics`` prompt-token counter
    moved while that request was the only one in flight; concurrent requests stay unattributed), or
    ``none``. Default: ``header`` when ``replica_header`` is set, else ``metrics``.
    """

    policy: Policy = Field(default="round_robin", description=f"One of: {', '.join(POLICIES)}.")
    block_chars: int = Field(
        default=1024, ge=16, description="prefix_aware: characters per prompt block hashed (≈ 4 per token)."
    )
    prefix_blocks: int = Field(default=4, ge=1, description="prefix_aware: leading blocks whose chain hash is routed.")
    seed: int = Field(default=0, description="random: seed of the replica draws.")
    replica_header: str | None = Field(
        default=None,
        description="external: the response header naming the serving replica (an endpoint's name, or its index).",
    )
    router: RouterSpec | None = Field(
        default=None, description="external: a router kvbench starts in front of the replicas (kind, policy, ...)."
    )
    attribution: Attribution | None = Field(
        default=None,
        description=f"external: how the serving replica is found: {' | '.join(ATTRIBUTIONS)} "
        "(default: header with replica_header, else metrics).",
    )

    @model_validator(mode="after")
    def _external_fields(self) -> Self:
        if self.policy != "external" and (self.router is not None or self.attribution is not None):
            raise ValueError(f"router and attribution apply to policy 'external' only, not {self.policy!r}")
        if self.attribution == "header" and self.replica_header is None:
            raise ValueError("attribution 'header' needs replica_header: the response header naming the replica")
        return self

    @property
    def attributed_by(self) -> Attribution:
        """How an external router's choice is learnt (see the class docstring)."""
        if self.attribution is not None:
            return self.attribution
        return "header" if self.replica_header is not None else "metrics"


class PrometheusSpec(StrictModel):
    """Read per-replica counters from a Prometheus server instead of scraping each replica.

    At every point where kvbench would scrape (before and after a turn, a load point, a soak
    interval) it asks ``url``'s HTTP API for each cache counter's current value per replica
    (``sum by (<replica_label>) (<counter>{<selector>})``, an instant query). Values lag the engines
    by up to one scrape interval of that server, so windows should be long against it.
    """

    url: str = Field(description="Base URL of the Prometheus server, e.g. http://prometheus:9090.")
    replica_label: str = Field(default="instance", description="The label that names a replica (its target).")
    replicas: list[str] = Field(
        min_length=1, description="The replica label's value for each replica, in replica order."
    )
    selector: str = Field(default="", description='Extra PromQL label matchers, e.g. job="vllm".')
    timeout_s: float = Field(default=10.0, gt=0)
