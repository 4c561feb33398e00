"""How ``learner.engines`` starts an engine: the command line, its environment, the
weights it restarts from. No engine runs here (``tests/learner/serving/test_engines.py`` runs
them)."""

from __future__ import annotations

from learner.serving.engines import (
    OFFLINE,
    REPO,
    engine_python,
    launch,
    newest_export,
    served_dtype,
)
from shared.config import InferenceConfig


def test_the_sglang_command_on_a_cpu_and_on_a_gpu():
    inf = InferenceConfig(backend="sglang", max_context_tokens=640, engine_args=("--tp-size", "2"))
    cpu = launch(inf, "/m", 4000, "float32", gpu=False)
    assert cpu.argv[:3] == [str(REPO / ".venv-sglang" / "bin" / "python"), "-m",
                            "sglang.launch_server"]  # fmt: skip
    assert cpu.url == "http://127.0.0.1:4000"
    joined = " ".join(cpu.argv)
    for flag in ("--model-path /m", "--port 4000", "--skip-tokenizer-init", "--dtype float32",
                 "--context-length 640", "--device cpu", "--attention-backend torch_native"):  # fmt: skip
        assert flag in joined
    assert cpu.argv[-2:] == ["--tp-size", "2"]  # the user's flags come last
    assert cpu.env == {**OFFLINE, "SGLANG_USE_CPU_ENGINE": "1"}
    assert cpu.env["HF_HUB_OFFLINE"] == "1"  # a wrong path is not looked up on the hub
    gpu = launch(inf, "/m", 4000, "bfloat16", gpu=True)
    assert "--device" not in gpu.argv and gpu.env == OFFLINE and "bfloat16" in gpu.argv


def test_the_vllm_command_asks_for_token_io_and_processed_logprobs():
    inf = InferenceConfig(backend="vllm", engine_python="/opt/vllm/bin/python")
    spec = launch(inf, "/m", 4001, "float32", gpu=False)
    assert spec.argv[0] == "/opt/vllm/bin/python" == engine_python(inf)
    joined = " ".join(spec.argv)
    for flag in ("--model /m", "--enable-scale-out", "--logprobs-mode processed_logprobs",
                 "--skip-tokenizer-init", "--max-model-len 1024", "--enforce-eager"):  # fmt: skip
        assert flag in joined
    assert spec.env["VLLM_SERVER_DEV_MODE"] == "1" and spec.env["VLLM_NO_USAGE_STATS"] == "1"
    assert "--enforce-eager" not in launch(inf, "/m", 1, "float32", gpu=True).argv


def test_restarts_take_the_newest_complete_export(tmp_path):
    assert newest_export(tmp_path) is None
    for step in (3, 12, 7):
        (tmp_path / "hf" / str(step)).mkdir(parents=True)
        (tmp_path / "hf" / str(step) / "config.json").write_text("{}")
    (tmp_path / "hf" / "20").mkdir()  # no config.json: not complete
    (tmp_path / "hf" / ".13.tmp-x").mkdir()  # an export being written
    assert newest_export(tmp_path) == (tmp_path / "hf" / "12", 12)


def test_the_served_dtype():
    assert served_dtype(InferenceConfig(), "float32") == "float32"
    assert served_dtype(InferenceConfig(), "bfloat16") == "bfloat16"
    assert served_dtype(InferenceConfig(dtype="bfloat16"), "float32") == "bfloat16"
