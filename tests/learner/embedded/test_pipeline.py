"""The embedded pipeline's parts: demos -> export -> SFT layout, the SFT trainer, the
warm start, Wilson intervals, the summary and its plot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from learner.embedded.pipeline import plot, summarize, table, wilson
from shared.chat import ChatError, render_chat
from shared.config import RunConfig, from_dict
from shared.tokenizer import load_tokenizer
from shared.wire import decode_groups
from tests.conftest import REPO, start_server, stop_server


def test_wilson_interval_matches_the_formula():
    # Reference values of the 95% Wilson score interval.
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(300, 300)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(0.9874, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_render_chat_refuses_a_malformed_chat():
    tok = load_tokenizer()
    limits = {"observation_tokens": 16, "max_context_tokens": 256}
    with pytest.raises(ChatError, match="starts with"):
        render_chat(tok, [{"role": "assistant", "content": "x"}], **limits)
    chat = [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}]
    with pytest.raises(ChatError, match="alternate"):
        render_chat(tok, chat, **limits)
    ids, mask = render_chat(tok, [{"role": "user", "content": "q"}], **limits)
    assert len(ids) == len(mask) and not any(mask)


@pytest.fixture(scope="module")
def demos(web_url, tmp_path_factory):
    """A noisy-oracle sidecar's groups (as the wire carries them) and its SFT export."""
    run_dir = tmp_path_factory.mktemp("demos")
    sets = {
        "web.url": web_url, "rollout.policy": "noisy_oracle", "rollout.port": 0,
        "rollout.group_size": 2, "rollout.max_concurrent_episodes": 8, "env.mode": "api",
        "env.prompt": "compact", "rollout.buffer_max_groups": 64,
        "rollout.task_types": '["qa"]', "rollout.task_templates": '["airport_city"]',
        "inference.observation_tokens": 64, "inference.max_context_tokens": 512,
    }  # fmt: skip
    args = ["rollout.serve", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    proc, url = start_server(args, "serving on")
    try:
        groups = []
        while len(groups) < 16:
            with urllib.request.urlopen(f"{url}/batch?groups=16&timeout=30", timeout=60) as r:
                groups += decode_groups(r.read())
        time.sleep(0.5)
    finally:
        stop_server(proc)
    out = run_dir / "sft.jsonl"
    cmd = [sys.executable, "-m", "rollout.sft_export", str(run_dir / "episodes")]
    subprocess.run([*cmd, "--out", str(out), "--min-reward", "0"], check=True, cwd=REPO)
    cfg = from_dict(_sections(sets))
    return groups, out, cfg


def _sections(sets: dict) -> dict:
    keep = ("env.prompt", "inference.observation_tokens", "inference.max_context_tokens")
    out: dict = {}
    for k in keep:
        section, key = k.split(".")
        v = sets[k]
        out.setdefault(section, {})[key] = int(v) if isinstance(v, int) else v
    return out


@pytest.mark.multiprocess
def test_exported_demos_render_to_the_tokens_the_episodes_produced(demos):
    groups, data, cfg = demos
    tok = load_tokenizer()
    on_wire = {}
    for g in groups:
        for t in g.trajectories:
            on_wire[tuple(t.tokens.tolist())] = t.loss_mask.tolist()
    chats = [json.loads(line)["messages"] for line in data.read_text().splitlines()]
    assert len(chats) >= 8
    matched = 0
    for messages in chats:
        ids, mask = render_chat(
            tok,
            messages,
            observation_tokens=cfg.inference.observation_tokens,
            max_context_tokens=cfg.inference.max_context_tokens,
        )
        if tuple(ids) in on_wire:
            assert on_wire[tuple(ids)] == mask
            matched += 1
    # Every exported chat the learner pulled is the exact token sequence of its episode
    # (the sidecar ran further episodes after the last batch: those are not on the wire).
    assert matched >= min(len(chats), len(on_wire)) // 2 and matched >= 8


@pytest.mark.multiprocess
def test_sft_lowers_the_loss_and_warm_starts_grpo(demos, tmp_path):
    from learner.embedded.sft import train_sft
    from learner.training.checkpoint import Checkpointer
    from learner.training.loop import Trainer

    _, data, _ = demos
    cfg = from_dict(
        {
            "env": {"prompt": "compact"},
            "inference": {"observation_tokens": 64, "max_context_tokens": 512},
            "learner": {"length_buckets": [512], "groups_per_step": 1},
            "rollout": {"group_size": 2},
            "sft": {"steps": 30, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 3},
        }
    )
    root = train_sft(cfg, data, tmp_path / "sft")
    lines = [
        json.loads(x) for x in (tmp_path / "sft" / "sft_metrics.jsonl").read_text().splitlines()
    ]
    assert [x["step"] for x in lines] == [10, 20, 30]
    assert lines[-1]["loss"] < 0.6 * lines[0]["loss"]
    with Checkpointer(root) as ckpt:
        sft_params = ckpt.restore(with_opt_state=False).params
    # GRPO from the warm start: step 0 holds exactly the SFT parameters.
    grpo_cfg = from_dict(
        {
            "learner": {"init_checkpoint": str(root), "length_buckets": [512]},
            "rollout": {"group_size": 2},
        }
    )
    trainer = Trainer(grpo_cfg, tmp_path / "grpo")
    try:
        assert int(trainer.state.step) == 0
        for k, v in sft_params.items():
            np.testing.assert_array_equal(np.asarray(trainer.state.params[k]), np.asarray(v))
    finally:
        trainer.close()


def test_summary_writes_json_table_and_plot(tmp_path):
    cfg = RunConfig()
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("w") as fh:
        for s in range(1, 21):
            fh.write(json.dumps({"step": s, "reward": s / 40, "success": s / 40}) + "\n")
        fh.write(json.dumps({"step": 20, "eval": {"success_rate": 0.5}}) + "\n")

    def res(k, n=300):
        return {"n": n, "success_rate": k / n, "mean_reward": k / n, "ci95": list(wilson(k, n))}

    results = {
        "before": res(90), "before_greedy": res(150), "after": res(160), "after_greedy": res(170)
    }  # fmt: skip
    s = summarize(cfg, tmp_path, results, 31.5)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s
    required = {
        "mode", "n_test", "temperature", "sft_success", "sft_ci95", "grpo_success", "grpo_ci95",
        "gain_points", "sft_greedy_success", "grpo_greedy_success", "wall_minutes",
        "sft_greedy_ci95", "grpo_greedy_ci95",
    }  # fmt: skip
    assert required <= set(s)
    assert s["sft_greedy_ci95"] == results["before_greedy"]["ci95"]
    assert s["grpo_greedy_ci95"] == results["after_greedy"]["ci95"]
    assert s["gain_points"] == pytest.approx(100 * 70 / 300, abs=0.01)
    assert s["cis_overlap"] is False and s["n_test"] == 300
    text = table(s)
    assert "0.300" in text and "0.533" in text and "do not overlap" in text
    png = Path(tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_summary_says_where_the_time_went(tmp_path):
    """``phase_minutes``: the warm start's demos and SFT (from ``sft/done.json``, written
    by the warm start) and the invocation's test evaluations and GRPO."""

    def res(k, n=300):
        return {"n": n, "success_rate": k / n, "mean_reward": k / n, "ci95": list(wilson(k, n))}

    results = {"before": res(90), "before_greedy": res(150), "after": res(160)}
    results["after_greedy"] = res(170)
    (tmp_path / "sft").mkdir()
    done = {"minutes": 11.5, "demos_minutes": 3.25, "sft_minutes": 8.25}
    (tmp_path / "sft" / "done.json").write_text(json.dumps(done))
    phases = {"test_before": 1.904, "grpo": 6.8, "test_after": 1.2}
    s = summarize(RunConfig(), tmp_path, results, 21.1, phases)
    assert s["phase_minutes"] == {
        "demos": 3.25, "sft": 8.25, "test_before": 1.9, "grpo": 6.8, "test_after": 1.2,
    }  # fmt: skip
    (tmp_path / "sft" / "done.json").unlink()  # a run that reused another's warm start
    assert summarize(RunConfig(), tmp_path, results, 9.0, phases)["phase_minutes"] == {
        "test_before": 1.9, "grpo": 6.8, "test_after": 1.2,
    }  # fmt: skip


def test_sft_rows_are_shifted_and_weighted():
    from learner.embedded.sft import make_batch

    ids, mask = [1, 7, 8, 9, 2, 5, 6], [0, 0, 0, 1, 1, 0, 0]
    a = make_batch([(ids, mask)], rows=2, t=8, pad=0, context_weight=0.25)
    np.testing.assert_array_equal(a["tokens_bt"][0], [1, 7, 8, 9, 2, 5, 0, 0])
    np.testing.assert_array_equal(a["targets_bt"][0], [7, 8, 9, 2, 5, 6, 0, 0])
    np.testing.assert_array_equal(a["mask_bt"][0], [0, 0, 1, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(a["weight_bt"][0], [0.25, 0.25, 1, 1, 0.25, 0.25, 0, 0])
    assert a["weight_bt"][1].sum() == 0 and a["attn_bt"][1].sum() == 0  # a padding row


def test_plot_draws_error_bars_at_zero_and_full_success(tmp_path):
    # Wilson's lower bound at 0 successes is a rounding error above 0 (3e-18): the bar's
    # error must not come out negative, which matplotlib refuses.
    summary = {
        "mode": "api", "temperature": 1.0, "n_test": 100, "sft_success": 0.0,
        "sft_ci95": list(wilson(0, 100)), "grpo_success": 1.0, "grpo_ci95": list(wilson(100, 100)),
    }  # fmt: skip
    png = plot(tmp_path, summary).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_copy_rows_train_only_what_an_earlier_occurrence_predicts():
    from learner.embedded.sft import copy_batch, join_batches, make_batch

    a = copy_batch(np.random.default_rng(0), 3, 256, 4096)
    assert a["copy_bt"].sum() > 0.25 * a["copy_bt"].size  # dense: a third of each row
    assert (a["mask_bt"] == 0).all() and (a["weight_bt"] == a["copy_bt"]).all()
    assert a["tokens_bt"].min() >= 3  # no special token
    for r in range(3):
        tok, tgt = a["tokens_bt"][r], a["targets_bt"][r]
        assert (tok[1:] == tgt[:-1]).all()
        for i in np.nonzero(a["copy_bt"][r])[0]:
            # (this token, the next) already occurred: induction can predict it
            earlier = np.nonzero((tok[:i] == tok[i]) & (tgt[:i] == tgt[i]))[0]
            assert earlier.size, (r, i)
    real = make_batch([([5, 6, 7, 8], [0, 0, 1, 1])], 2, 256, 0)
    both = join_batches(real, a)
    assert both["tokens_bt"].shape == (5, 256) and both["copy_bt"][:2].sum() == 0
    assert (both["mask_bt"][:2] == real["mask_bt"]).all()


def test_copy_exercise_runs_before_sft_and_its_rows_ride_along(demos, tmp_path):
    from learner.embedded.sft import copy_exercise, train_sft
    from learner.model.params import get_params
    from learner.training.loop import build_model
    from learner.training.sharding import make_mesh

    _, data, _ = demos
    cfg = from_dict(
        {
            "env": {"prompt": "compact"},
            "inference": {"observation_tokens": 64, "max_context_tokens": 512},
            "learner": {"length_buckets": [512]},
            "sft": {"steps": 10, "batch_size": 4, "copy_rows": 2, "copy_steps": 3},
        }
    )
    model, _ = build_model(cfg)
    before = {k: np.asarray(v).copy() for k, v in get_params(model).items()}
    (tmp_path / "x").mkdir()
    loss, steps = copy_exercise(cfg, model, make_mesh(cfg.mesh), tmp_path / "x")
    assert steps == 3 and 7.0 < loss < 9.0  # 3 steps: still near chance, ln(4096) = 8.3
    after = get_params(model)
    assert any(not np.array_equal(before[k], np.asarray(after[k])) for k in before)
    lines = (tmp_path / "x" / "copy_metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [3]
    train_sft(cfg, data, tmp_path / "sft")
    assert (tmp_path / "sft" / "copy_metrics.jsonl").is_file()
    sft = [json.loads(x) for x in (tmp_path / "sft" / "sft_metrics.jsonl").read_text().splitlines()]
    assert all("copy_loss" in x and "action_loss" in x for x in sft)


@pytest.mark.multiprocess
def test_sft_splits_the_cpu_into_the_configured_devices(demos, tmp_path):
    """``mesh.cpu_devices`` gives ``learner.sft``'s process that many CPU devices, the
    batch sharded over them, and its checkpoint loads in a process of another count."""
    from learner.training.checkpoint import Checkpointer

    _, data, _ = demos
    sets = {
        "env.prompt": "compact", "inference.observation_tokens": 64,
        "inference.max_context_tokens": 512, "learner.length_buckets": "[512]",
        "sft.steps": 10, "sft.batch_size": 3, "sft.copy_rows": 0,
    }  # fmt: skip
    runs = {}
    for n in (0, 2):
        cmd = [
            sys.executable,
            "-m",
            "learner.sft",
            "--data",
            str(data),
            "--out",
            str(tmp_path / f"d{n}"),
        ]
        for k, v in {**sets, "mesh.cpu_devices": n}.items():
            cmd += ["--set", f"{k}={v}"]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        runs[n] = p.stderr
    # 3 rows: one device takes them; two take 4 (the rows a multiple of the devices)
    assert "10 steps of 3 x 512 (+0 copy rows) on 1 device(s)" in runs[0]
    assert "10 steps of 4 x 512 (+0 copy rows) on 2 device(s)" in runs[2]
    with Checkpointer(tmp_path / "d2" / "checkpoints") as ckpt:
        params = ckpt.restore(with_opt_state=False).params
    assert params and all(np.isfinite(np.asarray(v)).all() for v in params.values())


def test_cpu_devices_asked_for_once_jax_has_started_are_a_warning(caplog):
    import jax

    from learner.training.sharding import split_cpu

    have = len(jax.devices("cpu"))  # the backend is up in this process
    split_cpu(have)  # the count it has: nothing to say
    assert not caplog.records
    split_cpu(have + 1)
    assert f"mesh.cpu_devices={have + 1} not applied" in caplog.text
    assert len(jax.devices("cpu")) == have


def test_sft_starts_from_init_checkpoint(demos, tmp_path):
    from learner.embedded.sft import train_sft
    from learner.training.checkpoint import Checkpointer

    _, data, _ = demos
    base = {
        "env": {"prompt": "compact"},
        "inference": {"observation_tokens": 64, "max_context_tokens": 512},
        "learner": {"length_buckets": [512]},
    }
    first = train_sft(
        from_dict({**base, "sft": {"steps": 5, "batch_size": 4}}), data, tmp_path / "a"
    )
    # A second SFT from it with a vanishing rate ends where it started: it started there.
    sft = {"steps": 1, "batch_size": 4, "learning_rate": 1e-12, "init_checkpoint": str(first)}
    second = train_sft(from_dict({**base, "sft": sft}), data, tmp_path / "b")
    with Checkpointer(first) as a, Checkpointer(second) as b:
        pa, pb = a.restore(with_opt_state=False).params, b.restore(with_opt_state=False).params
    for k, v in pa.items():
        np.testing.assert_allclose(np.asarray(pb[k]), np.asarray(v), atol=1e-6)
    with pytest.raises(FileNotFoundError):
        sft["init_checkpoint"] = str(tmp_path / "missing")
        train_sft(from_dict({**base, "sft": sft}), data, tmp_path / "c")


def test_a_childs_progress_is_shown_as_the_parents_and_its_log_kept(tmp_path, capfd):
    from learner.embedded.pipeline import run_with_progress

    child = (
        "import sys, time\n"
        "from shared.progress import Progress\n"
        "with Progress('eval test', 3, 'episodes') as p:\n"
        "    for i in range(3):\n"
        "        time.sleep(0.05); p.advance(1)\n"
        "print('a note', file=sys.stderr)\n"
        "print('{\"n\": 3}')\n"
    )
    log = tmp_path / "logs" / "eval-test.log"
    out = run_with_progress(
        [sys.executable, "-c", child], "eval test-before", 3, "episodes", log, timeout=60
    )
    assert json.loads(out) == {"n": 3}
    assert "a note" in log.read_text() and "[progress] eval test: 3/3" in log.read_text()
    err = capfd.readouterr().err
    assert "[progress] eval test-before: 0/3 episodes" in err
    assert "[progress] eval test-before: 3/3 episodes (100%)" in err

    with pytest.raises(RuntimeError, match="exit 3"):
        run_with_progress(
            [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
            "x", 1, "", tmp_path / "x.log", timeout=60,
        )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="x failed"):  # a hung child is stopped
        run_with_progress(
            [sys.executable, "-c", "import time; time.sleep(60)"], "x", 1, "",
            tmp_path / "y.log", timeout=1,
        )  # fmt: skip
    assert time.monotonic() - t0 < 20


def test_wall_minutes_count_every_invocation_of_a_run(tmp_path):
    from learner.embedded.pipeline import (
        invocations,
        record_invocation,
        tested_before,
        wall_minutes_of,
    )

    assert wall_minutes_of(tmp_path) == 0.0 and invocations(tmp_path) == []
    record_invocation(tmp_path, 1.8e9, 12.5, 0, 10)
    record_invocation(tmp_path, 1.8e9 + 900, 7.25, 10, 24)
    with (tmp_path / "invocations.jsonl").open("a") as fh:
        fh.write('{"started": "2027-01-15T08:45:00Z", "minu')  # a line cut short by a kill
    rows = invocations(tmp_path)
    assert [(r["first_step"], r["last_step"]) for r in rows] == [(0, 10), (10, 24)]
    assert rows[0]["started"] == "2027-01-15T08:00:00Z"
    assert wall_minutes_of(tmp_path) == pytest.approx(19.75)
    assert not tested_before(tmp_path)
    for name in ("before-t1", "before-greedy"):
        (tmp_path / "eval" / f"test-{name}").mkdir(parents=True)
        (tmp_path / "eval" / f"test-{name}" / "result.json").write_text("{}")
    assert tested_before(tmp_path)
    record_invocation(tmp_path, 1.8e9 + 2000, 1.0, 24, 24)
    assert wall_minutes_of(tmp_path) == pytest.approx(20.75)


def test_the_control_spends_the_runs_grpo_minutes_at_the_warm_starts_pace(tmp_path):
    from learner.embedded.pipeline import grpo_minutes_of, record_invocation, sft_seconds_per_step

    record_invocation(tmp_path, 1.8e9, 30.0, 0, 10, grpo_minutes=12.0)
    record_invocation(tmp_path, 1.8e9 + 1800, 20.0, 10, 24, grpo_minutes=8.5)
    record_invocation(tmp_path, 1.8e9 + 3000, 1.0, 24, 24)  # an older ledger row: no GRPO
    assert grpo_minutes_of(tmp_path) == pytest.approx(20.5)
    assert grpo_minutes_of(tmp_path, now=1.5) == pytest.approx(22.0)
    with pytest.raises(RuntimeError, match="no SFT step timed"):
        sft_seconds_per_step(tmp_path)
    (tmp_path / "sft").mkdir()
    lines = [{"step": 10, "elapsed_s": 31.0}, {"step": 400, "elapsed_s": 1100.0}]
    (tmp_path / "sft" / "sft_metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 41'  # cut short: skipped
    )
    assert sft_seconds_per_step(tmp_path) == pytest.approx(2.75)


def test_the_summary_has_the_controls_keys_only_when_it_ran(tmp_path):
    def res(k, n=300):
        return {"n": n, "success_rate": k / n, "mean_reward": k / n, "ci95": list(wilson(k, n))}

    results = {
        "before": res(90), "before_greedy": res(60), "after": res(160), "after_greedy": res(170)
    }  # fmt: skip
    plain = summarize(RunConfig(), tmp_path, results, 30.0)
    assert not [k for k in plain if k.startswith("control")]
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "done.json").write_text(json.dumps({"steps": 333, "minutes": 21.04}))
    results.update(control=res(100), control_greedy=res(75))
    s = summarize(RunConfig(), tmp_path, results, 60.0)
    assert s["control_greedy_success"] == pytest.approx(0.25)
    assert s["control_greedy_ci95"] == list(wilson(75, 300))
    assert s["control_success"] == pytest.approx(100 / 300)
    assert s["control_ci95"] == list(wilson(100, 300))
    assert s["control_sft_steps"] == 333 and s["control_minutes"] == 21.04
    assert {k: v for k, v in s.items() if not k.startswith("control")} == {
        **plain,
        "wall_minutes": 60.0,
    }  # the other keys unchanged
    assert "control" in table(s)


def test_the_grpo_line_shows_the_kl_to_the_reference_when_there_is_one():
    from learner.training.loop import grpo_line

    r = {"step": 3, "reward": 0.5, "success": 0.25, "approx_kl": 0.0, "entropy": 0.3,
         "tokens_per_s": 800.0, "step_s": 50.0, "wait_s": 0.1, "policy_lag": 1.0}  # fmt: skip
    assert "KL 0.0000" in grpo_line(r, 24)
    line = grpo_line({**r, "kl_ref": 0.0375}, 24)
    assert line.startswith("grpo step 3/24  reward 0.500  success 0.250  KL 0.0375  ")
    assert "lag 1.0" in grpo_line({**r, "kl_ref": None}, 24)


def test_eval_reports_the_median_episode_length_of_all_and_of_the_successful():
    """rollout.eval's medians, by hand: lengths 2, 3, 12, 15 (rewards 0, 1, 1, 0.5) and an
    infrastructure error (left out): all 7.5, successful (3, 12) 7.5; an odd count."""
    import argparse

    from rollout.eval import summarise

    args = argparse.Namespace(mode="api", policy="server")
    rows = [
        {"reward": 0.0, "steps": 2, "status": "answered", "ms": [1.0]},
        {"reward": 1.0, "steps": 3, "status": "answered", "ms": [1.0]},
        {"reward": 1.0, "steps": 12, "status": "answered", "ms": [1.0]},
        {"reward": 0.5, "steps": 15, "status": "budget", "ms": [1.0]},
        {"reward": 0.0, "steps": 0, "status": "infra_error", "ms": []},
    ]
    r = summarise(args, rows, 1.0)
    assert r["median_steps"] == 7.5 and r["median_steps_success"] == 7.5
    r = summarise(args, rows[1:4], 1.0)
    assert r["median_steps"] == 12.0 and r["median_steps_success"] == 7.5
    r = summarise(args, rows[:1], 1.0)
    assert r["median_steps"] == 2.0 and r["median_steps_success"] == 0.0


def test_summary_names_its_config_and_the_test_episodes_lengths(tmp_path):
    from learner.train import DEFAULT_CONFIG, config_name

    def res(k, median, median_ok, n=300):
        return {
            "n": n, "success_rate": k / n, "mean_reward": k / n, "ci95": list(wilson(k, n)),
            "median_steps": median, "median_steps_success": median_ok,
        }  # fmt: skip

    results = {
        "before": res(90, 6.0, 11.0), "before_greedy": res(150, 9.0, 11.0),
        "after": res(160, 12.0, 12.0), "after_greedy": res(170, 12.0, 12.5),
    }  # fmt: skip
    s = summarize(
        RunConfig(), tmp_path, results, 30.0,
        config="configs/tiny-long.toml", overrides=["learner.seed=1"],
    )  # fmt: skip
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s
    assert on_disk["config"] == "configs/tiny-long.toml"
    assert on_disk["overrides"] == ["learner.seed=1"]
    assert on_disk["median_steps"] == {
        "before": 6.0,
        "before_greedy": 9.0,
        "after": 12.0,
        "after_greedy": 12.0,
    }
    assert on_disk["median_steps_success"]["after_greedy"] == 12.5
    del results["before"]["median_steps"]  # an evaluation from before the medians
    assert "before" not in summarize(RunConfig(), tmp_path, results, 30.0)["median_steps"]
    assert config_name(DEFAULT_CONFIG) == "configs/tiny.toml"
    assert config_name(str(tmp_path / "x.toml")) == str(tmp_path / "x.toml")
    assert config_name(None) is None


def test_curves_show_the_episodes_when_the_batches_carry_them(tmp_path):
    """A third panel (the figure 15 inches wide at 100 dpi, not 11) when metrics.jsonl has
    the batches' per-episode figures; a run from before them keeps two panels."""
    import struct

    def res(k, n=300):
        return {"n": n, "success_rate": k / n, "mean_reward": k / n, "ci95": list(wilson(k, n))}

    results = {"before": res(90), "before_greedy": res(150), "after": res(160)}
    results["after_greedy"] = res(170)

    def width(rows) -> int:
        run = tmp_path / f"run{len(rows[0])}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summarize(RunConfig(), run, results, 1.0)
        png = (run / "curves.png").read_bytes()
        return struct.unpack(">I", png[16:20])[0]  # the IHDR chunk's width

    plain = [{"step": s, "reward": s / 40, "success": s / 40} for s in range(1, 21)]
    assert width(plain) == 1100
    long = [
        {**r, "episode_actions": 10 + r["step"] / 4, "episode_actions_max": 30,
         "turns_per_episode": 10 + r["step"] / 4, "ended_budget": 0.2, "ended_error": 0.0}
        for r in plain
    ]  # fmt: skip
    assert width(long) == 1500
