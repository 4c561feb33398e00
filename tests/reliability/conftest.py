"""The fault suite; its table fixture (``fault``) lives in ``tests/conftest.py``."""
