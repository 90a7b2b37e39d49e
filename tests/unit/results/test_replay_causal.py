"""A replay's causal check: a child call sent before its parent's answer completed is counted, from the records."""

from __future__ import annotations

import pandas as pd

from harness.results.replay import _causal


def frame(child_start: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "call_id": ["a", "b", "c"],
            "parent_call": [None, "a", "a"],
            "started_ns": [0, 150, child_start],
            "e2e_ns": [100, 10, 10],
        }
    )


def test_children_after_their_parent_are_no_violation() -> None:
    assert _causal(frame(100)) == (2, 0)  # sent exactly when the parent completed


def test_a_child_sent_before_its_parent_completed_is_counted() -> None:
    assert _causal(frame(99)) == (2, 1)


def test_records_without_a_call_graph_have_no_causal_figures() -> None:
    plain = pd.DataFrame({"started_ns": [0], "e2e_ns": [5]})
    assert _causal(plain) == (None, None)
    assert _causal(pd.DataFrame({"call_id": ["a"], "parent_call": [None], "started_ns": [0], "e2e_ns": [5]})) == (
        None,
        None,
    )
