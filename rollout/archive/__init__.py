"""The web an episode saw, recorded as WARC and replayed with the network off.

:mod:`~rollout.archive.store` (the writer and the archive that answers requests),
:mod:`~rollout.archive.format` (the bytes: WARC records), :mod:`~rollout.archive.index`
(where each exchange lies), :mod:`~rollout.archive.origin` (the local web's origin in an
archive) and :mod:`~rollout.archive.browser` (a browser context's traffic recorded and
replayed); ``python -m rollout.archive``.

What it may import: :mod:`shared` and its own modules; nothing else of :mod:`rollout`
(``tests/test_import_boundaries.py``).
"""
