"""``bench/learner.py``'s timing of where the reference's forward pass runs, on a one-block
model: every place is run and timed, and the figures it derives are those of the times."""

from __future__ import annotations

from tests.conftest import load_bench


def _bench():
    return load_bench("learner")


def test_the_arrival_rows_time_all_three_places():
    r = _bench().measure_arrival("one-block", {"num_layers": 1, "vocab_size": 512}, steps=1)
    after = r["after_last_group_s"]
    assert set(after) == {"in_step", "separate", "on_arrival"}
    assert all(v > 0 for v in after.values())
    assert r["on_arrival_total_s"] >= after["on_arrival"]  # its chunks ran before the last
    assert r["on_arrival_over_in_step"] == round(after["on_arrival"] / after["in_step"], 3)
    assert r["on_arrival_over_separate"] == round(after["on_arrival"] / after["separate"], 3)
