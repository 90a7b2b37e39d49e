"""``kvbench run``, ``sweep``, ``soak``, ``replay``, ``report`` and ``merge``: every run kind through one launcher.

Each command only parses its flags; :func:`launch_kind` starts or resumes the run through the
run-kind table (``harness.runs.kinds``), writes every report registered for the kind
(``reports.outputs``) and turns the verdict into the exit code: 0 valid, 1 FAILED, 2 cannot run
or read, 3 INCONCLUSIVE.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_type_hints

import typer
from rich.console import Console

from common.markup import console_text
from harness.scenario.flag_fields import ALL_WORKLOAD_FIELDS, ENDPOINT_FIELDS, WORKLOAD_FIELDS, FlagKind

from .console import console, emit_json, fail, json_stdout, os_error, verdict_exit
from .options import JsonFlag, OutputDirOption, RayOption, SetOption, ShardOption, StartAtOption, WorkersOption

if TYPE_CHECKING:
    from harness.results.verdict import Outcome
    from harness.runs.kinds import LaunchOverrides
    from harness.runs.shard import Shard
    from harness.scenario.flags import EndpointFlags
    from harness.scenario.spec import Scenario
    from harness.store.rundir import RunDir, RunKind


ONLY_ARMS = typer.Option(
    "--arm",
    help="Run only this arm now (repeatable); the others stay pending, and --resume RUN_DIR runs them later. "
    "Without a scenario, NAME=URL (or NAME:PROFILE=URL) measures that endpoint as an arm; the first is the baseline.",
)

# Flags-only runs (no scenario file): one option per EndpointFlags field, the endpoint to measure and the workload's
# main knobs (harness.scenario.flag_fields says which command takes which; harness.scenario.flags builds the scenario).
# A new option is one entry here, one EndpointFlags field and its place in flag_fields.
ENDPOINT_OPTIONS: dict[str, object] = {
    "base_url": Annotated[
        str | None, typer.Option(help="Measure this OpenAI-compatible endpoint (no scenario file needed).")
    ],
    "offload": Annotated[
        str | None,
        typer.Option(
            help="With --base-url: what the endpoint offloads, a built-in profile (off, hbm, cpu, disk, shared; "
            "default hbm: a GPU prefix cache, no tier); with --arm give NAME:PROFILE=URL."
        ),
    ],
    "baseline": Annotated[str | None, typer.Option(help="With --arm NAME=URL: the baseline arm (default: the first).")],
    "model": Annotated[str | None, typer.Option(help="Model name to send (default: the one GET /v1/models lists).")],
    "api_key_env": Annotated[str | None, typer.Option(help="Environment variable holding the endpoint's API key.")],
    "tokenizer": Annotated[
        str | None,
        typer.Option(
            help="Where the endpoint has no /tokenize: the served model's tokenizer.json or its directory "
            "(default: kvbench's word tokenizer; the server's usage gives the true lengths)."
        ),
    ],
    "concurrency": Annotated[
        str | None, typer.Option(help="With --base-url: users at each load point, e.g. 1,4,16,64.")
    ],
    "duration": Annotated[
        str | None, typer.Option(help="With --base-url: each point's measured window (default 60s).")
    ],
    "warmup": Annotated[
        str | None, typer.Option(help="With --base-url: each point's unmeasured lead-in (default 10s).")
    ],
    "contexts": Annotated[str | None, typer.Option(help="Context lengths in tokens, e.g. 8000,32000.")],
    "conversations": Annotated[
        int | None,
        typer.Option(help="Conversations per length (sweep: distinct users, default 2 x the largest concurrency)."),
    ],
    "turns": Annotated[int | None, typer.Option(help="Turns per conversation (sweep: rounds per session).")],
    "answer_tokens": Annotated[int | None, typer.Option(help="max_tokens of every answer.")],
    "trace": Annotated[Path | None, typer.Option(help="With --base-url: the trace file to replay.")],
    "gpu_kv_tokens": Annotated[
        int | None,
        typer.Option(
            help="The endpoint's GPU KV-cache capacity in tokens: sizes the filler traffic that evicts turn 1's KV "
            "where the endpoint cannot reset its prefix cache (default: what its /metrics reports)."
        ),
    ],
}
"""Each option's type and help; its flag is the field's name with dashes (``--answer-tokens``)."""


def endpoint_options(kind: FlagKind) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command of ``kind`` with the endpoint options it takes appended to its own, whose values it receives as one
    ``flags: EndpointFlags`` argument (with its ``arms`` and ``output_dir``)."""
    fields = (*ENDPOINT_FIELDS, *WORKLOAD_FIELDS[kind])

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        # the command's own annotations resolved for Typer; "flags" is filled here, so its type (imported for
        # type checking only) is not needed
        hints = get_type_hints(command, localns={"EndpointFlags": object}, include_extras=True)
        own = [
            parameter.replace(annotation=hints[parameter.name])
            for parameter in inspect.signature(command).parameters.values()
            if parameter.name != "flags"
        ]
        added = [
            inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ENDPOINT_OPTIONS[field])
            for field in fields
        ]

        @functools.wraps(command)
        def with_flags(**values: object) -> None:
            from harness.scenario.flags import EndpointFlags

            options = {field: values.pop(field) for field in fields}
            arms = values.get("arms")
            output_dir = values.get("output_dir")
            options |= {"arms": tuple(arms) if isinstance(arms, list) else (), "output_dir": str(output_dir or "runs")}
            command(**values, flags=EndpointFlags.from_options(options))

        parameters = [*own, *added]
        with_flags.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        with_flags.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        return with_flags

    return decorate


