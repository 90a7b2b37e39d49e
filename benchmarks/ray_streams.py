"""Twice the streams on Ray: does ``kvbench sweep --ray --workers 2`` drive twice what one client process can, with
the client gate quiet?

Issue 42's figure. Against the simulator's fixed-latency server (:func:`harness.runs.selftest.fixed_server`: every
request gets exactly ``--ttft-ms`` to its first token and ``--itl-ms`` between tokens, so any latency beyond those is
the client's or the shared machine's):

1. one ``kvbench sweep`` process (no shards) at each of ``--levels`` concurrent streams; ``S`` = the largest level
   reached before the first level the client gate judges client-limited (:func:`harness.results.validity.
   client_limits`: a sending process's event-loop delay p99, send-lag p99 or CPU share over the scenario's limits);
2. ``kvbench sweep --ray ADDRESS --workers 2`` at ``2 × S`` streams (the merged run's point: every process of both
   shards judged), and whether the gate stays quiet there.

It prints and writes (``--out DIR``: ``ray_streams.json`` and ``ray_streams.md``) each run's points (streams, TTFT
p50/p99 in ms, the client's worst event-loop delay p99, send-lag p99 and CPU share, the gate's reasons) and the
machine it ran on (CPUs, load average before and after): on a machine whose cores other work shares, the figure is
that machine's, not kvbench's. This is a benchmark, not a test: it asserts nothing.

    PYTHONPATH=. python benchmarks/ray_streams.py --out /tmp/ray-streams      # local Ray cluster, levels 16..512
    PYTHONPATH=. python benchmarks/ray_streams.py --levels 64,128,256,512,1024 --ray auto
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.results.sweep_result import SweepResult
from harness.results.validity import client_limits
from harness.runs.selftest import fixed_server
from harness.store.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PointFigures:
    streams: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    loop_delay_p99_ms: float | None
    send_lag_p99_ms: float | None
    cpu_fraction: float | None
    client_processes: int
    client_limited: list[str]


@dataclass(frozen=True)
class SweepFigures:
    command: str
    exit_code: int
    run_dir: str | None
    points: list[PointFigures]


def sweep_argv(base_url: str, levels: list[int], args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvbench",
        "sweep",
        "--base-url",
        f"{base_url}/v1",
        "--offload",
        "off",
        "--concurrency",
        ",".join(map(str, levels)),
        "--duration",
        f"{args.duration}s",
        "--warmup",
        f"{args.warmup}s",
        "--contexts",
        str(args.prompt_tokens),
        "--turns",
        "2",
        "--answer-tokens",
        str(args.answer_tokens),
        "--set",
        "sweep.drain_timeout=5s",
        "-o",
        str(out),
    ]


def figures(argv: list[str], out: Path) -> SweepFigures:
    """Run one sweep (a subprocess, as a user does) and read its points and the client gate's reasons."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    shown = " ".join(argv[2:])
    runs = sorted(out.iterdir()) if out.is_dir() else []
    if not runs or not (runs[0] / SweepResult.FILE_NAME).exists():
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        return SweepFigures(shown, done.returncode, None, [])
    run_dir = RunDir.open(runs[0])
    result = SweepResult.read_file(run_dir.path)
    spec = run_dir.scenario().validity
    points = [
        PointFigures(
            streams=point.load,
            ttft_p50_ms=point.ttft.p50_ms if point.ttft else None,
            ttft_p99_ms=point.ttft.p99_ms if point.ttft else None,
            loop_delay_p99_ms=point.client.loop_delay_p99_ms if point.client else None,
            send_lag_p99_ms=point.client.send_lag_p99_ms if point.client else None,
            cpu_fraction=point.client.cpu_fraction if point.client else None,
            client_processes=len(point.client.processes) if point.client else 0,
            client_limited=client_limits(point, spec),
        )
        for point in result.points
    ]
    return SweepFigures(shown, done.returncode, str(run_dir.path), points)


