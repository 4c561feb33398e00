"""Errors the learner's entry points report as one line (kept free of JAX imports)."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; training stopped at the last committed one."""


class RunConfigError(ValueError):
    """The run config asks for what the run cannot give (found before it spends anything)."""
