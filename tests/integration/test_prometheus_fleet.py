"""Per-replica counters read from a REAL Prometheus server scraping two simulator replicas.

The test starts Debian's ``prometheus`` binary on 127.0.0.1 with a generated config that scrapes
two ``kvbench sim serve`` processes every second, sends requests to replica 0 only, and checks that
:class:`~harness.client.prometheus.PrometheusReader` returns, per replica, the same counter totals
as scraping that replica directly. Skipped (with the reason) when the binary is absent:
``scripts/test.sh`` installs it (``apt-get install prometheus``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.client.fleet import page_counters
from harness.client.prometheus import PrometheusReader
from harness.engines.process import free_port
from tests.support import kvbench_argv, probe_in_process

SERVE = "sim serve --model llama-3.1-8b --hardware h100-sxm --host 127.0.0.1 --port".split()
"""``kvbench sim serve`` of one replica, less its port."""

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get install -y prometheus; scripts/test.sh does)"
    ),
]


def _wait_http(url: str, timeout_s: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer")
        time.sleep(0.3)


def _wait_scraped(url: str, query: str, series: int, timeout_s: float = 60.0) -> None:
    """Until ``query`` returns ``series`` series: Prometheus has scraped every replica once."""
    import json
    import urllib.parse
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=5) as r:
            if len(json.loads(r.read())["data"]["result"]) >= series:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Prometheus at {url} never returned {series} series for {query}")
        time.sleep(0.5)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[str]]:
    processes, urls = [], []
    for index in range(2):
        port = free_port()
        log = (tmp_path / f"sim-{index}.log").open("wb")
        processes.append(subprocess.Popen(kvbench_argv(*SERVE, str(port)), stdout=log, stderr=subprocess.STDOUT))
        urls.append(f"127.0.0.1:{port}")
    try:
        for url in urls:
            _wait_http(f"http://{url}/health")
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path, replicas: list[str]) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1 scraping the replicas every second (job "fleet"); yields its URL."""
    assert PROMETHEUS is not None  # the module is skipped without it
    port = free_port()
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f'"{url}"' for url in replicas)
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: fleet\n    static_configs:\n      - targets: [{targets}]\n",
        encoding="utf-8",
    )
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(tmp_path / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/-/ready")
        _wait_scraped(url, 'up{job="fleet"} == 1', len(replicas))
        yield url
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_prometheus_reader_matches_direct_scrapes(prometheus: str, replicas: list[str]) -> None:
    asyncio.run(_check(prometheus, replicas))


async def _check(prometheus_url: str, replicas: list[str]) -> None:
    reader = PrometheusReader(prometheus_url, "instance", replicas, 'job="fleet"')
    async with aiohttp.ClientSession() as session:
        for index in range(3):  # load on replica 0 only: replica 1's counters stay at zero
            body = {"model": "llama-3.1-8b", "prompt": f"request {index} " * 200, "max_tokens": 4}
            async with session.post(f"http://{replicas[0]}/v1/completions", json=body) as response:
                assert response.status == 200
                await response.read()
        direct = []
        for url in replicas:
            async with session.get(f"http://{url}/metrics") as response:
                direct.append(page_counters(await response.text()))
        assert direct[0]["prompt_tokens"] > 0 and direct[1]["prompt_tokens"] == 0
        deadline = time.monotonic() + 30
        while True:  # until Prometheus has scraped after the last request
            pages = await reader.pages(session)
            read = [None if page is None else page_counters(page) for page in pages]
            if read[0] is not None and read[0].get("prompt_tokens") == direct[0]["prompt_tokens"]:
                break
            assert time.monotonic() < deadline, f"Prometheus never caught up: {read} vs {direct}"
            await asyncio.sleep(0.5)
    assert read[1] is not None
    for tag in ("prompt_tokens", "generation_tokens", "gpu_prefix_queries", "gpu_prefix_hits"):
        assert read[0][tag] == direct[0][tag], tag
        assert read[1].get(tag, 0.0) == direct[1][tag], tag


def test_a_fleet_run_stores_counters_read_from_prometheus(tmp_path: Path, prometheus: str, replicas: list[str]) -> None:
    """End to end: an attached fleet of 2 (kvbench routes) with a prometheus: section."""
    run_dir = probe_in_process(
        {
            "name": "fleet-prometheus",
            "engine": {
                "kind": "openai",
                "model": "llama-3.1-8b",
                "endpoints": [{"url": f"http://{url}"} for url in replicas],
            },
            "prometheus": {"url": prometheus, "replicas": replicas, "selector": 'job="fleet"'},
            "arms": [{"name": "rr", "offload": "hbm"}],
            "workload": {
                "kind": "multi_round_qa",
                "context_tokens": [1000],
                "conversations": 2,
                "turns": 2,
                "question_tokens": 16,
                "answer_tokens": 4,
                "warmup_requests": 2,
                "between_turns": {"mode": "reset_prefix_cache"},
            },
        },
        tmp_path,
    )
    events = run_dir.replica_counters()
    assert events and all(len(event.counters) == 2 for event in events)
    assert all(counters is not None for event in events for counters in event.counters)
    # Prometheus's values only grow during the run and each replica served prompts (round robin)
    first, last = events[0].counters, events[-1].counters
    for index in range(2):
        before, after = first[index], last[index]
        assert before is not None and after is not None
        assert after["prompt_tokens"] >= before["prompt_tokens"]
    assert {r.replica for r in run_dir.records() if r.phase == "measure"} == {0, 1}
