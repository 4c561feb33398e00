"""`python -m learner.inspect` on real checkpoints, run as a separate process."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import optax
import pytest
from flax import nnx

from learner.checkpoint import Checkpointer
from learner.hf import load_hf
from learner.model import Model, get_params, tiny_config
from shared.config import load
from shared.tokenizer import TINY_TOKENIZER_DIR
from tests.conftest import REPO
from tests.learner.helpers import randomized

pytestmark = pytest.mark.multiprocess
CFG = tiny_config(num_layers=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect") / "ckpt"
    a = randomized(Model(CFG, rngs=nnx.Rngs(0)), seed=0)
    pa = get_params(a)
    pb = {k: v * 2.0 if k == "norm.weight" else v for k, v in pa.items()}  # one tensor changed
    with Checkpointer(root) as ck:
        ck.save(
            10,
            params=pa,
            opt_state=optax.adam(1e-3).init(pa),
            metrics={"loss": 1.25},
            data_cursor={"groups_seen": 160},
            config=load(None),
            model_config=CFG,
            tokenizer_dir=TINY_TOKENIZER_DIR,
        )
        ck.save(
            20,
            params=pb,
            metrics={"loss": 0.75},
            config=load(None, ["learner.learning_rate=3e-5"]),
            model_config=CFG,
            tokenizer_dir=TINY_TOKENIZER_DIR,
        )
    return root, pa, pb


def inspect(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "learner.inspect", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_table_lists_step_parameters_and_totals(ckpt):
    root, pa, _ = ckpt
    text = inspect(str(root / "10"))
    n = sum(v.size for v in pa.values())
    assert "step 10" in text and "committed: [10, 20]" in text
    assert "loss=1.25" in text and "groups_seen=160" in text
    assert (
        "embed_tokens" in text
        and "4096x128" in text
        and "layers.mlp.down_proj" in text
        and "2x384x128" in text
    )
    assert f"total: {n:,} parameters" in text and "optimizer state:" in text
    assert "qwen2, 2 layers, d_model 128" in text


def test_json_summary_of_the_latest_step(ckpt):
    root, _, pb = ckpt
    report = json.loads(inspect(str(root), "--json"))["summary"]
    assert report["step"] == 20 and report["metrics"] == {"loss": 0.75}
    params = {p["name"]: p for p in report["params"]}
    assert params.keys() == pb.keys()
    assert (
        params["embed_tokens"]["shape"] == [4096, 128]
        and params["embed_tokens"]["dtype"] == "float32"
    )
    assert params["embed_tokens"]["bytes"] == 4096 * 128 * 4
    assert "single device" in params["norm.weight"]["sharding"]
    assert report["total_params"] == sum(v.size for v in pb.values())
    assert report["total_bytes"] == 4 * report["total_params"]
    assert report["model"]["num_hidden_layers"] == 2


def test_diff_reports_config_and_tensor_changes(ckpt):
    root, pa, _ = ckpt
    d = json.loads(inspect(str(root / "10"), "--diff", str(root / "20"), "--json"))["diff"]
    assert d["config_diff"] == [{"key": "learner.learning_rate", "a": 1e-4, "b": 3e-5}]
    assert d["model_config_diff"] == []
    rows = {t["name"]: t for t in d["tensors"]}
    norm = np.linalg.norm(np.asarray(pa["norm.weight"], np.float64))
    # b = 2a for norm.weight: |b| = 2|a|, |b - a| = |a|, max |b - a| = max |a|
    assert rows["norm.weight"]["norm_b"] == pytest.approx(2 * norm)
    assert rows["norm.weight"]["diff_norm"] == pytest.approx(norm)
    assert rows["norm.weight"]["max_abs_diff"] == pytest.approx(
        float(np.abs(pa["norm.weight"]).max())
    )
    assert all(t["max_abs_diff"] == 0 for name, t in rows.items() if name != "norm.weight")
    table = inspect(str(root / "10"), "--diff", str(root / "20"))
    assert "learner.learning_rate: 0.0001 -> 3e-05" in table and "norm.weight" in table


def test_export_hf_writes_a_loadable_directory(ckpt, tmp_path):
    root, _, pb = ckpt
    inspect(str(root), "--export-hf", str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert (tmp_path / "hf/tokenizer.json").is_file()
    loaded = get_params(load_hf(tmp_path / "hf"))
    for k, v in pb.items():
        assert np.array_equal(
            loaded[k], np.asarray(v).astype(ml_dtypes.bfloat16).astype(np.float32)
        )
