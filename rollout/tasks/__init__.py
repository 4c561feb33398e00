"""Research tasks over the local web: questions, answers, evidence and gold paths.

The generator (:mod:`~rollout.tasks.generate`, with its templates, chains and
long-horizon families), the in-tree task sources (:mod:`~rollout.tasks.sources`) and
``python -m rollout.tasks``.

What it may import: the registry, :mod:`rollout.web` (the data tasks are drawn from)
and :mod:`shared`; never the environment, the verifiers or :mod:`rollout.tools`, which
builds on the split rule here. Its ``__main__``, a command, may import anything.
"""
