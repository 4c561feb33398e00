"""`python -m learner.inspect` on real checkpoints, run as a separate process."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import optax
import pytest
from flax import nnx

from learner.inspect import print_diff
from learner.model.hf import load_hf
from learner.model.params import Model, get_params, tiny_config
from learner.training.checkpoint import Checkpointer
from shared.config import load
from shared.tokenizer import TINY_TOKENIZER_DIR
from tests.conftest import REPO
from tests.learner.helpers import randomized

pytestmark = pytest.mark.multiprocess
CFG = tiny_config(num_layers=2)
CFG8 = tiny_config(num_layers=8)
# the rollout's group ids (task id ``split-type-hash``, rollout instance, counter): 3 qa per browse_comp
GROUP_IDS = [
    f"train-{'browse_comp' if k % 4 == 0 else 'qa'}-{k * 7919:010d}.7b41a5ef.{k}"
    for k in range(192)
]


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


@pytest.fixture(scope="module")
def per_layer(tmp_path_factory):
    """A checkpoint of 8 layers saved one array per layer (``layers.3.mlp.up_proj``, the
    layout before stacking), without ``layers.4.mlp.up_proj`` and with a narrower
    ``layers.6.mlp.gate_proj``, and a data cursor of 192 group ids."""
    root = tmp_path_factory.mktemp("inspect") / "per_layer"
    stacked = get_params(Model(CFG8, rngs=nnx.Rngs(0)))
    params = {k: v for k, v in stacked.items() if not k.startswith("layers.")}
    for k, v in stacked.items():
        if k.startswith("layers."):
            params.update({f"layers.{i}.{k[len('layers.') :]}": v[i] for i in range(8)})
    del params["layers.4.mlp.up_proj"]
    params["layers.6.mlp.gate_proj"] = params["layers.6.mlp.gate_proj"][:, :192]
    with Checkpointer(root) as ck:
        ck.save(
            5,
            params=params,
            data_cursor={"groups": len(GROUP_IDS), "group_ids": GROUP_IDS},
            model_config=CFG8,
        )
    return root, params


def table_rows(text: str) -> dict[str, list[str]]:
    """The printed table's body rows (not its header) by their first cell."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()]
    return {r[0]: r[1:] for r in rows if r and r[0]}


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
    # a scanned stack is one array with the layer axis inside: one row as it is, nothing folded
    assert table_rows(text)["layers.mlp.down_proj"][:3] == ["2x384x128", "float32", ""]
    assert len(table_rows(text)) == len(pa)


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


def test_layers_fold_into_one_row_each(per_layer):
    root, params = per_layer
    text = inspect(str(root))
    rows = table_rows(text)
    # 12 arrays per layer: 10 folded whole, up_proj with a gap, gate_proj split by shape
    assert len([r for r in rows if r.startswith("layers")]) == 13
    assert len(rows) == 13 + 2  # and embed_tokens, norm.weight
    # 8 x 384 x 128 = 393,216 floats, 4 bytes each = 1.5 MiB
    assert rows["layers.{0..7}.mlp.down_proj"][:5] == [
        "384x128",
        "float32",
        "x8",
        "393,216",
        "1.5 MiB",
    ]
    assert rows["layers.{0..7}.self_attn.q_bias"][:3] == ["4x32", "float32", "x8"]
    assert rows["embed_tokens"][:3] == ["4096x128", "float32", ""]
    assert "layers.3.mlp.down_proj" not in text
    n = sum(v.size for v in params.values())
    assert f"total: {n:,} parameters" in text


def test_a_missing_layer_is_a_gap_and_other_shapes_are_not_folded(per_layer):
    rows = table_rows(inspect(str(per_layer[0])))
    assert rows["layers.{0..3,5..7}.mlp.up_proj"][:3] == ["128x384", "float32", "x7"]
    assert rows["layers.{0..5,7}.mlp.gate_proj"][:3] == ["128x384", "float32", "x7"]
    assert rows["layers.6.mlp.gate_proj"][:4] == ["128x192", "float32", "", "24,576"]


def test_all_lists_every_parameter(per_layer):
    root, params = per_layer
    rows = table_rows(inspect(str(root), "--all"))
    assert rows.keys() == params.keys()
    assert rows["layers.3.mlp.down_proj"][:3] == ["384x128", "float32", ""]


def test_data_cursor_is_counted_in_text_and_complete_in_json(per_layer):
    root, _ = per_layer
    text = inspect(str(root))
    assert "data_cursor: groups=192, 192 group_ids" in text
    assert "train-qa 144, train-browse_comp 48 (192 distinct tasks)" in text
    assert GROUP_IDS[0] in text and GROUP_IDS[2] in text and GROUP_IDS[-1] in text
    assert sum(gid in text for gid in GROUP_IDS) == 6  # the first and last three
    report = json.loads(inspect(str(root), "--json"))["summary"]
    assert report["data_cursor"] == {"groups": 192, "group_ids": GROUP_IDS}
    assert len(report["params"]) == len(per_layer[1])  # every array, unfolded


def test_diff_folds_layers_with_their_joint_norms():
    from rich.console import Console

    def row(i, shape, na, nb, dn, mx):
        return {"name": f"layers.{i}.w", "shape": shape, "norm_a": na, "norm_b": nb,
                "diff_norm": dn, "max_abs_diff": mx}  # fmt: skip

    d = {
        "a": {"path": "a", "step": 1},
        "b": {"path": "b", "step": 2},
        "config_diff": [],
        "model_config_diff": [],
        "tensors": [
            row(0, [2], 3.0, 6.0, 0.6, 0.1),
            row(1, [2], 4.0, 8.0, 0.8, 0.3),
            row(2, [3], 1.0, 1.0, 0.0, 0.0),
            {"name": "layers.3.w", "only_in": "b", "shapes": [None, [2]]},
        ],
    }
    console = Console(record=True, width=160)
    print_diff(d, console)
    rows = table_rows(console.export_text())
    # layers 0 and 1 together: |a| = sqrt(3^2 + 4^2) = 5, |b| = sqrt(6^2 + 8^2) = 10,
    # |b - a| = sqrt(0.6^2 + 0.8^2) = 1, max |b - a| = max(0.1, 0.3) = 0.3
    assert rows["layers.{0..1}.w"] == ["x2", "5", "10", "1", "0.3"]
    assert rows["layers.2.w"] == ["", "1", "1", "0", "0"]  # another shape
    assert rows["layers.3.w"][3] == "shapes [None, [2]]"
    console = Console(record=True, width=160)
    print_diff(d, console, fold=False)
    assert {f"layers.{i}.w" for i in range(4)} <= table_rows(console.export_text()).keys()
