"""A calibration's source entries carry each run's host link; validate shows it beside the sources'.

The run directories are the fit tests' (records from the simulator's engine core,
:func:`tests.unit.results.test_calibrate.write_run`), with host links written into their
manifests' attempts as the spine records them. The expected medians are computed here from the
per-GPU rates written, over every attempt that measured the link.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from harness.calibrate.fit import calibrate
from harness.calibrate.samples import run_facts
from harness.calibrate.validate import _prepare, host_link_lines
from harness.engines.host_link import HostLink
from harness.sim.calibration import Calibration
from harness.store.rundir import RunDir
from kvbench.cli.sim import _describe
from tests.unit.results.test_calibrate import chosen, write_run


def link(alone: list[float], together: list[float]) -> dict[str, object]:
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "h2d_gbps": a, "d2h_gbps": a, "h2d_concurrent_gbps": t}
        for i, (a, t) in enumerate(zip(alone, together, strict=True))
    ]
    document = {
        "python": "/venv/bin/python",
        "requested_gpus": list(range(len(gpus))),
        "cuda_visible_devices": None,
        "seconds": 12.0,
        "bytes_per_copy": 1 << 30,
        "repeats": 5,
        "torch": "2.9.0",
        "gpus": gpus,
        "concurrent_aggregate_gbps": sum(together),
    }
    return HostLink.model_validate(document).model_dump(mode="json")


def with_attempts(run: Path, *host_links: dict[str, object] | None) -> Path:
    manifest_file = RunDir.open(run).manifest_file
    manifest = json.loads(manifest_file.read_text())
    manifest["attempts"] = [
        {"attempt": i, "status": "completed", **({"host_link": hl} if hl is not None else {})}
        for i, hl in enumerate(host_links, start=1)
    ]
    manifest_file.write_text(json.dumps(manifest))
    return run


def test_each_source_carries_its_runs_host_link_pooled_over_attempts(tmp_path: Path) -> None:
    first, resumed = ([24.0, 26.0], [20.0, 13.5]), ([55.0], [55.0])  # a resumed attempt on another host
    not_measured: dict[str, object] = {
        "python": "p",
        "requested_gpus": None,
        "cuda_visible_devices": None,
        "seconds": 0.5,
        "not_measured": "the probe reports: CUDA is not available to torch",
    }
    run = with_attempts(write_run(tmp_path / "a", chosen()), link(*first), not_measured, None, link(*resumed))
    fitted = calibrate([run])
    summary = fitted.sources[0].host_link
    alone, together = first[0] + resumed[0], first[1] + resumed[1]
    assert summary is not None and summary.gpus == len(alone)
    assert summary.h2d_median_gbps == statistics.median(alone) and summary.h2d_min_gbps == min(alone)
    assert summary.h2d_concurrent_median_gbps == statistics.median(together)
    assert summary.h2d_concurrent_min_gbps == min(together)
    path = fitted.save(tmp_path / "calibration.yaml")
    assert Calibration.load(path).sources[0].host_link == summary
    described = _describe(fitted)
    lines = described.splitlines()
    shown = lines.index(next(line for line in lines if line.startswith("Host link of the source runs")))
    assert lines[shown + 1] == f"  {fitted.sources[0].run_id}: {summary.text()}"
    assert lines[shown - 1].startswith("  lmcache 0.0.1: ")  # right below the backend's fitted load rate and terms


def test_a_run_without_a_host_link_says_none(tmp_path: Path) -> None:
    run = with_attempts(write_run(tmp_path / "a", chosen()), None)
    assert run_facts(run).source.host_link is None
    fitted = Calibration.load(calibrate([run]).save(tmp_path / "calibration.yaml"))
    assert fitted.sources and all(source.host_link is None for source in fitted.sources)
    assert f"  {fitted.sources[0].run_id}: not recorded" in _describe(fitted).splitlines()


def test_validate_shows_the_runs_host_link_beside_the_calibrations_sources(tmp_path: Path) -> None:
    source = with_attempts(write_run(tmp_path / "a", chosen()), link([24.0], [24.0]))
    other = with_attempts(write_run(tmp_path / "b", chosen()), link([52.0, 50.0], [40.0, 20.0]))
    calibration_file = calibrate([source]).save(tmp_path / "calibration.yaml")
    prepared = _prepare(RunDir.open(other), "probe", tmp_path / "out", calibration_file)
    lines = host_link_lines(prepared)
    theirs, ours = run_facts(source).source, run_facts(other).source
    assert ours.host_link is not None and theirs.host_link is not None
    assert lines[0].endswith(f"this run: {ours.host_link.text()}") and "not used to scale" in lines[0]
    assert lines[1:] == [f"  calibration source {theirs.run_id}: {theirs.host_link.text()}"]
