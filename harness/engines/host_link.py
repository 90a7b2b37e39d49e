"""The host link of a run attempt: pinned host <-> GPU copy rates, measured before any engine starts.

Why: an offload tier's turn-2 load is a host-to-device copy, and two hosts of one kind (4x H200 VMs)
gave LMCache per-rank retrieval rates of 42 and 19-36 GB/s with nothing in the runs' files saying
why (docs/simulator.md, "Run to run"). A run attempt on an engine kind that runs on this machine's
GPUs with a python (the ``host_link`` column of :mod:`harness.engines.kinds`) records the link it ran
on, so a load rate can be read against it.

:func:`measure_host_link` runs :mod:`harness.engines.host_link_probe` *by path* with the engine's
python (which has torch and no kvbench), no shell, and parses its one ``KVBENCH_HOST_LINK <json>``
line into a :class:`HostLink`. Units: GB/s = 10^9 bytes per second; per GPU the median of
``repeats`` copies of ``bytes_per_copy`` bytes:

* ``h2d_gbps`` / ``d2h_gbps``: pinned host -> device / device -> pinned host, that GPU alone;
* ``h2d_concurrent_gbps``: host -> device while every measured GPU copies at once (one process per
  GPU, as TP ranks load their KV shards); ``concurrent_aggregate_gbps``: all GPUs' bytes over the
  span from the first start to the last end.

A probe that cannot run, runs past its timeout, exits non-zero, prints no marker line, prints bad
JSON or reports an error (no torch, no CUDA) gives a :class:`HostLink` with ``not_measured`` naming
what happened: a run never fails because its link could not be measured. On timeout or
cancellation the probe's whole process group (its per-GPU workers too) is killed.

:func:`summarize_host_links` reduces the attempts' links to a :class:`HostLinkSummary` (median and
minimum over the GPUs, alone and all at once), the figure a calibration's source entry keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from common.redact import redact_text
from common.schema import StrictModel, figures_or_reason, first_problem

from . import host_link_probe
from .common import marked_value
from .host_link_probe import MARKER

PROBE_FILE = Path(host_link_probe.__file__).resolve()
DEFAULT_MIB = 1024
"""Bytes per copy in MiB: 1 GiB is about as large as one TP rank's KV of a 128k-token turn 2 at 70B/TP=4
(9.8 GB), and long enough (tens of ms) that launch costs do not count."""
DEFAULT_REPEATS = 5
DEFAULT_TIMEOUT_S = 180.0
"""Seconds for the whole probe: torch's import and CUDA start in one process plus one per GPU (spawned)
dominate; the copies take about a second per GPU."""
POLL_S = 0.2
"""How often a running probe checks for cancellation."""
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
STDERR_CHARS = 300


class GpuLink(StrictModel):
    """One GPU's rates, as torch numbers it (an index into ``CUDA_VISIBLE_DEVICES`` when that is set)."""

    index: int = Field(ge=0)
    name: str
    h2d_gbps: float = Field(gt=0, description="Pinned host -> device, this GPU alone, GB/s (1e9 B/s).")
    d2h_gbps: float = Field(gt=0, description="Device -> pinned host, this GPU alone, GB/s.")
    h2d_concurrent_gbps: float = Field(gt=0, description="Host -> device while every measured GPU copies, GB/s.")


class ProbeDocument(StrictModel):
    """What a successful probe prints after the marker."""

    bytes_per_copy: int = Field(gt=0)
    repeats: int = Field(gt=0)
    torch: str
    gpus: list[GpuLink] = Field(min_length=1)
    concurrent_aggregate_gbps: float = Field(gt=0)


