"""The tracked checkout stays under 20 MiB.

A GPU machine call carries the checkout and at most 64 MiB in all (the vLLM or SGLang wheelhouse parts go beside
it), and a clean clone is what CI and every new user download. Kept runs store their large files packed (.xz);
a run that pushes the checkout over belongs in lab/ packed, or out of the repository.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import REPO

LIMIT_BYTES = 20 * 1024 * 1024


def test_the_tracked_files_stay_under_20_mib() -> None:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run([git, "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    sizes = {name: (REPO / name).stat().st_size for name in listed.decode().split("\0") if (REPO / name).is_file()}
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    largest = ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in biggest)
    assert total < LIMIT_BYTES, f"the tracked files hold {total / 2**20:.2f} MiB (limit 20 MiB); largest: {largest}"
