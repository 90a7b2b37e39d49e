"""Progress of a run, a sweep or a soak: one protocol, one no-op and one rich implementation.

Every run kind reports the same shape: an overall bar over its units of work (``requests`` for a
probe, ``points`` for a sweep, ``intervals`` for a soak), a line saying what is happening now, and,
where one unit takes a while (a sweep point's warm-up and window), an inner bar over that unit's
seconds.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

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
