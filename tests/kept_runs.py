"""The kept run directories tests read: the product's (``docs/results``) and the lab's (``lab/runs``).

The unit tier reads the product's runs only, the few the README and the user docs cite; a check over every run
directory also runs over the lab's, as cases marked ``lab`` (``scripts/test.sh`` runs that tier last), so the
unit tier never waits on the lab's experiments.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest.mark import ParameterSet

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
