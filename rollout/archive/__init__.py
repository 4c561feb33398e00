"""The web an episode saw, recorded as WARC and replayed with the network off.

:mod:`~rollout.archive.store` (the writer and the archive that answers requests),
:mod:`~rollout.archive.format` (the bytes: WARC records), :mod:`~rollout.archive.index`
(where each exchange lies), :mod:`~rollout.archive.origin` (the local web's origin in an
archive) and :mod:`~rollout.archive.browser` (a browser context's traffic recorded and
replayed); ``python -m rollout.archive``.

What it may import: :mod:`shared` and its own modules; nothing else of :mod:`rollout`
(``tests/test_import_boundaries.py``).
"""

from shared.moved import forward_names

# ``rollout.archive`` was the module that :mod:`rollout.archive.store` now is: its names
# are still served from here (with a warning), for code written against that path.
_STORE_NAMES = frozenset({
    "KINDS", "ORIGINAL", "Archive", "ArchiveWriter", "Exchange", "archived_headers",
    "encode_exchange", "export_episode", "main", "normalise_url", "summary",
})  # fmt: skip

__getattr__ = forward_names("rollout.archive", "rollout.archive.store", _STORE_NAMES)
