"""kvbench's P/D proxy (:mod:`harness.engines.pd_proxy`) in front of two real processes playing vLLM's prefill and
decode servers (:mod:`tests.fakes.pd_engine`, which refuse any request that breaks vLLM's P/D protocol).

Started the way :class:`harness.engines.vllm_pd.VllmPdEngine` starts it (its argv, :class:`ManagedProcess`, the
launch token on ``/health``): the streamed answer is the decode server's byte for byte, the phase log has one
ordered line per request whose legs hold the delays the fakes applied, ``/metrics`` keeps the two servers apart by
role, and a decode server that dies is the engine's death and a logged 502, not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from harness.client.endpoint import Endpoint
from harness.client.scrape import metric_value, parse_metrics
from harness.engines.base import EngineFacts
from harness.engines.common import RunningProcess, ServerTokenizer
from harness.engines.process import ManagedProcess, free_port
from harness.engines.vllm_pd import PROXY_LOG, RunningPd, proxy_argv
from harness.results.pd_breakdown import read_phase_log
from tests.fakes.pd_engine import PREFILL_ANSWER_PARAMS
from tests.support import local_server_spec

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "pd_engine.py"
PREFILL_S = 0.15
TRANSFER_S = 0.06
FIRST_TOKEN_S = 0.04
BYTES_PER_TOKEN = 1000
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "one two three four five six"}],
    "stream": True,
    "max_tokens": 5,
}


def _process(name: str, argv: tuple[str, ...], port: int, log: Path, *, token: bool = False) -> ManagedProcess:
    return ManagedProcess(
        local_server_spec(name, argv, port, log, startup_timeout_s=60.0, stop_grace_s=5.0, launch_token=token)
    )


def _side(role: str, port: int, log_dir: Path) -> ManagedProcess:
    argv = [sys.executable, str(FAKE), "--role", role, "--port", str(port), "--prefill-s", str(PREFILL_S)]
    argv += ["--transfer-s", str(TRANSFER_S), "--first-token-s", str(FIRST_TOKEN_S)]
    argv += ["--bytes-per-token", str(BYTES_PER_TOKEN)]
    return _process(f"fake {role}", tuple(argv), port, log_dir / f"{role}.log")


@dataclass
class Deployment:
    prefill: ManagedProcess
    decode: ManagedProcess
    proxy: ManagedProcess
    prefill_url: str
    decode_url: str
    url: str
    log: Path


@contextlib.asynccontextmanager
async def deployment(log_dir: Path) -> AsyncIterator[Deployment]:
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    prefill_port, decode_port, proxy_port = sorted(ports)
    prefill_url, decode_url = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    log = log_dir / PROXY_LOG
    argv = proxy_argv(proxy_port, prefill_url, decode_url, log, "127.0.0.1")
    async with contextlib.AsyncExitStack() as stack:
        prefill = await stack.enter_async_context(_side("prefill", prefill_port, log_dir))
        decode = await stack.enter_async_context(_side("decode", decode_port, log_dir))
        proxy = await stack.enter_async_context(
            _process("P/D proxy", argv, proxy_port, log_dir / "pd-proxy.log", token=True)
        )
        yield Deployment(prefill, decode, proxy, prefill_url, decode_url, f"http://127.0.0.1:{proxy_port}", log)


async def _post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, bytes]:
    async with session.post(url, json=body) as answer:
        return answer.status, await answer.read()


async def test_a_request_goes_through_prefill_then_decode_and_is_logged(tmp_path: Path) -> None:
    async with deployment(tmp_path) as pd, aiohttp.ClientSession() as session:
        direct = await _post(
            session, pd.decode_url + "/v1/chat/completions", {**BODY, "kv_transfer_params": PREFILL_ANSWER_PARAMS}
        )
        sent = time.monotonic_ns()
        status, streamed = await _post(session, pd.url + "/v1/chat/completions", BODY)
        answered = time.monotonic_ns()
        assert (status, streamed) == direct  # the decode server's answer, byte for byte
        assert streamed.startswith(b"data: ") and streamed.rstrip().endswith(b"data: [DONE]")

        # a request the prefill side refuses (wrong protocol) is passed back, not turned into a decode
        async with session.post(pd.prefill_url + "/v1/chat/completions", json=BODY) as refused:
            assert refused.status == 400

        async with session.get(pd.url + "/metrics") as page:
            metrics = parse_metrics(await page.text())

    lines = read_phase_log(pd.log)
    assert len(lines) == 1
    line = lines[0]
    assert line.complete and line.error is None
    stamps = [line.received_ns, line.prefill_sent_ns, line.prefill_answered_ns, line.decode_sent_ns]
    stamps += [line.decode_first_byte_ns, line.done_ns]
    times = [stamp for stamp in stamps if stamp is not None]
    assert len(times) == len(stamps)
    # done_ns is stamped after the proxy's last write returns, which may be after the client read the end
    assert sent <= times[0] and times == sorted(times) and times[-2] <= answered
    assert line.prefill_answered_ns is not None and line.prefill_sent_ns is not None
    assert (line.prefill_answered_ns - line.prefill_sent_ns) / 1e9 >= PREFILL_S
    assert line.decode_first_byte_ns is not None and line.decode_sent_ns is not None
    assert (line.decode_first_byte_ns - line.decode_sent_ns) / 1e9 >= TRANSFER_S + FIRST_TOKEN_S

    # two requests reached the decode side (one direct), one the prefill side: the roles stay apart
    assert metric_value(metrics, "pd_prefilled") == 1.0
    assert metric_value(metrics, "pd_prefill_seconds") == pytest.approx(PREFILL_S)
    assert metric_value(metrics, "pd_decode_prefilled") == 2.0
    assert metric_value(metrics, "kv_transfers") == 2.0
    assert metric_value(metrics, "kv_transfer_bytes") == 2 * 6 * BYTES_PER_TOKEN
    assert metric_value(metrics, "pd_transferred_tokens") == 12.0
    assert metric_value(metrics, "prefilled_requests") == 3.0  # a role-blind tag sums both servers


async def test_a_dead_decode_server_is_the_engine_dying_and_a_logged_502(tmp_path: Path) -> None:
    async with deployment(tmp_path) as pd, contextlib.AsyncExitStack() as stack:
        endpoint = Endpoint(base_url=pd.url, model="m")
        facts = EngineFacts(kind="vllm-pd", version="test")
        session = aiohttp.ClientSession()
        stack.push_async_callback(session.close)
        running = RunningPd(
            endpoint=endpoint,
            facts=facts,
            proxy=pd.proxy,
            prefill=RunningProcess(Endpoint(pd.prefill_url, "m"), facts, pd.prefill),
            decode=RunningProcess(Endpoint(pd.decode_url, "m"), facts, pd.decode),
            tokenizer=ServerTokenizer(session, pd.url, "m"),
            reset_url=pd.url + "/reset_prefix_cache",
            session_owner=stack,
        )
        assert running.exit_code() is None
        await running.reset_prefix_cache()  # both servers take it through the proxy
        assert await running.tokenizer().encode("a b c") == [0, 1, 2]  # the prefill server's tokenizer

        assert pd.decode.pid is not None
        os.killpg(pd.decode.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while running.exit_code() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert running.exit_code() == -signal.SIGKILL  # what the runner reads as the engine's death

        status, body = await _post(session, pd.url + "/v1/chat/completions", BODY)
        assert status == 502 and b"decode server" in body
        async with session.get(pd.url + "/health") as health:
            assert health.status == 503

    lines = read_phase_log(pd.log)
    assert len(lines) == 1 and not lines[0].complete
    assert lines[0].error is not None and lines[0].error.startswith("decode server")
    assert lines[0].prefill_answered_ns is not None and lines[0].decode_first_byte_ns is None
    assert json.loads(pd.log.read_text().splitlines()[0])["prefill_status"] == 200
