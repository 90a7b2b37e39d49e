"""The installed distribution exposes one top-level name, ``kvbench``; the tree keeps its folders.

``setup.py`` maps each top-level package folder under ``kvbench`` in a wheel and rewrites its imports
(``from harness.x import y`` -> ``from kvbench.harness.x import y``). These tests load that rewrite, hold every
module of the tree to the one import form it can rewrite, and (integration tier) build a real wheel and import
every module from it alone.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def setup_module_functions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvbench_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # __name__ is not "__main__": setup() does not run
    return module


SETUP = setup_module_functions()


def test_imports_of_the_stages_move_under_kvbench_and_nothing_else_changes() -> None:
    source = (
        '"""Doc."""\n'
        "from __future__ import annotations\n"
        "from harness.runs import spine\n"
        "    from common.errors import KvbenchError\n"
        "from harnessing import x\n"
        "from .kinds import launch\n"
        "import json\n"
        "from scenarios import BUNDLED\n"
        'NOTE = "from harness import nothing"\n'
    )
    rewritten = SETUP.rewrite_imports(source)
    assert rewritten.splitlines() == [
        '"""Doc."""',
        "from __future__ import annotations",
        "from kvbench.harness.runs import spine",
        "    from kvbench.common.errors import KvbenchError",
        "from harnessing import x",
        "from .kinds import launch",
        "import json",
        "from kvbench.scenarios import BUNDLED",
        'NOTE = "from harness import nothing"',
    ]


def test_a_bare_import_of_a_stage_is_refused() -> None:
    with pytest.raises(ValueError, match=r"line 2: 'import harness\.\.\.' binds another name"):
        SETUP.rewrite_imports("import json\nimport harness.scenario.spec\n")


def test_every_module_of_the_tree_can_be_rewritten() -> None:
    for package in ("kvbench", *SETUP.STAGES):
        for path in (ROOT / package).rglob("*.py"):
            SETUP.rewrite_imports(path.read_text(encoding="utf-8"))  # raises on a bare stage import


IMPORT_ALL = """
import importlib, pkgutil, sys
import kvbench
names = [m.name for m in pkgutil.walk_packages(kvbench.__path__, "kvbench.")]
for name in names:
    if name.endswith(("host_link_probe", "__main__")):  # the engine's python runs one, `python -m` the other
        continue
    importlib.import_module(name)
leaked = sorted({"common", "harness", "workloads", "offload", "reports", "scenarios"} & set(sys.modules))
print(len(names), "modules;", "leaked:", leaked)
assert not leaked, leaked
"""


@pytest.mark.integration
def test_the_wheel_holds_only_kvbench_and_every_module_imports_from_it_alone(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("kvbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    assert {name.split("/")[0] for name in names} == {"kvbench", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "kvbench/scenarios/quickstart.yaml" in names and "kvbench/py.typed" in names
    assert "kvbench/harness/results/schemas/summary.schema.json" in names  # kvbench schema NAME prints these
    # the extracted wheel first on the path, run from an empty folder: the checkout is not importable
    imported = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr
