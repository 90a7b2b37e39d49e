"""The tier hooks of tests/conftest.py: a ``gpu`` test runs only where ``nvidia-smi -L`` lists a GPU,
a ``vllm`` test only where ``$KVBENCH_VLLM_PYTHON`` is a python that imports vllm.

Each case runs a small pytest session (pytester) whose conftest is the suite's own hook, with a
stand-in ``nvidia-smi`` or interpreter script first on PATH -- the real commands those checks run.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import support

TESTS = """
import pytest

@pytest.mark.gpu
def test_on_a_gpu():
    pass

@pytest.mark.vllm
def test_on_vllm_cpu():
    pass

def test_anywhere():
    pass
"""


def stand_in(directory: Path, name: str, body: str) -> Path:
    """An executable script ``directory/name`` that runs ``body`` with this python."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


@pytest.fixture
def session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.Pytester]:
    """A pytest project with one gpu, one vllm and one plain test, run under the suite's hook."""
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    gpu: g\n    vllm: v\n")
    pytester.makepyfile(TESTS)
    monkeypatch.setenv("PATH", f"{pytester.path / 'bin'}:/usr/bin:/bin")  # no real nvidia-smi either way
    monkeypatch.delenv(support.VLLM_PYTHON_ENV, raising=False)
    support.vllm_python.cache_clear()
    yield pytester
    support.vllm_python.cache_clear()


def outcomes(session: pytest.Pytester) -> dict[str, str]:
    """test name -> passed | skipped | failed, from a run of the session's tests."""
    recorder = session.inline_run("-p", "no:cacheprovider")
    passed, skipped, failed = recorder.listoutcomes()
    return {
        report.nodeid.rsplit("::", 1)[1]: outcome
        for outcome, reports in (("passed", passed), ("skipped", skipped), ("failed", failed))
        for report in reports
    }


def test_without_nvidia_smi_or_vllm_only_the_plain_test_runs(session: pytest.Pytester) -> None:
    assert outcomes(session) == {"test_on_a_gpu": "skipped", "test_on_vllm_cpu": "skipped", "test_anywhere": "passed"}


def test_a_failing_nvidia_smi_skips_the_gpu_test(session: pytest.Pytester) -> None:
    # what nvidia-smi does on a host whose driver is not loaded
    stand_in(
        session.path / "bin",
        "nvidia-smi",
        """
        import sys
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        sys.exit(9)
    """,
    )
    assert outcomes(session)["test_on_a_gpu"] == "skipped"


def test_a_listed_gpu_runs_the_gpu_test(session: pytest.Pytester) -> None:
    stand_in(
        session.path / "bin",
        "nvidia-smi",
        """
        print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)")
    """,
    )
    assert outcomes(session) == {"test_on_a_gpu": "passed", "test_on_vllm_cpu": "skipped", "test_anywhere": "passed"}


def test_vllm_python_must_import_vllm(session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    site = session.path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    without = stand_in(
        session.path / "venv",
        "python-without",
        f"""
        import os, sys
        os.execv({sys.executable!r}, [{sys.executable!r}, "-S", *sys.argv[1:]])
    """,
    )
    monkeypatch.setenv(support.VLLM_PYTHON_ENV, str(without))
    assert outcomes(session)["test_on_vllm_cpu"] == "skipped"

    support.vllm_python.cache_clear()
    with_vllm = stand_in(
        session.path / "venv",
        "python-with",
        f"""
        import os, sys
        os.environ["PYTHONPATH"] = {str(site)!r}
        os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
    """,
    )
    monkeypatch.setenv(support.VLLM_PYTHON_ENV, str(with_vllm))
    assert outcomes(session)["test_on_vllm_cpu"] == "passed"


def test_every_integration_module_is_marked_integration() -> None:
    # an unmarked one runs its kvbench processes in the unit tier, beside the tests that compute on both cores
    unmarked = [
        path.name
        for path in sorted((support.TESTS / "integration").glob("test_*.py"))
        if "pytest.mark.integration" not in path.read_text(encoding="utf-8")
    ]
    assert unmarked == [], "set pytestmark = pytest.mark.integration in these (tests/README.md, Integration)"
