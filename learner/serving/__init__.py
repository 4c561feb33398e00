"""Inference: the embedded server that speaks SGLang's protocol, and the real engines.

:mod:`~learner.serving.engine` (batched generation with a KV cache),
:mod:`~learner.serving.scheduler` (dynamic batching), :mod:`~learner.serving.prefix_cache`
and :mod:`~learner.serving.extend` (prefixes kept between requests, prefill on top of
them), :mod:`~learner.serving.sampling`, :mod:`~learner.serving.api` (``/generate`` as
plain data), :mod:`~learner.serving.server` (the HTTP server, ``python -m learner.serve``)
and :mod:`~learner.serving.engines` (a real SGLang or vLLM server as one of the run's
children, ``python -m learner.engines``).

What it may import: :mod:`learner.model`, :mod:`shared` and the JAX stack;
:mod:`~learner.serving.engines` also the HF export of :mod:`learner.inspect`. Never
:mod:`learner.training` or :mod:`learner.embedded`, nor anything of :mod:`rollout`.
"""
