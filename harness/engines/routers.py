"""Routers kvbench starts in front of a fleet (``routing.router``): the scenario field and the kinds table.

With ``routing: {policy: external, router: {kind: vllm-router, policy: consistent_hash}}`` kvbench
starts the fleet's replicas, then ONE router process per arm pointed at them
(:mod:`harness.engines.router_process`), and sends every request to the router. The router, not
kvbench, picks the replica. What differs per router kind is one row of :data:`ROUTER_KINDS`:

* ``module``: started as ``<python> -m <module>`` (a console script may be missing, e.g. in a
  ``--target`` install), ``python`` from the scenario or ``$KVBENCH_ROUTER_PYTHON``;
* ``distribution``: the pip distribution whose version the manifest records;
* ``policies``: the values its policy flag accepts (checked when the scenario loads);
* ``session_header``: the request header its session-affine policy hashes; kvbench sends the
  conversation id in it, so every turn of a conversation carries the same key;
* ``argv``: the flags that bind it to ``127.0.0.1:<port>``, expose its Prometheus page on a second
  free port, list the replicas and set the policy; ``extra_args`` follow verbatim.

``vllm-router`` is PyPI's ``vllm-router`` (0.1.x: the Rust router of github.com/vllm-project/router,
derived from SGLang's router; not the production-stack router, whose flags are
``--static-backends``/``--routing-logic``). Its ``consistent_hash`` policy keys on the
``X-Session-ID`` header first. Its ``cache_aware`` policy keeps a character prefix tree per worker:
a prompt whose longest match in a worker's tree exceeds ``--cache-threshold`` (0.3 of its characters)
goes there, otherwise to the worker with the fewest requests in flight, which also wins outright when
the loads are imbalanced (max - min > ``--balance-abs-threshold`` and max > min x
``--balance-rel-threshold``); it logs its decisions only at ``--log-level debug`` (``extra_args``).
It names the serving replica in no header of its own but forwards its workers' response headers, so
kvbench attributes requests by the ``X-Kvbench-Replica`` header its simulator and vLLM replicas add
(:mod:`harness.engines.kvbench_replica_header`; :func:`harness.runs.fleet.attributing`), and from
per-replica ``/metrics`` deltas for replicas that name nothing (:mod:`harness.client.fleet`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Self

from pydantic import Field, model_validator

from common.schema import StrictModel

ROUTER_PYTHON_ENV = "KVBENCH_ROUTER_PYTHON"
"""The python of the router's own virtualenv when ``routing.router.python`` is not set."""

RouterKindName = Literal["vllm-router"]


@dataclass(frozen=True)
class RouterLaunch:
    """What a router's command line is built from."""

    python: str
    port: int
    metrics_port: int
    worker_urls: tuple[str, ...]
    policy: str
    extra_args: tuple[str, ...] = ()


def _vllm_router_argv(module: str, launch: RouterLaunch) -> tuple[str, ...]:
    return (
        *(launch.python, "-m", module),
        *("--host", "127.0.0.1", "--port", str(launch.port)),
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(launch.metrics_port)),
        *("--worker-urls", *launch.worker_urls),
        *("--policy", launch.policy),
        *launch.extra_args,
    )


@dataclass(frozen=True)
class RouterKind:
    kind: str
    label: str
    module: str
    distribution: str
    policies: tuple[str, ...]
    session_header: str
    build_argv: Callable[[str, RouterLaunch], tuple[str, ...]]
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def argv(self, launch: RouterLaunch) -> tuple[str, ...]:
        return self.build_argv(self.module, launch)


ROUTER_KINDS: Mapping[str, RouterKind] = MappingProxyType(
    {
        row.kind: row
        for row in (
            RouterKind(
                kind="vllm-router",
                label="vLLM Router (vllm-project/router)",
                module="vllm_router.launch_router",
                distribution="vllm-router",
                policies=(
                    "round_robin",
                    "random",
                    "consistent_hash",
                    "cache_aware",
                    "power_of_two",
                    "kv_aware",
                    "sticky_least_loaded",
                ),
                session_header="X-Session-ID",
                build_argv=_vllm_router_argv,
            ),
        )
    }
)


class RouterSpec(StrictModel):
    """``routing.router``: a router process kvbench starts in front of the arm's replicas."""

    kind: RouterKindName = Field(description=f"Router kind, one of: {', '.join(ROUTER_KINDS)}.")
    policy: str = Field(description="The router's own routing policy (its policy flag), e.g. consistent_hash.")
    python: str | None = Field(
        default=None, description=f"Python of the router's virtualenv; default ${ROUTER_PYTHON_ENV}."
    )
    session_header: str | None = Field(
        default=None,
        description="Request header carrying the conversation id (default: the one the router kind hashes).",
    )
    extra_args: list[str] = Field(default_factory=list, description="Appended verbatim to the router's command line.")
    startup_timeout_s: float = Field(default=120.0, gt=0, description="How long to wait for the router's /health.")

    @model_validator(mode="after")
    def _known_policy(self) -> Self:
        allowed = self.row.policies
        if self.policy not in allowed:
            raise ValueError(f"policy {self.policy!r} is not a {self.kind} policy; one of: {', '.join(allowed)}")
        return self

    @property
    def row(self) -> RouterKind:
        return ROUTER_KINDS[self.kind]

    @property
    def header(self) -> str:
        """The header kvbench puts the conversation id in."""
        return self.session_header or self.row.session_header

    def launch(self, python: str, port: int, metrics_port: int, worker_urls: Sequence[str]) -> RouterLaunch:
        return RouterLaunch(python, port, metrics_port, tuple(worker_urls), self.policy, tuple(self.extra_args))
