"""kvbench's distribution exposes one top-level name, ``kvbench``.

The repository keeps the design's top-level folders -- ``common/``, ``harness/``, ``workloads/``, ``offload/``,
``reports/`` and ``scenarios/`` -- as packages of their own, imported by their folder names, so ruff, mypy, the
layering test and any import-graph tool read every import as a path in the tree. A wheel maps each of them under
``kvbench`` (``harness`` -> ``kvbench.harness``) and rewrites their imports to match (:func:`rewrite_imports`), so
installing kvbench adds only ``kvbench`` to site-packages and shadows nothing another distribution names
``harness`` or ``reports``. An editable install (``pip install -e .``, development) keeps the folders as they
are: it is the repository's own checkout, not a distribution.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

STAGES = ("common", "harness", "workloads", "offload", "reports", "scenarios")
DISTRIBUTION = "kvbench"
EDITABLE = any(command in sys.argv for command in ("editable_wheel", "develop"))


IMPORT = re.compile(
    rf"^(?P<indent>[ \t]*)(?P<keyword>from|import)[ \t]+(?P<stage>{'|'.join(STAGES)})(?P<rest>[.\s].*)?$"
)


def rewrite_imports(source: str) -> str:
    """``source`` with every statement ``from STAGE... import`` pointed at ``kvbench.STAGE...``.

    A line that starts (after indentation) with ``from STAGE`` is an import statement, or a line of a docstring
    that shows one, where the rewrite is harmless. A bare ``import STAGE.module`` would bind the name ``kvbench``
    instead of ``STAGE`` once installed: the layering test refuses that form in the tree, and so does this.
    """
    lines = source.splitlines(keepends=True)
    for number, line in enumerate(lines):
        found = IMPORT.match(line.rstrip("\r\n"))
        if found is None:
            continue
        if found["keyword"] == "import":
            raise ValueError(
                f"line {number + 1}: 'import {found['stage']}...' binds another name once installed; "
                f"write 'from {found['stage']}... import ...'"
            )
        lines[number] = line.replace(f"from {found['stage']}", f"from {DISTRIBUTION}.{found['stage']}", 1)
    return "".join(lines)


class BuildPy(build_py):
    """Copies each module into the wheel with its imports rewritten (see :func:`rewrite_imports`)."""

    def build_module(self, module: str, module_file: str, package: str | list[str]) -> tuple[str, bool]:
        outfile, copied = super().build_module(module, module_file, package)
        path = Path(outfile)
        try:
            path.write_text(rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
        except ValueError as error:
            raise SystemExit(f"{module_file}: {error}") from None
        return outfile, copied


PACKAGE_DATA = {
    "scenarios": ["*.yaml"],
    "reports": ["templates/*.html.j2"],
    "harness.sim": ["calibrations/*.yaml"],
    "harness.client": ["metrics.yaml"],
    "workloads": ["data/*.jsonl"],
    "harness.results": ["schemas/*.schema.json"],
    DISTRIBUTION: ["py.typed"],
}


def main() -> None:
    if EDITABLE:
        setup(
            packages=find_packages(include=[DISTRIBUTION, f"{DISTRIBUTION}.*", *STAGES, *(f"{s}.*" for s in STAGES)]),
            package_data=PACKAGE_DATA,
        )
    else:
        packages = [DISTRIBUTION, *(p for p in find_packages(include=[f"{DISTRIBUTION}.*"]))]
        package_dir = {DISTRIBUTION: DISTRIBUTION}
        for stage in STAGES:
            for found in [stage, *find_packages(include=[f"{stage}.*"])]:
                packages.append(f"{DISTRIBUTION}.{found}")
                package_dir[f"{DISTRIBUTION}.{found}"] = found.replace(".", "/")
        setup(
            packages=packages,
            package_dir=package_dir,
            package_data={
                name if name == DISTRIBUTION else f"{DISTRIBUTION}.{name}": files
                for name, files in PACKAGE_DATA.items()
            },
            cmdclass={"build_py": BuildPy},
        )


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import its functions
    main()
