"""The kept run directories tests read: the product's (``docs/results``) and the lab's (``lab/runs``).

The unit tier reads the product's runs only, the few the README and the user docs cite; a check over every run
directory also runs over the lab's, as cases marked ``lab`` (``scripts/test.sh`` runs that tier last), so the
unit tier never waits on the lab's experiments.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest.mark import ParameterSet

from harness.store.jsonl import PACKED_SUFFIX, read_stored_bytes
from tests.support import REPO

PRODUCT_RUNS = REPO / "docs" / "results"
LAB_RUNS = REPO / "lab" / "runs"


def kept_runs(keep: Callable[[Path], bool]) -> list[ParameterSet]:
    """Every kept run directory ``keep`` accepts, as pytest parameters: the product's, then the lab's (marked)."""
    product = [pytest.param(path, id=path.name) for path in sorted(PRODUCT_RUNS.iterdir()) if keep(path)]
    lab = [
        pytest.param(path, id=f"lab-{path.name}", marks=pytest.mark.lab)
        for path in sorted(LAB_RUNS.iterdir())
        if keep(path)
    ]
    return product + lab


def plain_copy(run: Path, dest: Path) -> Path:
    """A copy of the kept run ``run`` at ``dest`` with its packed files unpacked: the directory as its run wrote it."""
    shutil.copytree(run, dest)
    for packed in sorted(dest.rglob(f"*{PACKED_SUFFIX}")):
        plain = packed.with_name(packed.name.removesuffix(PACKED_SUFFIX))
        plain.write_bytes(read_stored_bytes(plain) or b"")
        packed.unlink()
    return dest
