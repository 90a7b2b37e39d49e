"""Skewed user activity in the load workload: a few heavy users (fleet hotspots), reproducibly."""

from __future__ import annotations

import collections

from tests.scenarios import fixed, multi_user_qa
from tests.support import multi_user_workload
from workloads.multi_user import MultiUserWorkload


def _workload(skew: float, users: int = 50) -> MultiUserWorkload:
    return multi_user_workload(multi_user_qa(users, fixed(2), fixed(500), user_skew=skew), seed=11)


def test_no_skew_cycles_users() -> None:
    workload = _workload(0.0)
    assert [workload.user_of(s) for s in range(120)] == [s % 50 for s in range(120)]


def test_zipf_skew_matches_its_weights() -> None:
    skew, users, sessions = 1.2, 50, 20_000
    workload = _workload(skew, users)
    counts = collections.Counter(workload.user_of(s) for s in range(sessions))
    weights = [(u + 1) ** -skew for u in range(users)]
    for user in (0, 1, 4, 49):
        expected = sessions * weights[user] / sum(weights)
        assert abs(counts[user] - expected) < 5 * expected**0.5 + 5  # within ~5 binomial standard deviations
    assert counts[0] > 10 * max(counts[49], 1)
    # a session's user depends on the session alone (resume, other points, other processes agree)
    again = _workload(skew, users)
    assert [again.user_of(s) for s in (17, 3, 19_999)] == [workload.user_of(s) for s in (17, 3, 19_999)]