def shard_overrides(shard: str | None, start_at: str | None, resume: Path | None) -> tuple[Shard | None, float | None]:
    """``--shard`` and ``--start-at`` as :class:`LaunchOverrides` fields; a one-line error (exit 2) for a bad value
    or with ``--resume`` (a resumed shard keeps the shard and start its manifest records)."""
    from common.errors import KvbenchError
    from harness.runs.shard import Shard, parse_start_at

    if resume is not None and (shard is not None or start_at is not None):
        raise fail("--shard/--start-at: --resume keeps the shard and start the run directory's manifest records")
    try:
        parsed = Shard.parse(shard) if shard is not None else None
        return parsed, parse_start_at(start_at) if start_at is not None else None
    except KvbenchError as error:
        raise fail(str(error)) from None


def flag_scenario(kind: FlagKind, flags: EndpointFlags, scenario: str | None, resume: Path | None) -> Scenario | None:
    """The scenario the flags describe (None when they name no endpoint); one-line errors for flags that clash."""
    from common.errors import KvbenchError
    from harness.engines.openai import confirm_endpoints, shared_url_note
    from harness.scenario.flags import scenario_from_flags

    if not flags.given:
        if scenario is None and resume is None and flags.arms:  # before the flags that go with it are blamed
            raise fail(
                f"--arm {flags.arms[0]!r}: give NAME=URL to measure an endpoint, or a scenario whose arm it names"
            )
        given = list(flags.typed((*ENDPOINT_FIELDS, *ALL_WORKLOAD_FIELDS)))
        if given:
            raise fail(f"{given[0]} goes with --base-url URL or --arm NAME=URL (a scenario file sets it in its YAML)")
        return None
    if scenario is not None or resume is not None:
        raise fail("give a scenario, --resume RUN_DIR, or an endpoint (--base-url URL / --arm NAME=URL): one of them")
    try:
        built = scenario_from_flags(kind, flags)
        if flags.model is not None:  # discovery did not reach the endpoints: reach them before a run directory
            confirm_endpoints(built.engine)
        note = shared_url_note(built.engine, [(arm.name, arm.offload) for arm in built.arms])
        if note is not None:
            console.print(note, highlight=False, markup=False)
        return built
    except KvbenchError as error:
        raise fail(str(error)) from None


