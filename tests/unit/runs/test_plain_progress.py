"""Plain progress lines for a log (:class:`harness.runs.progress.PlainProgress`), on a clock the test moves.

ETA = (total - done) * elapsed / units done by this attempt; "ETA unknown" until one is done.
"""

from __future__ import annotations

import io

from rich.console import Console

from harness.runs.progress import PlainProgress, RichProgress, progress_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _progress(clock: Clock) -> tuple[PlainProgress, io.StringIO]:
    out = io.StringIO()
    return PlainProgress(out, every_s=10.0, tick_every_s=30.0, clock=clock), out


def test_each_line_has_elapsed_and_an_eta_from_the_units_done() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(10, 0, "requests")
    progress.describe("AMG-OFF: starting sim engine")
    clock.now += 4
    progress.advance("AMG-OFF 1000 tok t1")  # 1 of 10 in 4 s: 9 left at 4 s each
    clock.now += 4
    progress.advance("AMG-OFF 1000 tok t2")  # thinned (4 s after the last unit's line)
    clock.now += 12
    progress.advance("AMG-OFF 8000 tok t1")  # 3 in 20 s: 7 left, 46.7 s
    lines = out.getvalue().splitlines()
    assert lines == [
        "[0:00 elapsed, 0/10 requests, ETA unknown] 10 requests to run",
        "[0:00 elapsed, 0/10 requests, ETA unknown] AMG-OFF: starting sim engine",
        "[0:04 elapsed, 1/10 requests, ETA 0:36] done: AMG-OFF 1000 tok t1",
        "[0:20 elapsed, 3/10 requests, ETA 0:47] done: AMG-OFF 8000 tok t1",
    ]


def test_a_resumed_run_estimates_from_this_attempts_units_only() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(10, 6, "points")
    assert out.getvalue().splitlines()[-1] == "[0:00 elapsed, 6/10 points, ETA unknown] 10 points to run, 6 done before"
    clock.now += 30
    progress.advance("base @ 4 users: 80 measured")  # 1 unit in 30 s, 3 left
    assert out.getvalue().splitlines()[-1].startswith("[0:30 elapsed, 7/10 points, ETA 1:30] ")


def test_a_thinned_unit_is_written_before_the_next_arm_starts_and_the_last_always() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(4, 0, "requests")
    for detail in ("A t1", "A t2"):
        clock.now += 1
        progress.advance(detail)
    progress.describe("B: starting sim engine")
    clock.now += 1
    progress.advance("B t1")  # the attempt's first unit was A t1: thinned, then released on exit
    clock.now += 1
    progress.advance("B t2")
    text = out.getvalue()
    assert "done: A t1" in text and "done: B t2" in text
    assert text.index("done: A t2") < text.index("B: starting sim engine")
    assert "done: B t1" not in text
    assert text.splitlines()[-1] == "[0:04 elapsed, 4/4 requests, ETA 0:00] done: B t2"


def test_a_status_that_only_counts_up_and_step_ticks_are_rate_limited() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(2, 0, "points")
    for index in range(0, 500, 50):  # ten status lines within 5 s: one written
        clock.now += 0.5
        progress.describe(f"A: building prompts {index + 1}/500")
    clock.now += 20
    progress.describe("A: building prompts 501/500")  # the same counter 20 s later: written
    progress.begin_step("A @ 4 users", 120.0)
    for tick in range(1, 13):  # 120 s of ticks every 10 s: one line per 30 s
        clock.now += 10
        progress.tick(tick * 10.0, "40 requests")
    progress.end_step()
    progress.advance("A @ 4 users: 40 measured")
    lines = out.getvalue().splitlines()
    assert sum("building prompts" in line for line in lines) == 2
    assert [line.split("] ")[1] for line in lines if " of 2:00, " in line] == [
        f"A @ 4 users: {at} of 2:00, 40 requests" for at in ("0:30", "1:00", "1:30", "2:00")
    ]
    assert lines[-1].endswith("done: A @ 4 users: 40 measured")


def test_a_sweep_point_ran_as_a_step_always_gets_its_line() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(3, 0, "points")
    for value in (1, 2):
        progress.begin_step(f"A @ {value} users", 2.0)
        clock.now += 2
        progress.end_step()
        progress.advance(f"A @ {value} users: 9 measured")
    assert "done: A @ 1 users" in out.getvalue() and "done: A @ 2 users" in out.getvalue()


def test_no_terminal_codes_or_line_breaks_reach_the_log() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(1, 0, "requests")
    progress.note("arm \x1b[31mred\x1b[0m: engine died\nTraceback")
    (line,) = out.getvalue().splitlines()[1:]
    assert "\x1b" not in line and line.endswith("arm  [31mred [0m: engine died Traceback")


def test_the_console_picks_bars_on_a_terminal_and_lines_elsewhere() -> None:
    piped = Console(file=io.StringIO())
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(progress_for(piped), PlainProgress)
    assert isinstance(progress_for(terminal), RichProgress)


def test_units_that_take_a_while_each_get_their_line() -> None:
    clock = Clock()
    progress, out = _progress(clock)
    progress.start(4, 0, "intervals")
    for index in range(4):  # soak intervals of 9.9 s: inside every_s of each other, but each a long unit
        clock.now += 9.9
        progress.advance(f"interval {index}")
    assert [line.split("] ")[1] for line in out.getvalue().splitlines()[1:]] == [
        f"done: interval {index}" for index in range(4)
    ]
