"""A rich progress bar that implements the runner's ProgressSink."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class RichProgress:
    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description:<40}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def start(self, total: int, description: str) -> None:
        if self._task is None:
            self._task = self._progress.add_task(description, total=total)
        else:
            self._progress.update(self._task, total=total, completed=0, description=description)

    def advance(self, description: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=1, description=description)

    def describe(self, description: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=description)
