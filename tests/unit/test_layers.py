"""The folders form a one-way graph: an ``ast`` walk over every module fails on any import that breaks it.

Layers (a module's layer is its top-level package; inside ``harness`` its stage package):

* ground floor ``common`` (errors, redact, schema, ...) imports nothing of kvbench's;
* ``workloads`` and ``offload`` import the ground floor only;
* ``harness.<stage>`` imports workloads, offload, the ground floor and the harness stages listed
  for it in :data:`HARNESS_STAGES` (a DAG: client < engines < sim < scenario < store < results <
  runs, gate); the scenario stage also reads the bundled ``scenarios`` package's files;
* ``reports`` reads results: harness.results, harness.store, harness.scenario, harness.gate,
  workloads and offload (for the types stored in a run directory), the ground floor;
* the top floor, ``kvbench`` (the command line) and ``benchmarks``, may import everything; nothing imports it.

An import is any way a module reaches another: ``import``/``from`` statements (relative ones resolved),
``importlib.import_module``/``__import__`` calls, ``importlib.resources.files`` (a package's data), and
``"package.module:attribute"`` strings (how entry points and registries name code). A top-level folder
that is neither a package in the graph nor a known folder outside it fails the test, so a new folder
cannot slip past the graph.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import NOT_THE_TREE_AT_TOP

ROOT = Path(__file__).resolve().parents[2]
GROUND = "common"
CLI = "kvbench"
TOP_FLOOR = {CLI, "benchmarks"}
PACKAGES = ("kvbench", "common", "harness", "workloads", "offload", "reports", "scenarios", "benchmarks")
OUTSIDE_THE_GRAPH = {"docs", "lab", "scripts", "tests", "ci", "deploy"}
"""Top-level folders that hold no importable code: documentation, the lab, shell scripts, the tests (which
may import anything), CI and ``deploy`` (Kubernetes manifests and a Dockerfile). Hidden folders and what git
ignores (virtual environments, caches, build output) are not the tree's."""
NAMED_CODE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+):[A-Za-z_]\w*$")
IMPORT_CALLS = {"import_module", "__import__", "files"}

