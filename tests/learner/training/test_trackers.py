"""Experiment trackers: W&B offline and MLflow's local store, read back with their own APIs."""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import sys
from pathlib import Path

import pytest

from learner.training.trackers import INSTALL, TrackerError, Trackers, flatten, numbers
from shared.config import ConfigError, LoggingConfig, from_dict, load
from tests.learner.helpers import ListSource
from tests.learner.step_child import groups as make_groups

STEPS, GROUPS_PER_STEP, G = 3, 2, 4


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B and MLflow with no network, no credentials and nothing written outside tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (("DIR", "dir"), ("CONFIG_DIR", "config"), ("CACHE_DIR", "cache")):
        monkeypatch.setenv(f"WANDB_{var}", str(home / f"wandb-{sub}"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))
    monkeypatch.setenv("NETRC", str(home / "no-netrc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))  # wandb-core's debug logs
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    yield
    assert _service_processes() == [], "the wandb service outlived its run"


def _service_processes() -> list[str]:
    """wandb-core (and its system monitor) processes started by this process."""
    me, found = str(os.getpid()), []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if any("wandb" in c for c in cmd[:1]) and (ppid == me or me in cmd):
            found.append(" ".join(cmd))
    return found


def wandb_records(run_file: Path):
    """The records of a W&B transaction log (``run-<id>.wandb``), parsed with wandb's own
    protobuf schema: a 7-byte header, then LevelDB-log chunks in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero fill at the end of a block
            continue
        buf = chunk if kind in (1, 2) else buf + chunk  # full / first, middle / last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


# ----------------------------------------------------------------------------- unit


def test_unknown_tracker_is_rejected_at_config_load_listing_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        load(None, ['logging.trackers=["jsonl", "comet"]'])
    assert "logging.trackers[1] = 'comet'" in str(e.value)
    for name in ("jsonl", "tensorboard", "wandb", "mlflow"):
        assert repr(name) in str(e.value)
    assert from_dict({}).logging.trackers == ("jsonl", "tensorboard")


def test_a_missing_package_fails_at_start_naming_the_extra(tmp_path, monkeypatch, caplog):
    for module in ("wandb", "mlflow", "tensorboardX"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    for name in ("wandb", "mlflow"):
        with pytest.raises(TrackerError) as e:
            Trackers(["jsonl", name], LoggingConfig()).start(tmp_path, {}, "run")
        assert INSTALL in str(e.value) and repr(name) in str(e.value)
    # TensorBoard, in the default list, is skipped with a warning (as before the trackers)
    with caplog.at_level(logging.WARNING, "learner.train"):
        t = Trackers(["jsonl", "tensorboard"], LoggingConfig()).start(tmp_path, {}, "run")
    assert [b.name for b in t.backends] == ["jsonl"]
    assert "tensorboardX" in caplog.text and INSTALL in caplog.text
    t.close()


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_warning(tmp_path, caplog):
    class DiskFull:
        def write(self, _):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    ok, full = tmp_path / "ok", tmp_path / "full"
    ok.mkdir(), full.mkdir()
    t = Trackers(["jsonl"], LoggingConfig()).start(ok, {}, "run")
    broken = Trackers(["jsonl"], LoggingConfig()).start(full, {}, "run").backends[0]
    broken.file.close()
    broken.file = DiskFull()
    t.backends.append(broken)
    with caplog.at_level(logging.WARNING, "learner.train"):
        for step in (1, 2, 3):
            t.log(step, {"step": step, "loss": 0.5})
    t.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
    lines = [json.loads(x) for x in (ok / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]


def test_numbers_are_flattened_with_slashes_and_only_finite_numbers_kept():
    record = {"step": 3, "time": 1.0, "loss": 0.5, "ok": True, "none": None,
              "eval": {"success_rate": 0.25, "n": 4, "ci95": [0.1, 0.6], "mode": "api"},
              "nan": float("nan")}  # fmt: skip
    assert numbers(record) == {"loss": 0.5, "eval/success_rate": 0.25, "eval/n": 4.0}
    assert flatten({"a": {"b": 1}}, sep=".") == {"a.b": 1}


# ----------------------------------------------------------------------------- integration


def _results() -> dict[str, dict]:
    r = {"n": 10, "success_rate": 0.4, "mean_reward": 0.45, "ci95": [0.17, 0.69]}
    after = {**r, "success_rate": 0.7, "ci95": [0.4, 0.89]}
    return {"before": r, "before_greedy": r, "after": after, "after_greedy": after}


def test_training_and_summary_reach_wandb_offline_and_mlflow(tmp_path, offline, capsys):
    pytest.importorskip("wandb", reason=f"the trackers extra: {INSTALL}")
    pytest.importorskip("mlflow", reason=f"the trackers extra: {INSTALL}")
    from mlflow.tracking import MlflowClient

    from learner.embedded.pipeline import summarize
    from learner.training.loop import Trainer

    cfg = from_dict(
        {
            "rollout": {"urls": ["http://unused"], "group_size": G},
            "learner": {"groups_per_step": GROUPS_PER_STEP, "steps": STEPS,
                        "length_buckets": [16, 32], "warmup_steps": 0},
            "logging": {"trackers": ["jsonl", "wandb", "mlflow"], "progress": False,
                        "wandb_project": "trackers-test", "mlflow_experiment": "trackers-test"},
        }
    )  # fmt: skip
    run_dir = tmp_path / "run"
    trainer = Trainer(cfg, run_dir)
    try:
        trainer.run(ListSource(make_groups(0, n=STEPS * GROUPS_PER_STEP, g=G)))
    finally:
        trainer.close()
    summary = summarize(cfg, run_dir, _results(), 1.0)
    capsys.readouterr()
    jsonl = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in jsonl] == list(range(1, STEPS + 1))
    loss = {r["step"]: r["loss"] for r in jsonl}
    ids = json.loads((run_dir / "trackers.json").read_text())

    # W&B: the training's offline run and the summary's, resumed under the same id
    run_files = sorted((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-*.wandb"))
    assert len(run_files) == 2, list((run_dir / "wandb").iterdir())
    records = [r for f in run_files for r in wandb_records(f)]
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in runs} == {ids["wandb"]} and runs[0].project == "trackers-test"
    config = {u.key: json.loads(u.value_json) for r in runs for u in r.config.update}
    assert config["learner.steps"] == STEPS and config["logging.trackers"][1] == "wandb"
    history: dict[int, dict] = {}  # the summary's run adds test/... to the last step
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {_item_key(i): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(r.history.step.num, {}).update(row)
    assert sorted(history) == list(range(1, STEPS + 1))
    for step, row in history.items():
        assert row["loss"] == pytest.approx(loss[step], rel=1e-6)
    assert history[STEPS]["test/grpo_success"] == summary["grpo_success"]
    saved = {
        f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files
    }
    assert {"summary.txt", "summary.json", "curves.png"} <= saved
    files_dir = run_files[1].parent / "files"
    assert (files_dir / "curves.png").read_bytes() == (run_dir / "curves.png").read_bytes()
    assert not (files_dir / "curves.png").is_symlink()

    # MLflow: the SQLite store in the run directory
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "trackers-test"
    assert run.data.params["learner.steps"] == str(STEPS)
    assert run.data.params["logging.trackers"] == '["jsonl", "wandb", "mlflow"]'
    hist = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in hist] == list(range(1, STEPS + 1))
    assert [m.value for m in hist] == pytest.approx([loss[s] for s in range(1, STEPS + 1)])
    assert run.data.metrics["test/grpo_success"] == summary["grpo_success"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.txt", "summary.json", "curves.png"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "summary.txt", str(tmp_path)))
    assert local.read_text() == (run_dir / "summary.txt").read_text()
    assert "after GRPO" in local.read_text()
