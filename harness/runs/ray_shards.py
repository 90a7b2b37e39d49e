"""``kvbench sweep SCENARIO --ray [ADDRESS] --workers N``: the N shards of a sweep as N Ray actors, merged into one
run directory.

**What runs where.** The driver (the ``kvbench sweep`` the user started) loads the scenario, connects to a Ray
cluster (``ray.init(address=ADDRESS)``; without an address it starts a local one and stops it at the end) and starts
N actors, one CPU each, spread over the cluster's nodes. Actor ``I`` writes the scenario it was sent (text, so the
workers need no shared filesystem) into a temporary folder and runs ``kvbench sweep --shard I/N --start-at T`` there,
exactly the process an Indexed Job's pod runs (:mod:`.shard`), streaming its run directory back while it runs.

**Together through the load points: ``--start-at``, not a per-point barrier.** Every shard computes the same
schedule from the scenario (point ``k`` starts at ``T + k × period``), so the actors need no message from the
driver between points; the runner stays the one every shard runs, and a barrier would add a round trip through the
driver to every point and couple the sweep loop to Ray. The cost: each period holds
:data:`~.shard.SETUP_ALLOWANCE_S` for setting up the next point, and the alignment is as good as the nodes' clocks
(NTP). ``T`` is ``--start-at`` when given, else :data:`START_LEAD_S` after every actor has started. The driver reads
each worker's clock against its own (``workers.json``), and the merge judges every point's overlap as for any shards.

**Streaming.** Each actor's ``run`` is a Ray streaming generator: every :data:`POLL_S` it yields what its run
directory gained, the new whole lines of each append-only ``*.jsonl`` file (records, points) and the current
``manifest.json``; when its ``kvbench sweep`` exits, every file as it ended, then the exit code. The driver writes
them into ``RUN_DIR/shards/I``, so a worker that dies leaves there what it had measured.

**One run directory.** :func:`harness.results.merge.merge_shards` unites the shards' raw records into ``RUN_DIR``
(every figure recomputed from them, never an average of percentiles); ``workers.json``
(:class:`~harness.results.workers.RayWorkers`) records which worker ran each shard and how it ended. A worker that
died or whose ``kvbench sweep`` could not run is a finding of the merge (INCONCLUSIVE), not a traceback.

Ray is an optional dependency (``pip install 'kvbench[ray]'``), imported only here and only for ``--ray``.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml

from common.errors import KvbenchError
from common.private import make_private_dir
from harness.engines.kinds import engine_kind
from harness.results.merge import MERGEABLE_KINDS, merge_shards, read_shard
from harness.results.workers import RayWorker, RayWorkers, WorkerEnd
from harness.scenario.spec import Scenario
from harness.store.rundir import RunDir

from .kinds import RUN_KINDS, SWEPT_BY_WORKLOAD, LaunchOverrides
from .shard import Shard, iso_utc

INSTALL_HINT = "pip install 'kvbench[ray]'"
START_LEAD_S = 20.0
"""Without ``--start-at``: the first load point starts this long after every actor has started, for each worker's
``kvbench sweep`` to start, confirm the endpoint and warm up (a late shard starts at once; the merge judges it)."""
NORMAL_PRIORITY = {"RAY_worker_niceness": "0"}
"""A shard's actor (and the ``kvbench sweep`` it starts) at nice 0: Ray nices its workers to 15 by default, and a load
generator held to a common schedule below everything else on its node falls behind it (on a busy 2-core machine a
shard's event loop fell 0.3 s behind and started its load point 2 s late: INCONCLUSIVE). The setting Ray's own job
supervisor uses for itself."""
PLACE_TIMEOUT_S = 120.0
"""How long the driver waits for the cluster to start every actor (each needs one free CPU) before it gives up."""
POLL_S = 0.5
"""How often an actor looks for new lines in its shard's run directory."""
LIVE_FILES = frozenset({"manifest.json", "scenario.yaml"})
"""Whole files an actor streams while its shard runs (the rest when it ends): what the merge needs of a shard whose
worker dies."""
VERDICT_EXITS = frozenset({0, 1, 3})
"""Exit codes of a ``kvbench sweep`` that measured (valid, FAILED, INCONCLUSIVE); 2 and the rest could not run."""
SHARDS_FOLDER = "shards"
POINTS_FILE = RunDir(Path(".")).points_file.name


def import_ray() -> ModuleType:
    """The ``ray`` module; a one-line error saying what to install when it is missing."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise KvbenchError(f"--ray: Ray is not installed here: {INSTALL_HINT}") from None


# -- the actor's side ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Bytes of one file of a shard's run directory: ``path`` relative to it ('/'-separated); ``offset`` where
    ``data`` goes in an append-only file, None when ``data`` is the whole file."""

    path: str
    offset: int | None
    data: bytes


@dataclass(frozen=True)
class WorkerFacts:
    hostname: str
    node_id: str
    actor_id: str
    pid: int
    unix_s: float


@dataclass(frozen=True)
class ShardExit:
    """The actor's last item: its ``kvbench sweep``'s exit code and the last line it printed."""

    exit_code: int
    last_line: str


class ShardFiles:
    """What of a shard's run directory (the one folder ``kvbench sweep -o OUT`` makes in ``OUT``) was streamed."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.sent: dict[str, int] = {}
        """Append-only files: bytes sent."""
        self.stamps: dict[str, tuple[int, int]] = {}
        """Whole files: (size, mtime ns) when sent."""

    def changes(self, final: bool) -> list[Chunk]:
        """New whole lines of every ``*.jsonl`` file and the changed files of :data:`LIVE_FILES` (``final``: of
        every file)."""
        runs = sorted(self.out.iterdir()) if self.out.is_dir() else []
        if not runs:
            return []
        run = runs[0]
        chunks = []
        for path in sorted(
            found
            for found in run.rglob("*")
            if found.is_file() and not found.name.startswith(".") and not found.name.endswith(".tmp")
        ):
            name = path.relative_to(run).as_posix()
            if path.suffix == ".jsonl":
                chunk = self._new_lines(path, name)
            elif final or name in LIVE_FILES:
                chunk = self._whole(path, name, final)
            else:
                chunk = None
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def _new_lines(self, path: Path, name: str) -> Chunk | None:
        offset = self.sent.get(name, 0)
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written goes with the next poll
        if not whole:
            return None
        self.sent[name] = offset + len(whole)
        return Chunk(name, offset, whole)

    def _whole(self, path: Path, name: str, final: bool) -> Chunk | None:
        status = path.stat()
        stamp = (status.st_size, status.st_mtime_ns)
        if self.stamps.get(name) == stamp:
            return None
        data = path.read_bytes()
        if not final and name.endswith(".json"):
            try:  # caught while being rewritten: the next poll sends it
                json.loads(data)
            except ValueError:
                return None
        self.stamps[name] = stamp
        return Chunk(name, None, data)


class ShardWorker:
    """The Ray actor (``ray.remote`` applied by the driver): runs one shard's ``kvbench sweep`` and streams its run
    directory."""

    def facts(self) -> WorkerFacts:
        context = import_ray().get_runtime_context()
        return WorkerFacts(
            hostname=socket.gethostname(),
            node_id=str(context.get_node_id()),
            actor_id=str(context.get_actor_id()),
            pid=os.getpid(),
            unix_s=time.time(),
        )

    def run(self, scenario_text: str, shard: str, start_at: float) -> Iterator[list[Chunk] | ShardExit]:
        with tempfile.TemporaryDirectory(prefix="kvbench-ray-shard-") as folder:
            scenario = Path(folder) / "scenario.yaml"
            scenario.write_text(scenario_text, encoding="utf-8")
            out, log = Path(folder) / "out", Path(folder) / "kvbench.log"
            argv = [sys.executable, "-m", "kvbench", "sweep", str(scenario), "--shard", shard]
            argv += ["--start-at", f"{start_at:.3f}", "-o", str(out)]
            files = ShardFiles(out)
            with log.open("wb") as sink:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
                try:
                    while process.poll() is None:
                        time.sleep(POLL_S)
                        chunks = files.changes(final=False)
                        if chunks:
                            yield chunks
                    chunks = files.changes(final=True)
                    if chunks:
                        yield chunks
                finally:  # the driver gave up on this generator: the sweep stops with it
                    if process.poll() is None:
                        process.kill()
                        process.wait()
            lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            yield ShardExit(process.returncode, lines[-1] if lines else "")


# -- the driver's side ---------------------------------------------------------------------------------------------


@dataclass
class WorkerRun:
    """The driver's view of one actor."""

    shard: int
    folder: Path
    facts: WorkerFacts | None = None
    clock_offset_s: float | None = None
    clock_rtt_s: float | None = None
    streamed: int = 0
    exit: ShardExit | None = None
    died: str | None = None

    @property
    def end(self) -> WorkerEnd:
        if self.exit is None:
            return "died"
        return "completed" if self.exit.exit_code in VERDICT_EXITS else "exited"

    @property
    def trouble(self) -> str | None:
        """Why this shard's worker did not complete (None: it did)."""
        if self.exit is None:
            return f"its Ray worker {self.where} died ({self.died or 'no reason given'})"
        if self.exit.exit_code not in VERDICT_EXITS:
            return f"its worker {self.where}'s kvbench sweep exited {self.exit.exit_code}: {self.exit.last_line}"
        return None

    @property
    def where(self) -> str:
        if self.facts is None:
            return "(not started)"
        return f"on {self.facts.hostname} (actor {self.facts.actor_id[:12]}, pid {self.facts.pid})"

    def record(self) -> RayWorker:
        facts = self.facts
        return RayWorker(
            shard=self.shard,
            hostname=facts.hostname if facts else None,
            node_id=facts.node_id if facts else None,
            actor_id=facts.actor_id if facts else None,
            pid=facts.pid if facts else None,
            clock_offset_s=self.clock_offset_s,
            clock_rtt_s=self.clock_rtt_s,
            end=self.end,
            exit_code=self.exit.exit_code if self.exit else None,
            error=self.trouble,
            bytes_streamed=self.streamed,
        )


def write_chunk(folder: Path, chunk: Chunk) -> None:
    """Put a streamed chunk into the driver's copy of the shard's run directory."""
    target = folder.joinpath(*chunk.path.split("/"))
    if target.resolve().parent != folder.resolve() and folder.resolve() not in target.resolve().parents:
        raise KvbenchError(f"{folder}: a worker sent a file outside its run directory: {chunk.path!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    if chunk.offset is None:
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(chunk.data)
        partial.replace(target)
        return
    with target.open("ab") as handle:
        if handle.tell() != chunk.offset:
            raise KvbenchError(f"{target}: a worker sent bytes at {chunk.offset}, the copy has {handle.tell()}")
        handle.write(chunk.data)


def checked_sweep(scenario: Scenario, source: str) -> None:
    """Refuse, before any worker starts, a scenario ``kvbench sweep`` would refuse (one line naming the field), and
    one whose engine kvbench starts: every worker would start its own, and the shards would not share one."""
    kind = SWEPT_BY_WORKLOAD.get(scenario.workload.kind, "sweep")
    RUN_KINDS[kind].check(scenario, source, LaunchOverrides())
    engine = scenario.engine.kind
    if engine_kind(engine).starts_process:
        raise KvbenchError(
            f"{source}: engine.kind: {engine}: with --ray every worker would start its own engine; the shards "
            "measure one endpoint: give engine.kind openai with its base_url (or --base-url URL)"
        )


def _connect(ray: ModuleType, address: str | None, workers: int) -> None:
    """Connect to the cluster at ``address`` or start a local one; a one-line error when Ray cannot."""
    try:
        _init(ray, address, workers)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as error:
        where = f"--ray {address}" if address is not None else "--ray local"
        why = " ".join(str(error).split())
        raise KvbenchError(f"{where}: Ray could not start or reach the cluster: {why}") from None


def _init(ray: ModuleType, address: str | None, workers: int) -> None:
    if address is not None:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        return
    if __name__.startswith("harness."):  # a checkout, not the installed package: the local workers import it too
        root = str(Path(__file__).resolve().parents[2])
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    ray.init(
        num_cpus=max(workers, os.cpu_count() or 1),
        _node_ip_address="127.0.0.1",  # a cluster of this machine only: nothing outside it reaches its ports
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # a worker killed outright leaves its kvbench sweep orphaned; the raylet reaps and kills it
        _system_config={"kill_child_processes_on_worker_exit_with_raylet_subreaper": True},
    )


def _start(ray: ModuleType, runs: list[WorkerRun]) -> list[object]:
    """One actor per shard, each once started asked for its facts and clock."""
    remote = ray.remote(
        num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD", runtime_env={"env_vars": NORMAL_PRIORITY}
    )(ShardWorker)
    actors: list[object] = [remote.remote() for _ in runs]
    pending = [actor.facts.remote() for actor in actors]  # type: ignore[attr-defined]
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=PLACE_TIMEOUT_S)
    if len(ready) < len(pending):
        cpus = ray.cluster_resources().get("CPU", 0)
        raise KvbenchError(
            f"--workers {len(runs)}: the Ray cluster started {len(ready)} of {len(runs)} actors in "
            f"{PLACE_TIMEOUT_S:.0f} s (each needs one free CPU; the cluster has {cpus})"
        )
    for run, actor in zip(runs, actors, strict=True):
        sent = time.time()
        facts = ray.get(actor.facts.remote())  # type: ignore[attr-defined]
        received = time.time()
        if isinstance(facts, WorkerFacts):
            run.facts = facts
            run.clock_offset_s = round(facts.unix_s - (sent + received) / 2, 6)
            run.clock_rtt_s = round(received - sent, 6)
    return actors


def _drain(
    ray: ModuleType, run: WorkerRun, stream: object, failures: list[BaseException], say: Callable[[str], None]
) -> None:
    """Consume one actor's stream into its shard folder (a thread per actor), saying each load point it finished."""
    try:
        for ref in stream:  # type: ignore[attr-defined]
            item = ray.get(ref)
            if isinstance(item, ShardExit):
                run.exit = item
            elif isinstance(item, list):
                for chunk in item:
                    if isinstance(chunk, Chunk):
                        write_chunk(run.folder, chunk)
                        run.streamed += len(chunk.data)
                        if chunk.path == POINTS_FILE:
                            done = chunk.data.count(b"\n")
                            say(f"shard {run.shard}: {done} more load point(s) done")
    except ray.exceptions.RayError as error:
        run.died = " ".join(str(error).split())[:300]
    except (KvbenchError, OSError) as error:
        failures.append(error)


def run_on_ray(
    scenario: Scenario,
    source: str,
    *,
    workers: int,
    address: str | None,
    parent: Path,
    start_at: float | None,
    say: Callable[[str], None],
) -> RunDir:
    """Run the sweep as ``workers`` shards on Ray and merge them into a new run directory in ``parent``."""
    if workers < 1:
        raise KvbenchError(f"--workers {workers}: give 1 or more (one Ray actor per shard)")
    checked_sweep(scenario, source)
    ray = import_ray()
    out = RunDir.new_path(parent, scenario)
    runs = [WorkerRun(index, out / SHARDS_FOLDER / str(index)) for index in range(workers)]
    text = yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False)
    _connect(ray, address, workers)
    try:
        actors = _start(ray, runs)
        start = start_at if start_at is not None else time.time() + START_LEAD_S
        say(f"{workers} shards on Ray ({address or 'a local cluster'}), the first load point at {iso_utc(start)}")
        make_private_dir(out)
        for run in runs:
            say(f"worker {run.shard}: {run.where}, clock {run.clock_offset_s or 0:+.3f} s vs this driver's")
            make_private_dir(run.folder)
        failures: list[BaseException] = []
        threads = [
            threading.Thread(
                target=_drain,
                args=(ray, run, actor.run.remote(text, Shard(run.shard, workers).label, start), failures, say),  # type: ignore[attr-defined]
                name=f"kvbench-ray-shard-{run.shard}",
                daemon=True,
            )
            for run, actor in zip(runs, actors, strict=True)
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=1.0)
        except KeyboardInterrupt:  # stop the workers; merge what they streamed, as an interrupted run keeps its records
            for run, actor in zip(runs, actors, strict=True):
                if run.exit is None:
                    ray.kill(actor)
            for thread in threads:
                thread.join(timeout=30.0)
        if failures:
            raise failures[0]
        for run in runs:
            say(f"worker {run.shard}: {run.trouble or 'completed'}, {run.streamed} bytes streamed")
        _merge(runs, out)
        RayWorkers(
            ray_version=str(ray.__version__),
            address=address or "local",
            start_at=iso_utc(start),
            workers=[run.record() for run in runs],
        ).write_file(out)
    finally:
        ray.shutdown()
    return RunDir(out)


