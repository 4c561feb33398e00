"""The learner: JAX/Flax GRPO over a device mesh (see README).

It holds everything JAX: the model and its Hugging Face import and export, GRPO and
the train step, the shardings, the train loop and its hooks, Orbax checkpoints, the
embedded inference server (:mod:`learner.serve`) and the embedded pipeline that starts
the rest of a run on one machine.

What it may import: :mod:`shared` (the wire schema, the run config, the tokenizer) and
the JAX stack; never :mod:`rollout` or playwright: it reaches the rollout side over
HTTP only (``tests/test_import_boundaries.py``).

Importing it with ``LEARNER_KEEP_FREED_MEMORY=1`` in the environment keeps freed host
memory in the process for XLA:CPU's large per-run buffers (:mod:`learner.host_memory`)."""

from learner.host_memory import keep_freed_memory

keep_freed_memory()
