"""Running a long async job so that Ctrl-C and SIGTERM stop it cleanly.

SIGTERM becomes a cancellation of the job's task, so its ``async with`` blocks stop the engines and
the records already written stay on disk; the caller turns :class:`Interrupted` into a message that
says how to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Interrupted(Exception):
    """The job was stopped by Ctrl-C or SIGTERM after its engines were shut down."""


async def _cancel_on_sigterm(job: Callable[[], Awaitable[T]]) -> T:
    task = asyncio.ensure_future(job())
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGTERM)


def run_interruptible(job: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(job())``, raising :class:`Interrupted` on Ctrl-C or SIGTERM."""
    try:
        return asyncio.run(_cancel_on_sigterm(job))
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise Interrupted from None