def _merge(runs: list[WorkerRun], out: Path) -> None:
    """The shards' copies merged into ``out``; a shard whose worker did not complete is a finding, and left out
    when what it streamed cannot be merged (it never started a load point)."""
    lost: dict[int, str] = {}
    paths = []
    for run in runs:
        trouble = run.trouble
        if trouble is not None:
            lost[run.shard] = trouble
            if not _mergeable(run.folder):
                lost[run.shard] += " before it started a load point"
                continue
        paths.append(run.folder)
    if not paths:
        raise KvbenchError(f"no shard measured anything: {'; '.join(f'shard {i}: {why}' for i, why in lost.items())}")
    merge_shards(paths, out, lost=lost, keep=frozenset({SHARDS_FOLDER}))


def _mergeable(folder: Path) -> bool:
    try:
        shard = read_shard(folder)
    except KvbenchError:
        return False
    return bool(shard.clocks) and shard.kind in MERGEABLE_KINDS


def worker_lines(path: Path) -> list[str]:
    """What the console says about a sweep run on Ray: each worker, where it ran and how it ended."""
    file = path / RayWorkers.FILE_NAME
    if not file.exists():
        return []
    workers = RayWorkers.read_file(file)
    return [
        f"worker {worker.shard}: {worker.end} on {worker.hostname or '?'} (Ray node {(worker.node_id or '?')[:12]}, "
        f"clock {worker.clock_offset_s or 0:+.3f} s vs the driver's)"
        for worker in workers.workers
    ]
