"""Where an engine session writes a disk or shared tier's KV: its own subdirectory of the tier's path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from offload.profiles import (
    OffloadProfile,
    OffloadTier,
    TierScope,
    session_dir_name,
    session_dirs,
    tier_dir,
    tier_dirs,
)

DISK = OffloadTier(kind="disk", capacity_gb=100, path="/nvme/kv")
SHARED = OffloadTier(kind="shared", capacity_gb=1000, path="/mnt/shared/kv")
CPU = OffloadTier(kind="cpu", capacity_gb=16)
REMOTE = OffloadTier(kind="shared", capacity_gb=1000, remote_url="lm://cache:65432")


def test_replicas_of_a_session_share_the_shared_tier_but_not_the_disk_tier() -> None:
    session = session_dir_name("run1", "shared-rr", 0, 0, "abc123")
    first, second = TierScope(session, owner="replica-0"), TierScope(session, owner="replica-1")
    assert tier_dir(SHARED, first) == tier_dir(SHARED, second) == f"/mnt/shared/kv/{session}"
    assert tier_dir(DISK, first) == f"/nvme/kv/{session}/replica-0"
    assert tier_dir(DISK, second) == f"/nvme/kv/{session}/replica-1"


def test_two_arms_and_two_sessions_of_one_arm_get_different_directories() -> None:
    names = {
        session_dir_name("run1", "shared-rr", 0, 0, "abc123"),
        session_dir_name("run1", "shared-sa", 0, 1, "abc123"),
        session_dir_name("run1", "shared-rr", 0, 2, "abc123"),  # the same arm's next engine start (ABBA)
        session_dir_name("run1", "shared-rr", 1, 0, "def456"),  # a resumed run's next attempt
        session_dir_name("run1", "shared-rr", 0, 0, "def456"),  # another run whose directory has the same name
    }
    assert len(names) == 5
    assert len({tier_dir(SHARED, TierScope(name)) for name in names}) == 5


def test_session_names_are_one_plain_directory_name() -> None:
    name = session_dir_name("../../etc", "arm/with spaces", 3, 7, "tok")
    assert "/" not in name and " " not in name and name.startswith("kvbench-") and "-a3s7-" in name
    assert TierScope(name).session == name
    long = session_dir_name("r" * 500, "a" * 500, 0, 0, "t")
    assert len(long) < 255  # a file name, on every common filesystem


@pytest.mark.parametrize(
    ("session", "owner"),
    [("kvbench-x", "../up"), ("kvbench-x", "a/b"), ("..", "replica-0"), ("other-x", "replica-0"), ("kvbench-x", "")],
)
def test_a_scope_refuses_names_that_would_leave_the_tier_path(session: str, owner: str) -> None:
    with pytest.raises(ValueError, match="tier scope"):
        TierScope(session, owner=owner)


def test_without_a_scope_or_when_opted_out_the_path_is_used_as_given() -> None:
    scope = TierScope(session_dir_name("run1", "warm", 0, 0, "t"))
    assert tier_dir(SHARED, None) == "/mnt/shared/kv"
    warm = SHARED.model_copy(update={"fresh_per_arm": False})
    assert tier_dir(warm, scope) == "/mnt/shared/kv"
    placed = tier_dirs(warm, scope)
    assert placed is not None and placed.create == () and placed.must_exist == ("/mnt/shared/kv",)
    assert "used as given (fresh_per_arm: false)" in placed.note
    assert tier_dir(CPU, scope) is None and tier_dirs(REMOTE, scope) is None  # nothing kvbench can scope


def test_fresh_per_arm_is_a_strict_boolean_field() -> None:
    assert OffloadTier.model_validate({"kind": "disk", "capacity_gb": 1, "path": "/x"}).fresh_per_arm is True
    with pytest.raises(ValidationError, match="fresh_per_arm"):
        OffloadTier.model_validate({"kind": "disk", "capacity_gb": 1, "path": "/x", "fresh_per_arm": "no"})


def test_shared_base_must_exist_and_the_session_directory_is_created() -> None:
    scope = TierScope(session_dir_name("run1", "a", 0, 0, "t"), owner="replica-1")
    shared = tier_dirs(SHARED, scope)
    assert shared is not None
    assert shared.must_exist == ("/mnt/shared/kv",) and shared.create == (f"/mnt/shared/kv/{scope.session}",)
    disk = tier_dirs(DISK, scope)
    assert disk is not None
    assert disk.must_exist == () and disk.create == (f"/nvme/kv/{scope.session}/replica-1",)
    assert f"/nvme/kv/{scope.session}/replica-1" in disk.note and "removed at its end" in disk.note


def test_session_dirs_are_what_the_runner_removes() -> None:
    session = session_dir_name("run1", "a", 0, 0, "t")
    warm_disk = DISK.model_copy(update={"fresh_per_arm": False})
    profile = OffloadProfile(name="p", backend="lmcache-mp", tiers=(CPU, warm_disk, SHARED))
    assert [str(path) for path in session_dirs(profile, session)] == [f"/mnt/shared/kv/{session}"]
