"""Progress of a run, a sweep or a soak: one protocol, a no-op, rich bars for a terminal and plain lines for a log.

Every run kind reports the same shape: an overall bar over its units of work (``requests`` for a
probe, ``points`` for a sweep, ``intervals`` for a soak), a line saying what is happening now, and,
where one unit takes a while (a sweep point's warm-up and window), an inner bar over that unit's
seconds.

Off a terminal (a CI log, a pipe) :class:`PlainProgress` writes one plain line per event instead of
bars, each with the elapsed time and an estimate of the time left::

    ETA = (total - done) * elapsed / done_now

``elapsed`` in seconds since the attempt started, ``done_now`` the units this attempt finished (units
finished by an earlier attempt of a resumed run took none of its time); "ETA unknown" until one has.
:func:`progress_for` picks the implementation for a console.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from common.markup import console_text


class RunProgress(Protocol):
    """Where a runner reports progress (the CLI draws rich bars from it; tests pass :class:`NoProgress`)."""

    def start(self, total: int, done: int, unit: str) -> None:
        """The overall bar: ``total`` units, ``done`` of them finished before this attempt."""

    def describe(self, text: str) -> None:
        """What is happening now (starting an engine, warming up, building user contexts...)."""

    def note(self, text: str) -> None:
        """A line that stays on the console above the bars (what the attempt ran on, e.g. its host link)."""

    def advance(self, detail: str = "") -> None:
        """One unit finished; ``detail`` summarises it (e.g. the last interval's TTFT p99)."""

    def begin_step(self, label: str, seconds: float) -> None:
        """An inner bar over one long unit (``seconds`` planned)."""

    def tick(self, elapsed_s: float, detail: str) -> None:
        """The inner bar's position."""

    def end_step(self) -> None:
        """The inner bar is done (the unit is counted by :meth:`advance`)."""


class NoProgress:
    """Reports nothing."""

    def start(self, total: int, done: int, unit: str) -> None:
        return None

    def describe(self, text: str) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def advance(self, detail: str = "") -> None:
        return None

    def begin_step(self, label: str, seconds: float) -> None:
        return None

    def tick(self, elapsed_s: float, detail: str) -> None:
        return None

    def end_step(self) -> None:
        return None


class RichProgress:
    """Rich bars on the console: the overall one, and an inner one while a long unit runs."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description:<44}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}  {task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._overall: TaskID | None = None
        self._step: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def start(self, total: int, done: int, unit: str) -> None:
        if self._overall is None:
            self._overall = self._progress.add_task(
                "starting", total=max(total, 1), completed=done, unit=unit, detail=""
            )
        else:
            self._progress.update(self._overall, total=max(total, 1), completed=done, unit=unit)

    def describe(self, text: str) -> None:
        if self._overall is not None:
            self._progress.update(self._overall, description=console_text(text))

    def note(self, text: str) -> None:
        self._progress.console.print(console_text(text), highlight=False)

    def advance(self, detail: str = "") -> None:
        if self._overall is not None:
            self._progress.update(self._overall, advance=1, detail=console_text(detail))

    def begin_step(self, label: str, seconds: float) -> None:
        self.end_step()
        self._step = self._progress.add_task(console_text(label), total=max(seconds, 1e-9), unit="s", detail="")

    def tick(self, elapsed_s: float, detail: str) -> None:
        if self._step is not None:
            self._progress.update(self._step, completed=elapsed_s, detail=console_text(detail))

    def end_step(self) -> None:
        if self._step is not None:
            self._progress.remove_task(self._step)
            self._step = None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters (ESC of an ANSI sequence, CR, newline) a name or an error text may carry."""
_COUNTER = re.compile(r"\d+/\d+")
"""A count of a status line (``building prompts 51/900``, ``point 2/5``)."""


def _plain(text: str) -> str:
    """``text`` on one line without control characters: a log line no terminal code can restyle or split."""
    return _CONTROL.sub(" ", text).strip()


def _clock(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (``M:SS`` under an hour)."""
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class PlainProgress:
    """Plain lines for a log: what starts, each unit done (rate-limited), engine events; elapsed and ETA on each.

    A line is written and flushed at once, so a CI log shows the run as it goes. Lines that would repeat
    themselves are thinned: a unit's line is written for the attempt's first and last unit, for a unit that
    ran as a long step (a sweep point) or took ``every_s / 2`` or more (a soak interval), and otherwise at
    most once per ``every_s`` (a probe's requests, a replay's lines); a status that differs from the last one
    only in its counter ("building prompts 51/900") at most once per ``every_s``; a long step's position at
    most once per ``tick_every_s``. A unit's line held back is written before the next status or note line,
    so the last unit of an arm shows where the next begins.
    """

    def __init__(
        self,
        stream: IO[str],
        *,
        every_s: float = 10.0,
        tick_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._every_s = every_s
        self._tick_every_s = tick_every_s
        self._clock = clock
        self._started = clock()
        self._total = 0
        self._done = 0
        self._done_before = 0
        self._unit = "units"
        self._last_unit_line: float | None = None
        self._last_unit = self._started  # when the last unit (or the attempt) ended
        self._last_status: tuple[str, float] | None = None  # (its text with counters masked, when written)
        self._step: tuple[str, float] | None = None  # (label, planned seconds)
        self._step_ran = False
        self._last_tick_line: float | None = None
        self._held: str | None = None  # the last unit's line, not written yet (thinned)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._last_unit_line = self._clock()
            self._write(held)

    def _write(self, text: str) -> None:
        elapsed = self._clock() - self._started
        done_now = self._done - self._done_before
        if self._total and self._done >= self._total:
            eta = "ETA 0:00"
        elif done_now > 0:
            eta = f"ETA {_clock((self._total - self._done) * elapsed / done_now)}"
        else:
            eta = "ETA unknown"
        where = f"{self._done}/{self._total} {self._unit}" if self._total else "starting"
        self._stream.write(f"[{_clock(elapsed)} elapsed, {where}, {eta}] {_plain(text)}\n")
        self._stream.flush()

    def start(self, total: int, done: int, unit: str) -> None:
        self._started = self._last_unit = self._clock()
        self._total, self._done, self._done_before, self._unit = max(total, 0), done, done, unit
        self._write(f"{total} {unit} to run" + (f", {done} done before" if done else ""))

    def describe(self, text: str) -> None:
        now = self._clock()
        masked = _COUNTER.sub("#", text)
        if (
            self._last_status is not None
            and self._last_status[0] == masked
            and now - self._last_status[1] < self._every_s
        ):
            return
        self._last_status = (masked, now)
        self._release()
        self._write(text)

    def note(self, text: str) -> None:
        self._release()
        self._write(text)

    def advance(self, detail: str = "") -> None:
        self._done += 1
        now = self._clock()
        first = self._done - self._done_before == 1
        last = self._done >= self._total
        long = now - self._last_unit >= self._every_s / 2
        due = self._last_unit_line is None or now - self._last_unit_line >= self._every_s
        line = f"done: {detail}" if detail else "done"
        self._held, self._last_unit = None, now
        if first or last or self._step_ran or long or due:
            self._last_unit_line = now
            self._write(line)
        else:
            self._held = line
        self._step_ran = False

    def begin_step(self, label: str, seconds: float) -> None:
        self._step = (label, seconds)
        self._step_ran = True
        self._last_tick_line = self._clock()

    def tick(self, elapsed_s: float, detail: str) -> None:
        now = self._clock()
        if self._step is None or (self._last_tick_line is not None and now - self._last_tick_line < self._tick_every_s):
            return
        self._last_tick_line = now
        label, seconds = self._step
        self._write(f"{label}: {_clock(elapsed_s)} of {_clock(seconds)}, {detail}")

    def end_step(self) -> None:
        self._step = None


def progress_for(console: Console) -> RichProgress | PlainProgress:
    """Rich bars on a terminal, plain lines (no ANSI codes) on a pipe or a CI log; both are context managers."""
    if console.is_terminal:
        return RichProgress(console)
    return PlainProgress(console.file)
