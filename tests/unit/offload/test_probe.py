"""Storage probe: small real probes of tmp_path, error messages, cleanup, the CLI."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from kvbench.cli.offload import offload_app
from offload import probe as probe_mod
from offload.probe import ProbeError, ProbeResult, format_size, parse_size, probe_path

MiB = 1024**2


def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".kvbench-probe-")]


# ---- real probes ------------------------------------------------------------------------------


def test_probe_measures_positive_bandwidth_and_removes_its_file(tmp_path: Path) -> None:
    result = probe_path(tmp_path, 4 * MiB, 1 * MiB, passes=2)
    assert result.read_gbps > 0
    assert result.write_gbps > 0
    assert result.mode in ("direct", "buffered")
    assert (result.size, result.block, result.passes) == (4 * MiB, 1 * MiB, 2)
    assert len(result.write_samples_gbps) == len(result.read_samples_gbps) == 2
    assert result.path == str(tmp_path.absolute())
    assert list(tmp_path.iterdir()) == []


def test_buffered_mode_on_request(tmp_path: Path) -> None:
    result = probe_path(tmp_path, 2 * MiB, 1 * MiB, direct=False, passes=1)
    assert result.mode == "buffered"
    assert result.note is not None and "requested" in result.note
    assert result.read_gbps > 0 and result.write_gbps > 0
    assert list(tmp_path.iterdir()) == []


def test_unaligned_block_falls_back_to_buffered(tmp_path: Path) -> None:
    result = probe_path(tmp_path, 10_000, 1000, passes=1)
    assert result.mode == "buffered"
    assert result.note is not None and "multiple of 4096" in result.note


def test_size_rounds_down_to_whole_blocks(tmp_path: Path) -> None:
    result = probe_path(tmp_path, 3 * MiB + 123, 1 * MiB, passes=1)
    assert result.size == 3 * MiB


def test_direct_unsupported_falls_back_or_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "_direct_unsupported_reason", lambda *_: "Invalid argument")
    result = probe_path(tmp_path, 2 * MiB, 1 * MiB, passes=1)
    assert result.mode == "buffered"
    assert result.note is not None and "Invalid argument" in result.note
    with pytest.raises(ProbeError, match="O_DIRECT") as info:
        probe_path(tmp_path, 2 * MiB, 1 * MiB, direct=True, passes=1)
    assert str(tmp_path) in str(info.value)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux-only")
def test_direct_trial_leaves_nothing_behind(tmp_path: Path) -> None:
    probe_mod._direct_unsupported_reason(tmp_path, 4096)
    assert list(tmp_path.iterdir()) == []


def test_file_is_removed_on_keyboard_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        probe_path(tmp_path, 2 * MiB, 1 * MiB, passes=1)
    assert list(tmp_path.iterdir()) == []


def test_file_is_removed_when_a_read_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_readv(fd: int, buffers: Any) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(probe_mod, "_direct_unsupported_reason", lambda *_: None)
    monkeypatch.setattr(os, "readv", failing_readv)
    with pytest.raises(ProbeError, match="Input/output error") as info:
        probe_path(tmp_path, 2 * MiB, 1 * MiB, passes=1)
    assert str(tmp_path) in str(info.value)
    assert _leftovers(tmp_path) == []


# ---- errors that name the path ----------------------------------------------------------------


def test_missing_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(ProbeError, match="no such directory") as info:
        probe_path(missing, 1 * MiB, 1 * MiB)
    assert str(missing) in str(info.value)


def test_file_instead_of_directory_is_named(tmp_path: Path) -> None:
    target = tmp_path / "afile"
    target.write_text("x")
    with pytest.raises(ProbeError, match="not a directory") as info:
        probe_path(target, 1 * MiB, 1 * MiB)
    assert str(target) in str(info.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_directory_is_named(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ProbeError, match="not writable") as info:
            probe_path(locked, 1 * MiB, 1 * MiB)
        assert str(locked) in str(info.value)
    finally:
        locked.chmod(0o700)


def test_permission_denied_on_create_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where access() says yes but the filesystem says no (root on a read-only export, ACLs...)."""
    real_open = os.open

    def denying_open(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if ".kvbench-probe-" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", denying_open)
    for direct in (None, False):
        with pytest.raises(ProbeError, match="Permission denied") as info:
            probe_path(tmp_path, 1 * MiB, 1 * MiB, direct=direct, passes=1)
        assert f"in {tmp_path}" in str(info.value)


def test_not_enough_space_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "free_bytes", lambda _path: 1000)
    with pytest.raises(ProbeError, match="free") as info:
        probe_path(tmp_path, 1 * MiB, 1 * MiB)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    ("size", "block", "direct", "passes", "match"),
    [
        (1 * MiB, 0, None, 1, "block size must be positive"),
        (1 * MiB, 2 * MiB, None, 1, "at least one block"),
        (1 * MiB, 1 * MiB, None, 0, "passes"),
        (10_000, 1000, True, 1, "multiple of 4096"),
    ],
)
def test_invalid_arguments(tmp_path: Path, size: int, block: int, direct: bool | None, passes: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        probe_path(tmp_path, size, block, direct, passes=passes)


# ---- sizes, result model ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4MiB", 4 * MiB),
        ("1GiB", 1024**3),
        ("1gib", 1024**3),
        ("512k", 512 * 1024),
        ("2G", 2 * 1024**3),
        ("2GB", 2_000_000_000),
        ("1.5MiB", 3 * MiB // 2),
        ("4096", 4096),
        (" 8 MiB ", 8 * MiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "4XB", "0", "0.5", "1.0000001KiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(4 * MiB) == "4 MiB"
    assert format_size(1024**3) == "1 GiB"
    assert format_size(1500) == "1500 B"


def _result(**overrides: Any) -> ProbeResult:
    fields: dict[str, Any] = {
        "path": "/mnt/nvme",
        "mode": "direct",
        "size": MiB,
        "block": MiB,
        "passes": 1,
        "write_gbps": 3.14159,
        "read_gbps": 6.54321,
        "write_samples_gbps": (3.14159,),
        "read_samples_gbps": (6.54321,),
    }
    return ProbeResult(**(fields | overrides))


def test_to_tier_carries_rounded_bandwidths_and_path() -> None:
    tier = _result().to_tier("disk", 512)
    assert (tier.kind, tier.capacity_gb, tier.path) == ("disk", 512, "/mnt/nvme")
    assert (tier.read_gbps, tier.write_gbps) == (6.54, 3.14)
    assert tier.latency_us is None


def test_to_tier_cpu_has_no_path_and_tiny_bandwidth_stays_positive() -> None:
    tier = _result(read_gbps=0.000123456, write_gbps=0.5).to_tier("cpu", 64)
    assert tier.path is None
    assert tier.read_gbps == 0.000123
    assert _result().to_tier("shared", 10, path="/mnt/other").path == "/mnt/other"


def test_result_is_frozen() -> None:
    result = _result()
    with pytest.raises(ValidationError):
        result.read_gbps = 1.0  # type: ignore[misc]  # frozen on purpose: the runtime refusal


# ---- CLI ----------------------------------------------------------------------------------------


runner = CliRunner()


def test_cli_json(tmp_path: Path) -> None:
    args = ["probe", str(tmp_path), "--size", "2MiB", "--block", "1MiB", "--passes", "1", "--json"]
    res = runner.invoke(offload_app, [*args, "--kind", "shared", "--capacity-gb", "100"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["read_gbps"] > 0 and data["write_gbps"] > 0
    assert data["tier"]["kind"] == "shared"
    assert data["tier"]["capacity_gb"] == 100
    assert data["tier"]["path"] == str(tmp_path.absolute())
    assert list(tmp_path.iterdir()) == []


def test_cli_table_prints_yaml_tier(tmp_path: Path) -> None:
    res = runner.invoke(offload_app, ["probe", str(tmp_path), "--size", "2MiB", "--block", "1MiB"])
    assert res.exit_code == 0, res.output
    assert "read" in res.stdout and "write" in res.stdout
    assert "tiers:\n- kind: disk\n" in res.stdout
    assert "read_gbps:" in res.stdout and "write_gbps:" in res.stdout


def test_cli_error_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    res = runner.invoke(offload_app, ["probe", str(missing), "--size", "1MiB", "--block", "1MiB"])
    assert res.exit_code == 1
    assert str(missing) in res.output.replace("\n", "")


def test_cli_rejects_bad_size(tmp_path: Path) -> None:
    res = runner.invoke(offload_app, ["probe", str(tmp_path), "--size", "lots"])
    assert res.exit_code == 2
    assert "invalid size" in res.output
