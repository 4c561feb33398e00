"""Errors the learner's entry points report as one line (kept free of JAX imports)."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; training stopped at the last committed one."""