def launch_endpoint_kind(
    kind: FlagKind,
    scenario: str | None,
    flags: EndpointFlags,
    output_dir: Path | None,
    resume: Path | None,
    arms: list[str] | None,
    sets: list[str] | None,
    json: bool,
    shard: str | None,
    start_at: str | None,
) -> None:
    """What ``kvbench run``, ``sweep`` and ``replay`` do once parsed: the scenario (a file, a bundled name, or the
    endpoint flags'), launched through :func:`launch_kind`; then the run directory and the command that rebuilds its
    reports told. ``arms`` (``--arm NAME``) pick a scenario's arms; with endpoint flags the arms are the flags'."""
    from harness.runs.kinds import LaunchOverrides

    with json_stdout(json):
        sharded, start = shard_overrides(shard, start_at, resume)
        built = flag_scenario(kind, flags, scenario, resume)
        overrides = LaunchOverrides(arms=() if built is not None else tuple(arms or ()), shard=sharded, start_at=start)
        run_dir = launch_kind(
            kind, built or scenario, output_dir=output_dir, resume=resume, overrides=overrides, sets=sets or ()
        )
        path = console_text(run_dir.path)
        rebuild = "redraw" if kind == "sweep" else "rebuild reports"
        console.print(f"Run directory: [bold]{path}[/]  ({rebuild}: kvbench report {path})", highlight=False)


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
    from harness.results.merge import merge_lines, merge_outcome
    from harness.results.verdict import outcome_of_result, worst
    from harness.runs.kinds import results_of, summarize
    from harness.store.rundir import RunDir
    from reports.outputs import write_outputs

    run_dir = RunDir.open(path)
    results = summarize(run_dir) if into is None else results_of(run_dir)
    merged = merge_outcome(run_dir)  # a merged run: also whether its shards make one run
    outcome = worst([outcome_of_result(results.result), *([merged] if merged is not None else [])])
    emit_json(results.result.file_text())
    out.print(f"{run_dir.path}: a {run_dir.kind} run", highlight=False, markup=False)
    for line in merge_lines(run_dir):
        out.print(line, highlight=False, markup=False)
    for written in write_outputs(run_dir, out, formats, results=results, into=into):
        out.print(f"wrote {written}", highlight=False, markup=False)
    return outcome


@endpoint_options("probe")
def run(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario YAML file or bundled scenario name (e.g. quickstart).")
    ] = None,
    output_dir: OutputDirOption = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted run directory.")] = None,
    arms: Annotated[list[str] | None, ONLY_ARMS] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    shard: ShardOption = None,
    start_at: StartAtOption = None,
    *,
    flags: EndpointFlags,
) -> None:
    """Run a scenario (or measure an endpoint: --base-url URL): every arm, the workload, then the t1/t2 TTFT table."""
    launch_endpoint_kind("probe", scenario, flags, output_dir, resume, arms, sets, json, shard, start_at)


@endpoint_options("sweep")
def sweep(
    scenario: Annotated[
        str | None,
        typer.Argument(help="Scenario with workload kind multi_user_qa or agentic (file or bundled name)."),
    ] = None,
    output_dir: OutputDirOption = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted sweep.")] = None,
    report_only: Annotated[
        Path | None, typer.Option("--report", help="Only rebuild sweep.json and the curves of a sweep run directory.")
    ] = None,
    arms: Annotated[list[str] | None, ONLY_ARMS] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    shard: ShardOption = None,
    start_at: StartAtOption = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
    *,
    flags: EndpointFlags,
) -> None:
    """Load sweep: per arm, the multi-user workload at each load; capacity curves, SLO, GPUs saved (workload kind
    agentic: concurrent agent sessions, agents at SLO per tier)."""
    if ray is not None or workers is not None:
        with json_stdout(json):
            if ray is None or workers is None or resume is not None or report_only is not None or shard is not None:
                raise fail(
                    "--ray ADDRESS and --workers N go together, with a scenario (not --resume, --report, --shard)"
                )
            _, start = shard_overrides(None, start_at, None)
            built = flag_scenario("sweep", flags, scenario, resume)
            sweep_on_ray(built or scenario, sets or (), ray, workers, output_dir, start)
        return
    if report_only is not None:
        if scenario is not None or resume is not None or sets:
            raise fail(
                "give exactly one of: a scenario, --resume RUN_DIR, --report RUN_DIR (--set goes with a scenario)"
            )
        report(run_dirs=[report_only], json=json)
        return
    launch_endpoint_kind("sweep", scenario, flags, output_dir, resume, arms, sets, json, shard, start_at)


