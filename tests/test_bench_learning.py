"""``bench/learning.py``'s checks of a run's ``summary.json``, by hand: the T=1 gain of
``make train``, and the long run's greedy gain, control and episode length."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import load_bench


def _checks():
    return load_bench("learning").learning_checks


SUMMARY = {
    "gain_points": 12.0, "sft_ci95": [0.30, 0.40], "grpo_ci95": [0.42, 0.52],
    "sft_greedy_success": 0.05, "sft_greedy_ci95": [0.03, 0.08],
    "grpo_greedy_success": 0.60, "grpo_greedy_ci95": [0.55, 0.65],
    "control_greedy_ci95": [0.20, 0.30],
    "median_steps_success": {"after_greedy": 14.0},
}  # fmt: skip


def _args(**kw):
    base = dict(metric="t1", min_gain=15.0, max_minutes=40.0, headroom=0.25, control=False,
                min_median_steps=0.0)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_t1_checks_of_make_train():
    checks = _checks()(SUMMARY, _args(), minutes=25.0, projected=29.0)
    assert checks == {
        "gain_at_least_min": False,  # 12 < 15
        "cis_apart": True,  # 0.42 > 0.40
        "within_max_minutes": True,
        "projected_within_headroom": True,  # 29 <= 30
    }


def test_the_long_run_checks_greedy_gain_control_and_length():
    args = _args(metric="greedy", min_gain=10.0, max_minutes=90.0, headroom=0.0, control=True,
                 min_median_steps=10.0)  # fmt: skip
    checks = _checks()(SUMMARY, args, minutes=88.0, projected=200.0)
    assert checks == {
        "gain_at_least_min": True,  # 60 - 5 = 55 points
        "cis_apart": True,  # 0.55 > 0.08
        "within_max_minutes": True,
        "above_control": True,  # 0.55 > 0.30
        "median_steps_of_successes": True,  # 14 >= 10
    }
    shortcut = {**SUMMARY, "median_steps_success": {"after_greedy": 6.0}}
    assert not _checks()(shortcut, args, 88.0, 0.0)["median_steps_of_successes"]
    no_control = {k: v for k, v in SUMMARY.items() if k != "control_greedy_ci95"}
    assert not _checks()(no_control, args, 88.0, 0.0)["above_control"]
    assert not _checks()(SUMMARY, args, 95.0, 0.0)["within_max_minutes"]
