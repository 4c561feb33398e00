"""The frozen reference's logprobs, computed as a step's groups arrive.

With a KL term (``learner.kl_coef`` > 0) and ``learner.reference_forward = "on_arrival"``
the learner runs the reference's forward pass on the groups that came from the sidecars
while it waits for the rest of the step's batch, and gives the step their logprobs
(``ref_logp_bt``), so the step does no second forward pass and the reference costs the
step's critical path only its last chunk.

A trajectory's reference logprobs do not depend on the rows it shares a batch with (it
attends only to itself), so they are computed on rows of their own
(:func:`learner.training.batching.reference_rows`: one trajectory per row) and handed to
:func:`~learner.training.batching.pack` by ``(group id, trajectory index)``. Only the
trajectories the step keeps are computed (groups whose rewards all agree are dropped
first), in chunks of ``learner.reference_chunk_rows`` rows: a chunk runs as soon as
enough trajectories are queued (the longest first, so that a chunk's rows are of
similar length), and the last, partly filled one when the batch is complete. Each chunk
is dispatched without waiting for it (JAX runs it while the learner goes back to the
long poll); :meth:`ArrivalReference.finish` reads them all back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from learner.training.batching import kept_trajectories, reference_rows, reference_values
from learner.training.step import place_batch
from shared.wire import TrajectoryGroup

Key = tuple[str, int]


class ArrivalReference:
    """Queues arriving groups' kept trajectories and runs the reference on them in chunks.

    ``ref_fn(ref_params, batch) -> (rows, T)`` is
    :func:`learner.training.step.compile_reference`'s program; ``chunk_rows`` a multiple
    of the rows the mesh (and the micro-batches) split a batch into. After each step's
    :meth:`finish`, ``last`` holds that step's figures: chunks run, trajectories, padding
    rows computed, and the seconds :meth:`finish` took (what the step waited for)."""

    def __init__(
        self,
        ref_fn: Callable[[Any, Mapping[str, Any]], Any],
        mesh: Mesh | None,
        *,
        chunk_rows: int,
        buckets: Sequence[int],
        pad_id: int = 0,
        scale_rewards: bool = True,
        adv_ddof: int = 1,
    ) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        self.ref_fn, self.mesh = ref_fn, mesh
        self.chunk_rows, self.buckets, self.pad_id = chunk_rows, tuple(buckets), pad_id
        self.scale_rewards, self.adv_ddof = scale_rewards, adv_ddof
        self.last: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self.pending: list[tuple[Key, np.ndarray]] = []
        self.running: list[tuple[list[tuple[Key, np.ndarray]], list, Any]] = []
        self.seen: set[str] = set()
        self.padding = 0

    def add(self, groups: Sequence[TrajectoryGroup], ref_params: Any) -> None:
        """Queue the kept trajectories of ``groups`` (a group already queued is skipped)
        and dispatch every full chunk."""
        fresh = [g for g in groups if g.group_id not in self.seen]
        self.seen.update(g.group_id for g in fresh)
        self.pending += kept_trajectories(
            fresh, scale_rewards=self.scale_rewards, adv_ddof=self.adv_ddof
        )
        if len(self.pending) < self.chunk_rows:
            return
        self.pending.sort(key=lambda item: -len(item[1]))  # stable: arrival order within
        while len(self.pending) >= self.chunk_rows:
            chunk, self.pending = (
                self.pending[: self.chunk_rows],
                self.pending[self.chunk_rows :],
            )
            self._dispatch(chunk, ref_params)

    def finish(self, ref_params: Any) -> dict[Key, np.ndarray]:
        """Every queued trajectory's reference logprobs (the last chunk padded), read back;
        then empty for the next step."""
        t0 = time.perf_counter()
        if self.pending:
            self.pending.sort(key=lambda item: -len(item[1]))
            self._dispatch(self.pending, ref_params)
        out: dict[Key, np.ndarray] = {}
        for chunk, runs, ref_bt in self.running:
            out.update(reference_values(chunk, runs, np.asarray(ref_bt)))
        self.last = {
            "ref_chunks": float(len(self.running)),
            "ref_trajectories": float(len(out)),
            "ref_padding_rows": float(self.padding),
            "ref_finish_s": time.perf_counter() - t0,
        }
        self._reset()
        return out

    def _dispatch(self, chunk: list[tuple[Key, np.ndarray]], ref_params: Any) -> None:
        arrays, runs = reference_rows(
            chunk, rows=self.chunk_rows, buckets=self.buckets, pad_id=self.pad_id
        )
        self.padding += self.chunk_rows - len(chunk)
        ref_bt = self.ref_fn(ref_params, place_batch(arrays, self.mesh))  # not waited for
        self.running.append((chunk, runs, ref_bt))