class HostLink(StrictModel):
    """One attempt's host link: the rates per GPU, or ``not_measured`` with the reason (never both)."""

    python: str = Field(description="The engine's python that ran the probe.")
    requested_gpus: list[int] | None = Field(description="The --gpus given to the probe (None: every visible GPU).")
    cuda_visible_devices: str | None = Field(description="CUDA_VISIBLE_DEVICES as the probe saw it (None: unset).")
    seconds: float = Field(ge=0, description="Wall time of the probe, start of python to its exit.")
    not_measured: str | None = Field(default=None, description="Why there are no rates (None: measured).")
    bytes_per_copy: int | None = None
    repeats: int | None = None
    torch: str | None = None
    gpus: list[GpuLink] = Field(default_factory=list)
    concurrent_aggregate_gbps: float | None = None

    @model_validator(mode="after")
    def _rates_or_reason(self) -> HostLink:
        figures_or_reason(bool(self.gpus), self.not_measured, "a host link has rates per GPU or a not_measured reason")
        return self

    def summary(self) -> HostLinkSummary | None:
        return summarize_host_links([self])

    def console_line(self) -> str:
        """One line for the run's console: the rates' summary, or why there are none."""
        summary = self.summary()
        if summary is None:
            return f"host link not measured: {self.not_measured}"
        copy_mib = (self.bytes_per_copy or 0) / host_link_probe.BYTES_PER_MIB
        return f"host link ({copy_mib:g} MiB pinned copies, torch {self.torch}): {summary.text()}"


class HostLinkSummary(StrictModel):
    """A run's host link reduced over its GPUs (and attempts): what a calibration source keeps. GB/s."""

    gpus: int = Field(ge=1, description="GPU measurements pooled (GPUs x attempts that measured the link).")
    h2d_median_gbps: float
    h2d_min_gbps: float
    h2d_concurrent_median_gbps: float = Field(description="Host -> device with every GPU copying at once.")
    h2d_concurrent_min_gbps: float

    def text(self) -> str:
        return (
            f"h2d {self.h2d_median_gbps:.1f} GB/s per GPU alone (min {self.h2d_min_gbps:.1f}), "
            f"{self.h2d_concurrent_median_gbps:.1f} with all at once (min {self.h2d_concurrent_min_gbps:.1f}); "
            # a resumed run pools every attempt's GPUs, so this counts measurements, not devices
            f"median of {self.gpus} GPU measurement{'s' if self.gpus != 1 else ''}"
        )


def summary_text(summary: HostLinkSummary | None) -> str:
    """A run's host link in one phrase (``not recorded`` when the run has none)."""
    return "not recorded" if summary is None else summary.text()


def summarize_host_links(links: Sequence[HostLink]) -> HostLinkSummary | None:
    """Median and minimum over every measured GPU of ``links`` (None when none measured the link)."""
    gpus = [gpu for link in links for gpu in link.gpus]
    if not gpus:
        return None
    alone = [gpu.h2d_gbps for gpu in gpus]
    together = [gpu.h2d_concurrent_gbps for gpu in gpus]
    return HostLinkSummary(
        gpus=len(gpus),
        h2d_median_gbps=round(statistics.median(alone), 3),
        h2d_min_gbps=min(alone),
        h2d_concurrent_median_gbps=round(statistics.median(together), 3),
        h2d_concurrent_min_gbps=min(together),
    )


@dataclass(frozen=True)
class HostLinkTarget:
    """What an engine kind's ``host_link`` function says the probe runs with."""

    python: str
    gpus: list[int] | None
    """Device indices as the engine's torch sees them (None: every visible GPU)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the engine gets on top of kvbench's environment (its ``CUDA_VISIBLE_DEVICES`` among them)."""


def engine_target(python: str, *, gpus: list[int] | None, fleet_gpus: int, env: Mapping[str, str]) -> HostLinkTarget:
    """The probe's target for an engine config's fleet fields: the GPUs the run will use.

    With ``gpus`` (the fleet's GPU ids, handed out as ``CUDA_VISIBLE_DEVICES``) the probe sees those
    and measures all of them; otherwise it inherits the engine's ``CUDA_VISIBLE_DEVICES`` (the
    config's ``env``, else kvbench's) and measures the first ``fleet_gpus`` devices, the ones the
    engine's ranks take.
    """
    merged = dict(env)
    if gpus is not None:
        merged[VISIBLE_DEVICES] = ",".join(str(gpu) for gpu in gpus)
        return HostLinkTarget(python, list(range(len(gpus))), merged)
    return HostLinkTarget(python, list(range(fleet_gpus)), merged)