def one_worker_most(run: SweepFigures) -> tuple[int | None, bool]:
    """The most streams one process drove before the first client-limited level; whether the gate fired at all."""
    most = None
    for point in sorted(run.points, key=lambda point: point.streams):
        if point.client_limited:
            return most, True
        most = int(point.streams)
    return most, False


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "platform": platform.platform()}


def markdown(report: dict[str, object], runs: dict[str, SweepFigures]) -> str:
    lines = [
        "# Twice the streams on Ray",
        "",
        (
            f"One process drove **{report['one_worker_streams']}** streams; at the next level the client gate fired."
            if report["gate_fired_for_one_worker"]
            else f"The client gate never fired for one process up to **{report['one_worker_streams']}** streams (the "
            "largest level): that is not one process's limit; give larger --levels."
        ),
        f"Two Ray workers at **{report['two_worker_streams']}** streams: client gate quiet: "
        f"**{report['two_workers_quiet']}**.",
        "",
        f"Machine: {report['machine_before']} before, load average {report['load_average_after']} after; "
        f"Ray {report['ray_version']}; fixed server TTFT {report['ttft_ms']} ms, ITL {report['itl_ms']} ms.",
        "",
        "| run | streams | TTFT p50 ms | TTFT p99 ms | loop delay p99 ms | send lag p99 ms | CPU share | processes "
        "| client-limited |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        for point in run.points:
            cells = [point.ttft_p50_ms, point.ttft_p99_ms, point.loop_delay_p99_ms, point.send_lag_p99_ms]
            shown = " | ".join("-" if value is None else f"{value:.1f}" for value in cells)
            cpu = "-" if point.cpu_fraction is None else f"{point.cpu_fraction:.2f}"
            why = "; ".join(point.client_limited) or "no"
            lines.append(f"| {name} | {point.streams:g} | {shown} | {cpu} | {point.client_processes} | {why} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="16,32,64,128,256,512", help="One worker's streams, increasing.")
    parser.add_argument("--ray", default="local", help="--ray ADDRESS of the two-worker sweep (default local).")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=10.0, help="Each point's measured window, s.")
    parser.add_argument("--warmup", type=float, default=3.0, help="Each point's warm-up, s.")
    parser.add_argument("--server-workers", type=int, default=1, help="Fixed-latency server processes.")
    parser.add_argument("--out", type=Path, default=None, help="Write ray_streams.json and ray_streams.md here.")
    args = parser.parse_args()
    levels = sorted(int(level) for level in args.levels.split(","))
    before = machine()
    with tempfile.TemporaryDirectory(prefix="kvbench-ray-streams-") as folder:
        work = Path(folder)
        with fixed_server(args.ttft_ms, args.itl_ms, work / "server", workers=args.server_workers) as base_url:
            one = figures(sweep_argv(base_url, levels, args, work / "one"), work / "one")
            most, fired = one_worker_most(one)
            runs = {"1 process": one}
            quiet = None
            if most is not None:
                two_argv = [*sweep_argv(base_url, [2 * most], args, work / "two"), "--ray", args.ray, "--workers", "2"]
                two = figures(two_argv, work / "two")
                runs["2 Ray workers"] = two
                quiet = bool(two.points) and not any(point.client_limited for point in two.points)
    try:
        ray_version = str(importlib.import_module("ray").__version__)
    except ImportError:
        ray_version = "not installed"
    report: dict[str, object] = {
        "one_worker_streams": most,
        "gate_fired_for_one_worker": fired,
        "two_worker_streams": None if most is None else 2 * most,
        "two_workers_quiet": quiet,
        "ttft_ms": args.ttft_ms,
        "itl_ms": args.itl_ms,
        "answer_tokens": args.answer_tokens,
        "prompt_tokens": args.prompt_tokens,
        "duration_s": args.duration,
        "ray_version": ray_version,
        "machine_before": before,
        "load_average_after": list(os.getloadavg()),
        "finished_unix_s": time.time(),
        "runs": {name: asdict(run) for name, run in runs.items()},
    }
    text = markdown(report, runs)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ray_streams.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (args.out / "ray_streams.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
