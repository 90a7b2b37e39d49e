"""A fleet's replica names itself in every response: the ASGI middleware vLLM loads, and its launch plan.

The middleware runs here around a real (tiny) ASGI application; the launch plan is the one a vLLM
replica of a fleet gets. That vLLM really loads it is tested with two vLLM-CPU replicas
(tests/integration/test_vllm_cpu_fleet.py); the simulator's header with real ``kvbench sim serve``
replicas behind the real vLLM Router (tests/integration/test_fleet_vllm_router.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.engines.configs import VllmEngineConfig
from harness.engines.kvbench_replica_header import (
    MIDDLEWARE,
    REPLICA_ENV,
    REPLICA_HEADER,
    Message,
    ReplicaHeader,
    replica_env,
)
from harness.engines.vllm import build_vllm_env
from harness.engines.vllm_offload import VllmLaunchPlan, name_replica

BODY = [b"data: one\n\n", b"data: two\n\n"]


async def streaming_app(scope: Message, receive: object, send: object) -> None:
    """Answers every HTTP request with a two-chunk stream that carries one header of its own."""
    assert callable(send)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for chunk in BODY:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def call(app: ReplicaHeader, scope_type: str = "http") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": scope_type}, receive, send)
    return sent


async def test_the_header_is_added_once_and_the_stream_passes_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPLICA_ENV, "1")
    sent = await call(ReplicaHeader(streaming_app))
    start, *body = sent
    assert start["headers"] == [(b"content-type", b"text/event-stream"), (REPLICA_HEADER.lower().encode(), b"1")]
    assert [message.get("body") for message in body] == [*BODY, b""]


async def test_without_the_variable_nothing_is_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLICA_ENV, raising=False)
    start, *_ = await call(ReplicaHeader(streaming_app))
    assert start["headers"] == [(b"content-type", b"text/event-stream")]


def test_a_single_engine_is_not_named() -> None:
    assert replica_env(0, 1) == {}
    assert replica_env(2, 3) == {REPLICA_ENV: "2"}


def test_a_vllm_replica_plan_loads_the_middleware_file_from_its_workdir(tmp_path: Path) -> None:
    plan = name_replica(VllmLaunchPlan(backend="none", args=("--enable-prefix-caching",)), tmp_path, 1, 2, "/tmp/site")
    assert plan.args == ("--enable-prefix-caching", "--middleware", MIDDLEWARE)
    assert plan.env["PYTHONPATH"] == f"{tmp_path}:/tmp/site" and plan.env[REPLICA_ENV] == "1"
    [file] = plan.files
    file.path.write_text(file.text, encoding="utf-8")
    # the engine's python imports it by the module name --middleware gives, from the file alone
    module_name, class_name = MIDDLEWARE.rsplit(".", 1)
    spec = importlib.util.spec_from_file_location(module_name, file.path)
    assert spec is not None and spec.loader is not None and file.path.name == f"{module_name}.py"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, class_name)


def test_the_replicas_pythonpath_keeps_the_middleware_first_over_the_configs_own(tmp_path: Path) -> None:
    config = VllmEngineConfig(kind="vllm", model="/m", env={"PYTHONPATH": "/opt/extra"})
    plan = name_replica(VllmLaunchPlan(backend="none", args=()), tmp_path, 0, 2, config.env["PYTHONPATH"])
    assert build_vllm_env(config, plan)["PYTHONPATH"] == f"{tmp_path}:/opt/extra"