def sweep_on_ray(
    scenario: str | Scenario | None,
    sets: Sequence[str],
    address: str,
    workers: int,
    output_dir: Path | None,
    start_at: float | None,
) -> None:
    """``kvbench sweep --ray ADDRESS --workers N``: the shards as Ray actors, merged into one run directory whose
    verdict is the exit code (a worker that died: INCONCLUSIVE)."""
    from common.errors import KvbenchError
    from harness.runs.ray_shards import run_on_ray, worker_lines
    from harness.scenario.spec import load_scenario, override_scenario

    if scenario is None:
        raise fail("--ray: give a scenario (a YAML file or a bundled name) or an endpoint (--base-url URL)")
    try:
        if isinstance(scenario, str):
            loaded, source = load_scenario(scenario, sets)
            where = str(source)
        else:
            loaded, where = override_scenario(scenario, sets), "the flags"
        run_dir = run_on_ray(
            loaded,
            where,
            workers=workers,
            address=None if address == "local" else address,
            parent=output_dir or Path(loaded.output.dir),
            start_at=start_at,
            say=lambda line: console.print(line, highlight=False, markup=False),
        )
        outcome = rebuild(run_dir.path)
    except KvbenchError as error:
        raise fail(str(error)) from None
    except OSError as error:
        raise fail(os_error(error)) from None
    for line in worker_lines(run_dir.path):
        console.print(line, highlight=False, markup=False)
    path = console_text(run_dir.path)
    console.print(f"Run directory: [bold]{path}[/]  (redraw: kvbench report {path})", highlight=False)
    verdict_exit([outcome], f" (run directory: {run_dir.path})")


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
    shard: ShardOption = None,
    start_at: StartAtOption = None,
) -> None:
    """Stability window: the workload at its target load; per-interval stats and a PASS/FAIL verdict."""
    from harness.runs.kinds import LaunchOverrides
    from harness.scenario.spec import parse_duration

    try:
        window_s = parse_duration(window) if window is not None else None
        interval_s = parse_duration(interval) if interval is not None else None
    except ValueError as error:
        raise fail(f"--window/--interval: {error}") from None
    sharded, start = shard_overrides(shard, start_at, resume)
    overrides = LaunchOverrides(
        window_s=window_s,
        interval_s=interval_s,
        load=load,
        arm=arm,
        load_from=load_from,
        load_fraction=load_fraction,
        shard=sharded,
        start_at=start,
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
    compress_results: Annotated[
        bool,
        typer.Option(
            "--compress-results",
            help="With --compress: its result file and the logs' JSON too, for a run nobody opens in a browser "
            "(the lab's); the manifest and report/ stay plain.",
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
    if compress_results and not compress:
        raise fail("--compress-results goes with --compress")
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
                    for packed in RunDir.open(path).pack_for_keeping(results=compress_results):
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


def merge(
    run_dirs: Annotated[
        list[Path], typer.Argument(metavar="RUN_DIR...", help="Every shard's run directory (--shard I/N) of one run.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The merged run directory to create (new, or an empty folder).")
    ],
    json: JsonFlag = False,
) -> None:
    """One run directory from a sharded run's shards: records united, every figure recomputed from them; exit 3 when
    a shard failed or the shards did not run a load point together."""
    from common.errors import KvbenchError

    with json_stdout(json):
        try:
            from harness.results.merge import merge_shards

            merged = merge_shards(run_dirs, out)
        except KvbenchError as error:
            raise fail(str(error)) from None
        except OSError as error:
            raise fail(os_error(error)) from None
        console.print(f"merged {len(run_dirs)} shards into {console_text(merged.path)}", highlight=False)
        try:
            outcome = rebuild(merged.path)
        except KvbenchError as error:
            raise fail(str(error)) from None
        verdict_exit([outcome], f" (run directory: {merged.path})")


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


@endpoint_options("replay")
def replay(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind trace (file or bundled name).")
    ] = None,
    output_dir: OutputDirOption = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue an interrupted replay (arms not finished run again).")
    ] = None,
    sets: SetOption = None,
    json: JsonFlag = False,
    arms: Annotated[
        list[str] | None, typer.Option("--arm", help="NAME=URL: replay on this endpoint as an arm (repeatable).")
    ] = None,
    shard: ShardOption = None,
    start_at: StartAtOption = None,
    *,
    flags: EndpointFlags,
) -> None:
    """Replay a timestamped trace on every arm: TTFT/TPOT/E2E, SLO, hit rate against the trace's ceiling."""
    # replay's --arm NAME=URL is an endpoint flag (in ``flags``), not a pick of the scenario's arms
    launch_endpoint_kind("replay", scenario, flags, output_dir, resume, None, sets, json, shard, start_at)
