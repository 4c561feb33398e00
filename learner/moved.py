"""The learner's module paths from before its packages by role, kept as aliases.

The learner's modules once sat side by side in ``learner/`` (``learner.step``,
``learner.engine``, ``learner.batching``, ...); they now live in :mod:`learner.model`,
:mod:`learner.serving`, :mod:`learner.training` and :mod:`learner.embedded`. A script
written against the old paths still imports: each old name is the very module that
replaced it, with a ``DeprecationWarning`` naming the new path (:mod:`shared.moved`).
``learner.model`` was a module and is now a package: its old names (``Model``,
``param_info``, ``set_params``, ...) come from :mod:`learner.model.params` through the
package's ``__getattr__``. ``import learner`` installs :data:`MOVED`.
"""

from __future__ import annotations

# old module path -> the module that holds its code now
MOVED: dict[str, str] = {
    "learner.api": "learner.serving.api",
    "learner.attention": "learner.model.attention",
    "learner.batching": "learner.training.batching",
    "learner.checkpoint": "learner.training.checkpoint",
    "learner.decoder": "learner.model.decoder",
    "learner.distributed": "learner.training.distributed",
    "learner.dryrun": "learner.training.dryrun",
    "learner.engine": "learner.serving.engine",
    "learner.extend": "learner.serving.extend",
    "learner.grpo": "learner.training.grpo",
    "learner.hf": "learner.model.hf",
    "learner.host_memory": "learner.training.host_memory",
    "learner.loading": "learner.model.loading",
    "learner.logprobs": "learner.model.logprobs",
    "learner.loop": "learner.training.loop",
    "learner.modelconfig": "learner.model.config",
    "learner.pipeline": "learner.embedded.pipeline",
    "learner.prefix_cache": "learner.serving.prefix_cache",
    "learner.safetensors_io": "learner.model.safetensors_io",
    "learner.sampling": "learner.serving.sampling",
    "learner.scheduler": "learner.serving.scheduler",
    "learner.sharding": "learner.training.sharding",
    "learner.source": "learner.training.source",
    "learner.step": "learner.training.step",
    "learner.trackers": "learner.training.trackers",
}
