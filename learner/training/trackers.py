"""Experiment trackers: one fan-out for a run's metric lines, config and result files.

``logging.trackers`` names the backends: ``jsonl`` (``metrics.jsonl`` in the run
directory, one JSON object a line, as logged: the plot and the tests read it),
``tensorboard`` (``<run>/tensorboard``, tensorboardX), ``wandb`` (Weights & Biases,
offline by default: ``<run>/wandb/offline-run-*``, uploaded later with ``wandb
sync``; no network, no API key) and ``mlflow`` (a SQLite store in ``<run>/mlflow``
unless ``logging.mlflow_tracking_uri`` names another). W&B and MLflow get the run
config as the run's parameters and the files given to :meth:`Trackers.artifact`;
their run ids are kept in ``<run>/trackers.json`` so a restarted run, and the
pipeline's summary after training, continue the same tracker run.

A configured W&B or MLflow whose package is missing fails at start
(:class:`TrackerError`, naming the pip extra); TensorBoard, in the default list,
is skipped with a warning when tensorboardX is missing. A tracker that fails
later (a full disk, a lost server) is logged once and dropped: a tracker never
stops a training run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import re
import shutil
import time
from numbers import Real
from pathlib import Path
from typing import Any

from shared.config import LoggingConfig, RunConfig, to_dict

log = logging.getLogger("learner.train")

TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")
INSTALL = "make setup-test (the locked versions) or pip install -e '.[trackers]'"
IDS_FILE = "trackers.json"  # the W&B and MLflow run ids of this run directory
PARAM_VALUE_MAX = 500  # MLflow's longest parameter value before 2.x servers; newer take 6000


class TrackerError(RuntimeError):
    """A configured tracker that cannot start (its package missing, a refused login)."""


def flatten(record: dict[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level: ``{"eval": {"success": 1}}`` -> ``{"eval/success": 1}``."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, sep, key))
        else:
            out[key] = v
    return out


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metric line, flattened; not its ``step`` and ``time``."""
    return {
        k: float(v)
        for k, v in flatten(record).items()
        if k not in ("step", "time")
        and isinstance(v, Real)  # numpy's too
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


def _require(module: str, tracker: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackerError(
            f"logging.trackers includes {tracker!r} but {module} is not installed "
            f"({e}); install the trackers: {INSTALL}"
        ) from None


# ----------------------------------------------------------------------------- backends


class _Jsonl:
    name = "jsonl"

    def __init__(self, run_dir: Path) -> None:
        self.file = (run_dir / "metrics.jsonl").open("a")

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def artifact(self, path: Path) -> None:
        pass

    def close(self) -> None:
        self.file.close()


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        tbx = _require("tensorboardX", self.name)
        self.writer = tbx.SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, record: dict[str, Any]) -> None:
        for k, v in numbers(record).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def artifact(self, path: Path) -> None:
        pass

    def close(self) -> None:
        self.writer.close()


class _WandB:
    """A W&B run in ``<run>/wandb``; offline unless ``logging.wandb_mode = "online"``."""

    name = "wandb"

    def __init__(self, opts: LoggingConfig, run_dir: Path, config: dict, name: str, run_id):
        self.wandb = _require("wandb", self.name)
        self.run = self.wandb.init(
            mode=opts.wandb_mode,
            dir=str(run_dir),
            project=opts.wandb_project,
            entity=opts.wandb_entity,
            name=name,
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
            settings=self.wandb.Settings(console="off", silent=True),
        )
        self.id = self.run.id

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.run.log(numbers(record), step=step)

    def artifact(self, path: Path) -> None:
        """A copy in the run's files (a link would dangle once the run directory moves)."""
        dest = Path(self.run.dir) / path.name
        shutil.copyfile(path, dest)
        self.run.save(str(dest), base_path=self.run.dir, policy="now")

    def close(self) -> None:
        try:
            self.run.finish()
        finally:
            self.wandb.teardown()  # stops the wandb-core service process


class _MLflow:
    """An MLflow run: parameters once, a metric batch per line, files as artifacts."""

    name = "mlflow"

    def __init__(self, opts: LoggingConfig, run_dir: Path, config: dict, name: str, run_id):
        _require("mlflow", self.name)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        uri = opts.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:  # a SQLite store in the run directory (MLflow 3 retires the file store)
            _require("sqlalchemy", self.name)
            _require("alembic", self.name)
            store = (run_dir / "mlflow").absolute()
            store.mkdir(parents=True, exist_ok=True)
            uri, artifacts = f"sqlite:///{store / 'mlflow.db'}", (store / "artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        if run_id:
            try:
                self.client.update_run(run_id, status="RUNNING")
            except Exception as e:  # another store than the one it was created in
                log.warning("MLflow run %s not found (%s); starting a new one", run_id, e)
                run_id = None
        if not run_id:
            exp = self.client.get_experiment_by_name(opts.mlflow_experiment)
            exp_id = (
                exp.experiment_id
                if exp is not None
                else self.client.create_experiment(opts.mlflow_experiment, artifacts)
            )
            run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        self.id = run_id
        logged = self.client.get_run(run_id).data.params  # a restart adds only new keys
        params = [
            Param(_mlflow_key(k), _param_value(v))
            for k, v in config.items()
            if _mlflow_key(k) not in logged
        ]
        for i in range(0, len(params), 100):  # MLflow's most parameters per batch
            self.client.log_batch(run_id, params=params[i : i + 100])

    def log(self, step: int, record: dict[str, Any]) -> None:
        ms = int(time.time() * 1000)
        metrics = [self.Metric(_mlflow_key(k), v, ms, step) for k, v in numbers(record).items()]
        if metrics:
            self.client.log_batch(self.id, metrics=metrics)

    def artifact(self, path: Path) -> None:
        self.client.log_artifact(self.id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.id)


def _mlflow_key(key: str) -> str:
    """A metric or parameter name MLflow accepts: ``[\\w./\\- ]``, at most 250 characters."""
    return re.sub(r"[^\w./\- ]", "_", key)[:250]


def _param_value(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, list | tuple | bool) else str(v)
    return s if len(s) <= PARAM_VALUE_MAX else s[: PARAM_VALUE_MAX - 3] + "..."


# ----------------------------------------------------------------------------- fan-out


class Trackers:
    """Every configured tracker behind one ``log`` / ``artifact`` / ``close``."""

    def __init__(self, names: tuple[str, ...] | list[str], options: LoggingConfig) -> None:
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise TrackerError(
                f"logging.trackers: unknown tracker {unknown[0]!r}; valid: {', '.join(TRACKERS)}"
            )
        self.names = list(dict.fromkeys(names))
        self.options = options
        self.backends: list[Any] = []

    def start(self, run_dir: Path, config: dict[str, Any], name: str) -> Trackers:
        """Open every backend; on a failure close those already open and raise."""
        run_dir = Path(run_dir)
        ids_file = run_dir / IDS_FILE
        ids = json.loads(ids_file.read_text()) if ids_file.is_file() else {}
        try:
            for n in self.names:
                if n == "jsonl":
                    self.backends.append(_Jsonl(run_dir))
                elif n == "tensorboard":  # in the default: off, with a warning, if missing
                    try:
                        self.backends.append(_TensorBoard(run_dir))
                    except TrackerError as e:
                        log.warning("%s; TensorBoard is off", e)
                else:
                    cls = _WandB if n == "wandb" else _MLflow
                    b = cls(self.options, run_dir, config, name, ids.get(n))
                    self.backends.append(b)
                    ids[n] = b.id
        except BaseException:
            self.close()
            raise
        if any(n in ids for n in ("wandb", "mlflow")):
            ids_file.write_text(json.dumps(ids) + "\n")
        return self

    def log(self, step: int, record: dict[str, Any]) -> None:
        """One metric line: as it is to ``jsonl``; its numbers, flattened with '/', elsewhere."""
        self._each(lambda b: b.log(step, record))

    def artifact(self, path: str | Path) -> None:
        """A result file (the summary table, ``curves.png``) kept with the W&B / MLflow run."""
        self._each(lambda b: b.artifact(Path(path)))

    def close(self) -> None:
        backends, self.backends = self.backends, []
        for b in backends:
            try:
                b.close()
            except Exception as e:
                log.warning("tracker %s: closing failed (%s: %s)", b.name, type(e).__name__, e)

    def _each(self, call) -> None:
        for b in list(self.backends):
            try:
                call(b)
            except Exception as e:  # a full disk, a lost server: the training goes on
                log.warning(
                    "tracker %s failed (%s: %s); it is off for the rest of this run",
                    b.name, type(e).__name__, e,
                )  # fmt: skip
                self.backends.remove(b)
                with contextlib.suppress(Exception):
                    b.close()


def open_trackers(
    cfg: RunConfig, run_dir: Path, names: tuple[str, ...] | list[str] | None = None
) -> Trackers:
    """``logging.trackers`` (or ``names`` of them) started for ``run_dir``, with the run
    config as parameters (keys ``section.key``, as ``--set`` spells them)."""
    chosen = cfg.logging.trackers if names is None else names
    config = flatten(to_dict(cfg), sep=".")
    return Trackers(chosen, cfg.logging).start(Path(run_dir), config, Path(run_dir).name)