def _stderr_tail(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "no stderr"
    last = redact_text(lines[-1])
    return last if len(last) <= STDERR_CHARS else last[: STDERR_CHARS - 3] + "..."


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill the probe and the per-GPU workers it spawned (they share its new process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def parse_probe_output(stdout: str) -> ProbeDocument | str:
    """The probe's document from its stdout, or why there is none (a ``not_measured`` reason)."""
    value = marked_value(stdout, MARKER)
    if value is None:
        return f"the probe printed no {MARKER.strip()} line"
    try:
        data = json.loads(value)
    except ValueError as error:
        return f"the probe's {MARKER.strip()} line is not JSON: {error}"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return f"the probe reports: {data['error']}"
    try:
        return ProbeDocument.model_validate(data)
    except ValidationError as error:
        return f"the probe printed an unexpected document: {first_problem(error, whole='document')}"


def measure_host_link(
    python: str,
    gpus: list[int] | None,
    *,
    mib: int = DEFAULT_MIB,
    repeats: int = DEFAULT_REPEATS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cancel: threading.Event | None = None,
) -> HostLink:
    """Run the probe with ``python`` on ``gpus``; every failure becomes ``not_measured`` (never raises).

    ``env``: variables added to kvbench's environment for the probe. ``cancel``: set it to kill the
    probe early (the result then says it was cancelled).
    """
    child_env = {**os.environ, **(env or {})}
    argv = [python, str(PROBE_FILE), "--mib", str(mib), "--repeats", str(repeats)]
    if gpus is not None:
        argv += ["--gpus", ",".join(str(gpu) for gpu in gpus)]
    visible = child_env.get(VISIBLE_DEVICES)
    started = time.monotonic()

    def link(document: ProbeDocument | None = None, reason: str | None = None) -> HostLink:
        seconds = round(time.monotonic() - started, 3)
        reading = partial(HostLink, python=python, requested_gpus=gpus, cuda_visible_devices=visible, seconds=seconds)
        if document is None:
            return reading(not_measured=reason)
        return reading(
            bytes_per_copy=document.bytes_per_copy,
            repeats=document.repeats,
            torch=document.torch,
            gpus=document.gpus,
            concurrent_aggregate_gbps=document.concurrent_aggregate_gbps,
        )

    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=child_env,
            start_new_session=True,  # its own process group, so a kill reaches the per-GPU workers too
        )
    except OSError as error:
        return link(reason=f"cannot run {python}: {error.strerror or error}")
    deadline = started + timeout_s
    while True:
        try:
            stdout, stderr = process.communicate(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                _kill_group(process)
                return link(reason="cancelled (the run was interrupted)")
            if time.monotonic() >= deadline:
                _kill_group(process)
                return link(reason=f"the probe ran past its {timeout_s:g} s timeout and was killed")
    if process.returncode != 0:
        return link(reason=f"the probe exited with status {process.returncode}: {_stderr_tail(stderr)}")
    document = parse_probe_output(stdout)
    if isinstance(document, str):
        return link(reason=document if not stderr.strip() else f"{document}; stderr: {_stderr_tail(stderr)}")
    return link(document)


async def probe_host_link(target: HostLinkTarget, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> HostLink:
    """:func:`measure_host_link` for ``target`` in a worker thread; a cancelled run kills the probe."""
    cancel = threading.Event()
    try:
        return await asyncio.to_thread(
            measure_host_link,
            target.python,
            target.gpus,
            mib=DEFAULT_MIB,
            repeats=DEFAULT_REPEATS,
            timeout_s=timeout_s,
            env=target.env,
            cancel=cancel,
        )
    except asyncio.CancelledError:
        cancel.set()  # the thread sees it within POLL_S and kills the probe's process group
        raise
