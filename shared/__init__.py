"""What the learner and the rollout side must agree on: the wire schema
(:mod:`shared.wire`), the run config (:mod:`shared.config`), the tokenizer and chat
template, the progress lines, the lifeline of child processes, and the aliases that keep
moved module paths importable (:mod:`shared.moved`).

What it may import: its own modules and libraries neither side owns; never
:mod:`learner` or :mod:`rollout`, nor jax, flax, optax, orbax or playwright
(``tests/test_import_boundaries.py``).
"""
