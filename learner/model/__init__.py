"""The model: its architecture and parameters, the forward pass, and where weights come from.

:mod:`~learner.model.config` (the architecture, read from and written to HF ``config.json``),
:mod:`~learner.model.params` (the parameters in Flax NNX), :mod:`~learner.model.decoder`
(the forward pass as pure functions), :mod:`~learner.model.attention` (the kernels),
:mod:`~learner.model.logprobs` (token logprobs and entropy, chunked),
:mod:`~learner.model.hf` and :mod:`~learner.model.safetensors_io` (Hugging Face import and
export), :mod:`~learner.model.loading` (a built-in config, an HF directory or an Orbax
checkpoint, one entry point).

What it may import: :mod:`shared` and the JAX stack; :mod:`learner.model.loading` also
reads checkpoints through :mod:`learner.training.checkpoint`. Never the serving or
training code otherwise, nor anything of :mod:`rollout`.
"""

from shared.moved import forward_names

# ``learner.model`` was the module that :mod:`learner.model.params` now is: its names are
# still served from here (with a warning), for code written against that path.
_PARAMS_NAMES = frozenset({
    "KVCache", "Model", "ModelConfig", "Options", "ParamInfo", "RopeScaling", "apply",
    "get_params", "init_cache", "param_info", "rope_inv_freq", "sequence_logprobs",
    "set_params", "tiny_config",
})  # fmt: skip


__getattr__ = forward_names("learner.model", "learner.model.params", _PARAMS_NAMES)
