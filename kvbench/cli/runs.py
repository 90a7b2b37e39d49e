"""``kvbench run``, ``sweep``, ``soak``, ``replay`` and ``report``: every run kind through one launcher.

Each command only parses its flags; :func:`launch_kind` starts or resumes the run through the
run-kind table (``harness.runs.kinds``), writes every report registered for the kind
(``reports.outputs``) and turns the verdict into the exit code: 0 valid, 1 FAILED, 2 cannot run
or read, 3 INCONCLUSIVE.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from common.markup import console_text

from .console import console, emit_json, fail, json_stdout, os_error, verdict_exit
from .options import JsonFlag, SetOption

if TYPE_CHECKING:
    from harness.results.verdict import Outcome
    from harness.runs.kinds import LaunchOverrides
    from harness.scenario.flags import EndpointFlags, FlagKind
    from harness.scenario.spec import Scenario
    from harness.store.rundir import RunDir, RunKind


ONLY_ARMS = typer.Option(
    "--arm",
    help="Run only this arm now (repeatable); the others stay pending, and --resume RUN_DIR runs them later. "
    "Without a scenario, NAME=URL (or NAME:PROFILE=URL) measures that endpoint as an arm; the first is the baseline.",
)

# Flags-only runs (no scenario file): the endpoint to measure and the multi-round QA workload's main knobs
# (harness.scenario.flags builds the scenario from them).
BASE_URL = typer.Option("--base-url", help="Measure this OpenAI-compatible endpoint (no scenario file needed).")
BASELINE = typer.Option("--baseline", help="With --arm NAME=URL: the baseline arm (default: the first).")
MODEL = typer.Option("--model", help="Model name to send (default: the one GET /v1/models lists).")
API_KEY_ENV = typer.Option("--api-key-env", help="Environment variable holding the endpoint's API key.")
TOKENIZER = typer.Option(
    "--tokenizer",
    help="Where the endpoint has no /tokenize: the served model's tokenizer.json or its directory "
    "(default: kvbench's word tokenizer; the server's usage gives the true lengths).",
)
CONTEXTS = typer.Option("--contexts", help="Context lengths in tokens, e.g. 8000,32000.")
CONVERSATIONS = typer.Option(
    "--conversations", help="Conversations per length (sweep: distinct users, default 2 x the largest concurrency)."
)
TURNS = typer.Option("--turns", help="Turns per conversation (sweep: rounds per session).")
ANSWER_TOKENS = typer.Option("--answer-tokens", help="max_tokens of every answer.")


def flag_scenario(kind: FlagKind, flags: EndpointFlags, scenario: str | None, resume: Path | None) -> Scenario | None:
    """The scenario the flags describe (None when they name no endpoint); one-line errors for flags that clash."""
    from common.errors import KvbenchError
    from harness.scenario.flags import scenario_from_flags

    if not flags.given:
        endpoint_only = {
            "--baseline": flags.baseline,
            "--model": flags.model,
            "--api-key-env": flags.api_key_env,
            "--tokenizer": flags.tokenizer,
            "--contexts": flags.contexts,
            "--conversations": flags.conversations,
            "--turns": flags.turns,
            "--answer-tokens": flags.answer_tokens,
            "--concurrency": flags.concurrency,
            "--duration": flags.duration,
            "--warmup": flags.warmup,
            "--trace": flags.trace,
        }
        given = [flag for flag, value in endpoint_only.items() if value is not None]
        if given:
            raise fail(f"{given[0]} goes with --base-url URL or --arm NAME=URL (a scenario file sets it in its YAML)")
        if scenario is None and resume is None and flags.arms:
            raise fail(
                f"--arm {flags.arms[0]!r}: give NAME=URL to measure an endpoint, or a scenario whose arm it names"
            )
        return None
    if scenario is not None or resume is not None:
        raise fail("give a scenario, --resume RUN_DIR, or an endpoint (--base-url URL / --arm NAME=URL): one of them")
    try:
        return scenario_from_flags(kind, flags)
    except KvbenchError as error:
        raise fail(str(error)) from None


def launch_kind(
    kind: RunKind,
    scenario: str | Scenario | None,
    *,
    output_dir: Path | None,
    resume: Path | None,
    overrides: LaunchOverrides | None = None,
    sets: Sequence[str] = (),
) -> RunDir:
    """Start (or resume) a run of ``kind`` through the one spine, then write every report of it; ``sets``: the
    ``--set`` overrides of the scenario (with ``--resume``: re-applied to the original file where the stored
    scenario had its secrets removed)."""
    from common.errors import KvbenchError, RunInterrupted
    from harness.results.verdict import outcome_of_result
    from harness.runs.kinds import LaunchOverrides, launch
    from harness.runs.progress import progress_for
    from harness.scenario.spec import load_scenario, override_scenario
    from harness.store.rundir import RunDir
    from reports.outputs import write_outputs

    if (scenario is None) == (resume is None):
        raise fail("give either a scenario (a YAML file or a bundled name such as 'quickstart') or --resume RUN_DIR")
    try:
        # a str names a file or a bundled scenario; a Scenario was built from flags (harness.scenario.flags)
        loaded: Scenario | None
        source: Path | None
        if isinstance(scenario, str):
            loaded, source = load_scenario(scenario, sets)
        else:
            loaded, source = (override_scenario(scenario, sets) if scenario is not None else None), None
        if resume is not None:
            overrides = dataclasses.replace(overrides or LaunchOverrides(), scenario_set=tuple(sets))
        with progress_for(console) as progress:
            run_dir, result = launch(
                kind,
                loaded,
                source=source,
                output_dir=output_dir,
                resume=resume,
                progress=progress,
                overrides=overrides,
            )
        write_outputs(run_dir, console)
        emit_json(run_dir.path / result.FILE_NAME)
    except RunInterrupted as stopped:
        # the result file and reports would otherwise be an earlier attempt's (or none): rebuild them from what
        # this one kept, then say how to resume
        try:
            # quietly: a stopped run's verdict is not its exit code
            rebuild(stopped.run_dir, Console(file=io.StringIO()))
            console.print("its result file and reports now show what it measured", highlight=False, markup=False)
        except (KvbenchError, OSError) as error:
            console.print(f"no result rebuilt from the records kept: {error}", highlight=False, markup=False)
        raise fail(str(stopped)) from None
    except KvbenchError as error:
        raise fail(str(error)) from None
    except OSError as error:  # an output path that cannot be written: one line, not a traceback
        raise fail(os_error(error)) from None
    assert isinstance(run_dir, RunDir)
    verdict_exit([outcome_of_result(result)], f" (run directory: {run_dir.path})")
    return run_dir


def rebuild(
    path: Path, out: Console = console, formats: set[str] | None = None, *, into: Path | None = None
) -> Outcome:
    """Rebuild a run directory's result file and its reports (``formats``; None: the default ones) from its stored
    files, telling ``out``; its outcome. ``into`` None: rewrite the run directory's result files and ``report/``;
    a folder: leave the run directory as it is and write the reports there."""
    from harness.results.verdict import outcome_of_result
    from harness.runs.kinds import results_of, summarize
    from harness.store.rundir import RunDir
    from reports.outputs import write_outputs

    run_dir = RunDir.open(path)
    results = summarize(run_dir) if into is None else results_of(run_dir)
    outcome = outcome_of_result(results.result)
    emit_json(results.result.file_text())
    out.print(f"{run_dir.path}: a {run_dir.kind} run", highlight=False, markup=False)
    for written in write_outputs(run_dir, out, formats, results=results, into=into):
        out.print(f"wrote {written}", highlight=False, markup=False)
    return outcome


def run(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario YAML file or bundled scenario name (e.g. quickstart).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted run directory.")] = None,
    arms: Annotated[list[str] | None, ONLY_ARMS] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    base_url: Annotated[str | None, BASE_URL] = None,
    baseline: Annotated[str | None, BASELINE] = None,
    model: Annotated[str | None, MODEL] = None,
    api_key_env: Annotated[str | None, API_KEY_ENV] = None,
    tokenizer: Annotated[str | None, TOKENIZER] = None,
    contexts: Annotated[str | None, CONTEXTS] = None,
    conversations: Annotated[int | None, CONVERSATIONS] = None,
    turns: Annotated[int | None, TURNS] = None,
    answer_tokens: Annotated[int | None, ANSWER_TOKENS] = None,
) -> None:
    """Run a scenario (or measure an endpoint: --base-url URL): every arm, the workload, then the t1/t2 TTFT table."""
    from harness.runs.kinds import LaunchOverrides
    from harness.scenario.flags import EndpointFlags

    flags = EndpointFlags(
        base_url=base_url,
        arms=tuple(arms or ()),
        baseline=baseline,
        model=model,
        api_key_env=api_key_env,
        tokenizer=tokenizer,
        contexts=contexts,
        conversations=conversations,
        turns=turns,
        answer_tokens=answer_tokens,
        output_dir=str(output_dir or "runs"),
    )
    with json_stdout(json):
        built = flag_scenario("probe", flags, scenario, resume)
        overrides = LaunchOverrides(arms=() if built is not None else tuple(arms or ()))
        run_dir = launch_kind(
            "probe", built or scenario, output_dir=output_dir, resume=resume, overrides=overrides, sets=sets or ()
        )
        path = console_text(run_dir.path)
        console.print(f"Run directory: [bold]{path}[/]  (rebuild reports: kvbench report {path})", highlight=False)


def sweep(
    scenario: Annotated[
        str | None,
        typer.Argument(help="Scenario with workload kind multi_user_qa or agentic (file or bundled name)."),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted sweep.")] = None,
    report_only: Annotated[
        Path | None, typer.Option("--report", help="Only rebuild sweep.json and the curves of a sweep run directory.")
    ] = None,
    arms: Annotated[list[str] | None, ONLY_ARMS] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    base_url: Annotated[str | None, BASE_URL] = None,
    baseline: Annotated[str | None, BASELINE] = None,
    model: Annotated[str | None, MODEL] = None,
    api_key_env: Annotated[str | None, API_KEY_ENV] = None,
    tokenizer: Annotated[str | None, TOKENIZER] = None,
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", help="With --base-url: users at each load point, e.g. 1,4,16,64.")
    ] = None,
    duration: Annotated[
        str | None, typer.Option("--duration", help="With --base-url: each point's measured window (default 60s).")
    ] = None,
    warmup: Annotated[
        str | None, typer.Option("--warmup", help="With --base-url: each point's unmeasured lead-in (default 10s).")
    ] = None,
    contexts: Annotated[str | None, CONTEXTS] = None,
    conversations: Annotated[int | None, CONVERSATIONS] = None,
    turns: Annotated[int | None, TURNS] = None,
    answer_tokens: Annotated[int | None, ANSWER_TOKENS] = None,
) -> None:
    """Load sweep: per arm, the multi-user workload at each load; capacity curves, SLO, GPUs saved (workload kind
    agentic: concurrent agent sessions, agents at SLO per tier)."""
    if report_only is not None:
        if scenario is not None or resume is not None or sets:
            raise fail(
                "give exactly one of: a scenario, --resume RUN_DIR, --report RUN_DIR (--set goes with a scenario)"
            )
        report(run_dirs=[report_only], json=json)
        return
    from harness.runs.kinds import LaunchOverrides
    from harness.scenario.flags import EndpointFlags

    flags = EndpointFlags(
        base_url=base_url,
        arms=tuple(arms or ()),
        baseline=baseline,
        model=model,
        api_key_env=api_key_env,
        tokenizer=tokenizer,
        contexts=contexts,
        conversations=conversations,
        turns=turns,
        answer_tokens=answer_tokens,
        concurrency=concurrency,
        duration=duration,
        warmup=warmup,
        output_dir=str(output_dir or "runs"),
    )
    with json_stdout(json):
        built = flag_scenario("sweep", flags, scenario, resume)
        overrides = LaunchOverrides(arms=() if built is not None else tuple(arms or ()))
        run_dir = launch_kind(
            "sweep", built or scenario, output_dir=output_dir, resume=resume, overrides=overrides, sets=sets or ()
        )
        path = console_text(run_dir.path)
        console.print(f"Run directory: [bold]{path}[/]  (redraw: kvbench report {path})", highlight=False)


def soak(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind multi_user_qa and a soak section.")
    ] = None,
    window: Annotated[str | None, typer.Option("--window", help="Window length, e.g. 4h, 90m, 24h.")] = None,
    interval: Annotated[str | None, typer.Option("--interval", help="Aggregation interval, e.g. 60s.")] = None,
    load: Annotated[
        float | None, typer.Option("--load", help="Target load in the sweep section's mode (users or req/s).")
    ] = None,
    arm: Annotated[str | None, typer.Option("--arm", help="Arm to run (default: the offload arm).")] = None,
    load_from: Annotated[
        Path | None,
        typer.Option(
            "--load-from", help="Sweep directory: run at --load-fraction of the arm's measured capacity within the SLO."
        ),
    ] = None,
    load_fraction: Annotated[
        float, typer.Option("--load-fraction", help="With --load-from: the share of that capacity (default 0.7).")
    ] = 0.7,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Parent of the soak directory (default: scenario).")
    ] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted window.")] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
) -> None:
    """Stability window: the workload at its target load; per-interval stats and a PASS/FAIL verdict."""
    from harness.runs.kinds import LaunchOverrides
    from harness.scenario.spec import parse_duration

    try:
        window_s = parse_duration(window) if window is not None else None
        interval_s = parse_duration(interval) if interval is not None else None
    except ValueError as error:
        raise fail(f"--window/--interval: {error}") from None
    overrides = LaunchOverrides(
        window_s=window_s, interval_s=interval_s, load=load, arm=arm, load_from=load_from, load_fraction=load_fraction
    )
    with json_stdout(json):
        run_dir = launch_kind(
            "soak", scenario, output_dir=output_dir, resume=resume, overrides=overrides, sets=sets or ()
        )
        path = console_text(run_dir.path)
        console.print(f"Soak directory: [bold]{path}[/]  (HTML: kvbench report --html {path})", highlight=False)


def report(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories (kvbench run), soak directories (kvbench soak) or sweep directories."),
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="Also write one self-contained HTML case study from the stored files.")
    ] = False,
    formats: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            "-f",
            help="Write only these outputs (repeatable): a run kind's format (files, console, fleet) or html, "
            "the case study of every directory given.",
        ),
    ] = None,
    playbook: Annotated[
        Path | None, typer.Option("--playbook", help="With --html: take the runs attached to this playbook's stages.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="With --html: the HTML file (default: beside the playbook, else in the reports' folder); without: "
            "the folder for the reports (default: a new temporary folder). Not with --rewrite.",
        ),
    ] = None,
    rewrite: Annotated[
        bool,
        typer.Option(
            "--rewrite", help="Rewrite each run directory's result file and report/ (without it nothing there changes)."
        ),
    ] = False,
    compress: Annotated[
        bool,
        typer.Option(
            "--compress",
            help="With --rewrite: store the run's JSON Lines and logs compressed, for keeping it in a repository.",
        ),
    ] = False,
    json: JsonFlag = False,
) -> None:
    """Rebuild the result file (summary.json, sweep.json or soak.json) and every report from stored files alone; the
    run directory stays as it is unless --rewrite."""
    import tempfile

    from common.errors import KvbenchError
    from harness.store.rundir import RunDir
    from reports.html import HTML_FILE
    from reports.outputs import RUN_KINDS, report_html
    from reports.outputs import formats as registered

    dirs = list(run_dirs or [])
    allowed = registered([*RUN_KINDS, "case-study"])
    unknown = [name for name in formats or [] if name not in allowed]
    if unknown:
        raise fail(f"--format: unknown format {unknown[0]!r}; allowed: {', '.join(allowed)}")
    wanted = set(formats) if formats else None
    html = html or (wanted is not None and "html" in wanted)
    if not dirs and playbook is None:
        raise fail("give a run directory (or --html --playbook FILE)")
    if playbook is not None and not html:
        raise fail("--playbook goes with --html")
    if rewrite and out is not None and not html:
        raise fail("--out: --rewrite writes the reports into each run directory; give one or the other")
    if compress and not rewrite:
        raise fail("--compress goes with --rewrite (it changes the run directory)")
    outcomes: list[Outcome] = []
    with json_stdout(json):  # one directory: its result file; several: a JSON array of them
        try:
            # read-only: the reports go to a folder outside the run directories (--out without --html, else a new
            # temporary one), one subfolder per directory when several are given
            folder: Path | None = None
            if not rewrite and dirs:
                folder = out if out is not None and not html else Path(tempfile.mkdtemp(prefix="kvbench-report-"))
            for index, path in enumerate(dirs):
                into = None if folder is None else folder if len(dirs) == 1 else folder / f"{index + 1}-{path.name}"
                outcomes.append(rebuild(path, formats=None if wanted is None else wanted - {"html"}, into=into))
                if compress:
                    for packed in RunDir.open(path).pack_for_keeping():
                        console.print(f"compressed {packed}", highlight=False, markup=False)
            if html:
                if out is None and folder is not None and playbook is None:
                    out = folder / HTML_FILE
                console.print(f"wrote {report_html(dirs, playbook=playbook, out=out)}", highlight=False, markup=False)
        except KvbenchError as error:
            raise fail(str(error)) from None
        except OSError as error:
            raise fail(os_error(error)) from None
        verdict_exit(outcomes)


def versus(
    spec: Annotated[Path, typer.Argument(help="A published table and the runs that measure its columns (YAML).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the Markdown here (default: print it).")
    ] = None,
) -> None:
    """A published TTFT table beside kvbench's runs, with the analytical model's expectation per length."""
    from common.errors import KvbenchError
    from reports.published import render_published

    try:
        text = render_published(spec)
        if out is None:
            console.print(text, markup=False, highlight=False)
            return
        out.write_text(text, encoding="utf-8")
    except KvbenchError as error:
        raise fail(str(error)) from None
    except OSError as error:
        raise fail(os_error(error)) from None
    console.print(f"wrote {out}", highlight=False, markup=False)


def replay(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind trace (file or bundled name).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue an interrupted replay (arms not finished run again).")
    ] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    base_url: Annotated[str | None, BASE_URL] = None,
    arms: Annotated[
        list[str] | None, typer.Option("--arm", help="NAME=URL: replay on this endpoint as an arm (repeatable).")
    ] = None,
    baseline: Annotated[str | None, BASELINE] = None,
    model: Annotated[str | None, MODEL] = None,
    api_key_env: Annotated[str | None, API_KEY_ENV] = None,
    tokenizer: Annotated[str | None, TOKENIZER] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="With --base-url: the trace file to replay.")] = None,
) -> None:
    """Replay a timestamped trace on every arm: TTFT/TPOT/E2E, SLO, hit rate against the trace's ceiling."""
    from harness.scenario.flags import EndpointFlags

    flags = EndpointFlags(
        base_url=base_url,
        arms=tuple(arms or ()),
        baseline=baseline,
        model=model,
        api_key_env=api_key_env,
        tokenizer=tokenizer,
        trace=trace,
        output_dir=str(output_dir or "runs"),
    )
    with json_stdout(json):
        built = flag_scenario("replay", flags, scenario, resume)
        run_dir = launch_kind("replay", built or scenario, output_dir=output_dir, resume=resume, sets=sets or ())
        console.print(f"Run directory: [bold]{run_dir.path}[/]  (rebuild reports: kvbench report {run_dir.path})")