BELOW_RUNS = {
    "harness.client",
    "harness.engines",
    "harness.sim",
    "harness.scenario",
    "harness.store",
    "harness.results",
}
"""The stages a run may import: every stage below ``harness.runs``."""
HARNESS_STAGES: dict[str, set[str]] = {
    "harness.client": set(),
    "harness.engines": {"harness.client"},
    "harness.sim": {"harness.client", "harness.engines"},
    "harness.scenario": {"harness.engines", "harness.sim"},
    "harness.store": {"harness.client", "harness.engines", "harness.scenario"},
    "harness.results": {"harness.engines", "harness.sim", "harness.scenario", "harness.store"},
    "harness.runs": BELOW_RUNS,
    "harness.gate": {"harness.scenario", "harness.store", "harness.results"},
    "harness.calibrate": BELOW_RUNS | {"harness.runs"},
}
READS_BUNDLED_FILES = {"harness.scenario": {"scenarios"}}
ALLOWED: dict[str, set[str]] = {
    GROUND: set(),
    "workloads": {GROUND},
    "offload": {GROUND},
    "scenarios": set(),
    "harness": set(),
    "reports": {
        GROUND,
        "workloads",
        "offload",
        "harness.results",
        "harness.store",
        "harness.scenario",
        "harness.gate",
    },
    **{
        stage: {GROUND, "workloads", "offload", *deps, *READS_BUNDLED_FILES.get(stage, set())}
        for stage, deps in HARNESS_STAGES.items()
    },
}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "harness" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every way ``path`` reaches a kvbench package (see the module docstring)."""
    module, is_package = module_name(path, root)
    package = module if is_package else module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.Call) and _called_name(node) in IMPORT_CALLS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = NAMED_CODE.match(node.value)
            if named:
                found.append((node.lineno, named.group(1)))
    return [(line, target) for line, target in found if target.split(".")[0] in PACKAGES]


def violations(root: Path) -> list[str]:
    out: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = layer(module_name(path, root)[0])
            for line, target in imports_of(path, root):
                dest = layer(target)
                if dest == source or source in TOP_FLOOR:
                    continue
                if dest in TOP_FLOOR or dest not in ALLOWED.get(source, set()):
                    out.append(f"{path.relative_to(root)}:{line}: {source} may not import {target} ({dest})")
    return out


def unknown_folders(root: Path) -> list[str]:
    folders = {path.name for path in root.iterdir() if path.is_dir() and not NOT_THE_TREE_AT_TOP.match(path.name)}
    return sorted(folders - set(PACKAGES) - OUTSIDE_THE_GRAPH)


def test_the_folders_import_one_way() -> None:
    assert violations(ROOT) == []


def test_every_top_level_folder_is_in_the_graph_or_known_to_be_outside_it() -> None:
    assert unknown_folders(ROOT) == []


def test_every_module_belongs_to_a_known_layer() -> None:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            assert layer(module_name(path, ROOT)[0]) in {*ALLOWED, *TOP_FLOOR}, path


def test_the_harness_stages_form_a_dag() -> None:
    order: list[str] = []
    pending = dict(HARNESS_STAGES)
    while pending:
        ready = [stage for stage, deps in pending.items() if deps <= set(order)]
        assert ready, f"a cycle among {sorted(pending)}"
        order += ready
        for stage in ready:
            del pending[stage]


def _tree(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("workloads/bad.py", "from harness.scenario.spec import Scenario\n"),
        ("offload/bad.py", "from harness.engines import base\n"),
        ("harness/engines/bad.py", "from ..runs import spine\n"),
        ("harness/store/bad.py", "from harness.results.aggregate import aggregate\n"),
        ("harness/runs/bad.py", "from reports.outputs import write_outputs\n"),
        ("reports/bad.py", "import harness.runs.probe\n"),
        ("common/bad.py", "from kvbench.cli import app\n"),
        ("harness/runs/bad.py", "from kvbench.cli import app\n"),
        ("harness/engines/bad.py", 'FACTORY = "harness.sim.engine:SimEngine"\n'),
        ("harness/engines/bad.py", 'import importlib\nengine = importlib.import_module("harness.sim.engine")\n'),
        ("harness/client/bad.py", 'engines = __import__("harness.engines.kinds")\n'),
        ("offload/bad.py", 'from importlib import resources\nroot = resources.files("scenarios")\n'),
        ("harness/sim/bad.py", 'from importlib import import_module\nbench = import_module("benchmarks.sweep")\n'),
    ],
)
def test_a_forbidden_import_fails(tmp_path: Path, where: str, line: str) -> None:
    _tree(tmp_path)
    target = tmp_path / where
    target.parent.mkdir(parents=True, exist_ok=True)
    (target.parent / "__init__.py").touch()
    target.write_text(line)
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(where), found


def test_a_permitted_import_passes(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / "harness" / "runs").mkdir()
    (tmp_path / "harness" / "runs" / "ok.py").write_text(
        "from harness.store.rundir import RunDir\nfrom workloads.config import MultiUserQA\nfrom ..results import x\n"
        'LOADER = "harness.results.aggregate:summarize_run_dir"\nNOTE = "see harness.sim: it is not named as code"\n'
    )
    (tmp_path / "harness" / "scenario").mkdir()
    (tmp_path / "harness" / "scenario" / "ok.py").write_text(
        'from importlib import resources\nroot = resources.files("scenarios")\n'
    )
    assert violations(tmp_path) == []


def test_an_unknown_top_level_folder_fails(tmp_path: Path) -> None:
    _tree(tmp_path)
    for folder in ("docs", ".venv-vllm", "kvbench.egg-info", "tools"):
        (tmp_path / folder).mkdir()
    assert unknown_folders(tmp_path) == ["tools"]
