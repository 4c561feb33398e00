"""Trajectory groups -> the padded arrays one train step consumes.

Every batch has a fixed number of rows (``rows``) of one length bucket (the
smallest of ``learner.length_buckets`` that holds the longest sequence, so a run
compiles at most one program per bucket). Groups whose rewards all agree carry
no GRPO signal and are dropped. A group whose per-token values are invalid (a
loss mask other than 0/1, a non-finite logprob: :func:`shared.wire.check_values`,
which decoding leaves to the consumer) is dropped too and counted in
``stats["invalid_groups"]``.

Rows are laid out for next-token prediction: column t of ``tokens_bt`` is the
input at position t and column t of ``targets_bt`` is the token it predicts
(input t + 1); ``mask_bt`` and ``rollout_logp_bt`` describe that target, i.e.
they are the wire's ``loss_mask`` and ``logprobs`` shifted left by one. A
trajectory of L tokens takes L - 1 columns (fewer when the bucket truncates it).

Unpacked (the default), each trajectory has a row of its own and the rows left
free are padding with an all-zero loss mask. Packed (``packing=True``), the
trajectories are placed first-fit-decreasing, several per row, each in a
contiguous run of columns: ``segment_bt`` numbers them within the row (0 is
padding), positions restart at 0 at each one's start, and the advantage is
per token (``adv_bt``). When they do not fit in ``rows`` rows of the bucket,
the next larger bucket is tried.

Per-turn groups (``rollout.trajectory = "per_turn"``: each row of a group is one
turn of an episode, ``shared.wire``) are packed like any others, one sequence per
turn: the GRPO group is still the episodes, so advantages are computed over the
G episodes' rewards and every turn sequence gets its episode's. The loss
normalisation stays that of the episodes: ``token_mean`` divides by the tokens
trained on, which are the same tokens either way; ``constant`` is ``slots`` x the
bucket, with ``slots`` the episode rows the step stands for (the learner's
groups x G), so a per-turn batch under the ``full`` context policy has exactly
the loss and gradient of the same episodes as whole sequences.
``seq_mean_token_mean`` would average per turn, so that combination is refused by
the config (``shared.config``).

The arrays (B = ``rows``, T = the bucket), in both layouts:

- ``tokens_bt``, ``targets_bt`` int32: inputs and the tokens they predict (``pad_id``
  on padding);
- ``positions_bt`` int32: the input's position in its trajectory (unpacked: the
  column, padding included; packed: restarting at 0 per trajectory, 0 on padding);
- ``attn_bt`` int32: 1 on the columns of a trajectory, 0 on padding;
- ``segment_bt`` int32: 0 on padding, k on the k-th trajectory of the row (1, 2, ...;
  unpacked: equal to ``attn_bt``). The model attends only within a segment;
- ``mask_bt`` float32: 1 where the target is trained on (the wire's loss mask, stale
  tokens cleared); ``rollout_logp_bt`` float32: the target's rollout logprob;
- ``loss_constant_b`` float32 (B,): every entry the Dr. GRPO normaliser of the
  batch (``agg="constant"``): ``slots`` x the bucket of the longest trajectory, i.e.
  the unpacked layout's rows x T, so that a packed batch's loss is the unpacked one;
- ``adv_b`` float32 (B,) unpacked: the row's advantage; ``adv_bt`` float32 (B, T)
  packed: each column's trajectory advantage (0 on padding);
- ``old_logp_bt`` float32, with ``with_old_logp``: a copy of ``rollout_logp_bt``;
- ``ref_logp_bt`` float32, with ``ref_logprobs``: the frozen reference's logprob of the
  target, computed before the batch was packed (:func:`reference_rows`, as groups arrive:
  ``learner.training.reference``), 0 on padding.

The reference's logprobs of a trajectory do not depend on the batch it is packed in
(it attends only to itself, and its positions are its own), so they can be computed for
each group as it arrives, on rows of their own (:func:`reference_rows`: one trajectory
per row, :func:`reference_values` reads each one's back), and handed to :func:`pack` by
``(group id, trajectory index)``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from learner.training.grpo import ADV_DDOF, RUN, group_advantages
from shared.wire import STATUSES, TrajectoryGroup, WireError, check_values

log = logging.getLogger(__name__)

Runs = list[tuple[int, int, int]]  # per trajectory: (row, first column, positions)
# what the reference's forward pass reads of a batch (learner.training.step.reference_logprobs)
REFERENCE_KEYS = ("tokens_bt", "targets_bt", "positions_bt", "attn_bt", "segment_bt")
BATCH_KEYS = (
    "tokens_bt", "targets_bt", "positions_bt", "attn_bt", "segment_bt", "mask_bt",
    "rollout_logp_bt",
)  # fmt: skip


@dataclass
class Packed:
    """One step's batch (numpy, host side) and what the loop logs about it."""

    # the BATCH_KEYS (B, T), "loss_constant_b" (B,), "adv_b" (B,) unpacked or "adv_bt"
    # (B, T) packed, maybe "old_logp_bt" (B, T): see the module's docstring
    arrays: dict[str, np.ndarray]
    group_ids: list[str]  # every group consumed, dropped ones included
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return self.arrays["tokens_bt"].shape


@dataclass
class _Seq:
    """One kept trajectory's per-token values (its staleness mask applied) and advantage."""

    tokens: np.ndarray
    mask: np.ndarray  # float32
    logp: np.ndarray
    adv: float
    key: tuple[str, int] = ("", 0)  # (group id, trajectory index in the group)

    def positions(self, t: int) -> int:
        """Prediction positions it takes in a row of ``t`` columns (truncated to ``t``)."""
        return max(min(len(self.tokens) - 1, t), 0)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= ``length`` (the largest one when none is: rows are truncated)."""
    for b in buckets:
        if length <= b:
            return int(b)
    return int(buckets[-1])


def advantages(
    groups: Sequence[TrajectoryGroup],
    *,
    scale: bool = RUN.scale_rewards,
    ddof: int = ADV_DDOF[RUN.adv_std],
) -> tuple[list[np.ndarray], list[bool]]:
    """Per group: its rows' advantages (rows,) and whether it has reward variance (is kept).

    The advantages are over the group's episodes (E of them); a per-turn row gets its
    episode's (:meth:`shared.wire.TrajectoryGroup.episodes`)."""
    out, keep = [], []
    for g in groups:
        episode_of_row, _ = g.episodes
        rewards_e = np.asarray(g.episode_rewards, np.float32)
        e = len(rewards_e)
        adv_e, keep_e = group_advantages(rewards_e, max(e, 1), scale=scale, ddof=ddof)
        out.append(np.asarray(adv_e, np.float32)[episode_of_row])
        keep.append(bool(np.asarray(keep_e).all()) and e > 0)
    return out, keep


def pack(
    groups: Sequence[TrajectoryGroup],
    *,
    rows: int,
    buckets: Sequence[int],
    scale_rewards: bool = RUN.scale_rewards,
    adv_ddof: int = ADV_DDOF[RUN.adv_std],
    policy_version: int | None = None,
    max_staleness: int | None = None,
    with_old_logp: bool = False,
    pad_id: int = 0,
    packing: bool = RUN.packing,
    slots: int | None = None,
    ref_logprobs: Mapping[tuple[str, int], np.ndarray] | None = None,
) -> Packed:
    """Pack the kept groups' trajectories into ``rows`` rows of one length bucket.

    With ``policy_version`` and ``max_staleness``, tokens generated by a policy more
    than ``max_staleness`` versions old are masked out. ``with_old_logp`` adds
    ``old_logp_bt`` = the rollout logprobs (the ratio is then taken against the
    behaviour policy itself rather than the learner's recomputation). ``packing``
    puts several trajectories in a row (see the module's docstring); ``slots`` is the
    number of rows of the unpacked layout the batch stands for (default ``rows``; for
    per-turn groups, the episode rows: see the module's docstring),
    which the Dr. GRPO normaliser ``loss_constant_b`` counts: pass the unpacked row
    count when packing into fewer rows, and the loss is the unpacked one.
    ``ref_logprobs`` maps ``(group id, trajectory index)`` to that trajectory's reference
    logprobs (:func:`reference_values`) and adds ``ref_logp_bt``; a kept trajectory
    without them raises :class:`MissingReference`.
    Raises ValueError when the trajectories do not fit.
    """
    adv, keep, invalid = _kept(groups, scale_rewards, adv_ddof, warn=True)
    kept = [(g, a) for g, a, k in zip(groups, adv, keep, strict=True) if k]
    n = sum(len(g) for g, _ in kept)
    if not packing and n > rows:
        raise ValueError(f"{n} trajectories of kept groups do not fit in {rows} rows")
    longest = max((int(g.lengths.max()) for g, _ in kept if len(g)), default=2)
    t = bucket_for(max(longest - 1, 1), buckets)
    stale = [0]
    seqs = list(_sequences(kept, policy_version, max_staleness, stale))
    if packing:
        a, runs = _packed_rows(seqs, rows, t, buckets, pad_id)
    else:
        a, runs = _one_per_row(seqs, rows, t, pad_id)
    a["loss_constant_b"] = np.full(
        (rows,), float((rows if slots is None else slots) * t), np.float32
    )
    if with_old_logp:
        a["old_logp_bt"] = a["rollout_logp_bt"].copy()
    if ref_logprobs is not None:
        a["ref_logp_bt"] = _reference_bt(seqs, runs, a["tokens_bt"].shape, ref_logprobs)
    stats = _stats(groups, keep, a, stale[0])
    stats["invalid_groups"] = float(invalid)
    if policy_version is not None:
        stats.update(_policy_lag(kept, policy_version))
    return Packed(a, [g.group_id for g in groups], stats)


def _kept(
    groups: Sequence[TrajectoryGroup], scale: bool, ddof: int, warn: bool
) -> tuple[list[np.ndarray], list[bool], int]:
    """(advantages, kept or not, invalid groups): a group is kept when its rewards vary
    and its per-token values are valid (``shared.wire.check_values``)."""
    adv, keep = advantages(groups, scale=scale, ddof=ddof)
    invalid = 0
    for i, g in enumerate(groups):
        try:
            check_values(g)
        except WireError as e:
            if warn:
                log.warning("dropping group %s: %s", g.group_id, e.reason)
            keep[i] = False
            invalid += 1
    return adv, keep, invalid


def kept_trajectories(
    groups: Sequence[TrajectoryGroup],
    *,
    scale_rewards: bool = RUN.scale_rewards,
    adv_ddof: int = ADV_DDOF[RUN.adv_std],
) -> list[tuple[tuple[str, int], np.ndarray]]:
    """The trajectories :func:`pack` keeps of ``groups`` (the same rule, without its
    warnings), in its order: ``((group id, index in the group), tokens)``."""
    adv, keep, _ = _kept(groups, scale_rewards, adv_ddof, warn=False)
    kept = [(g, a) for g, a, k in zip(groups, adv, keep, strict=True) if k]
    return [(s.key, s.tokens) for s in _sequences(kept, None, None, [0])]


def reference_rows(
    items: Sequence[tuple[tuple[str, int], np.ndarray]],
    *,
    rows: int,
    buckets: Sequence[int],
    pad_id: int = 0,
) -> tuple[dict[str, np.ndarray], Runs]:
    """The inputs of the reference's forward pass for ``items`` (:func:`kept_trajectories`):
    one trajectory per row, ``rows`` rows (the rest padding) of the bucket of the longest,
    positions and truncation as :func:`pack` lays them out. (arrays, runs)."""
    if len(items) > rows:
        raise ValueError(f"{len(items)} trajectories do not fit in {rows} rows")
    longest = max((len(tok) for _, tok in items), default=2)
    t = bucket_for(max(longest - 1, 1), buckets)
    # pack's own layout; the loss columns it also fills are not the reference's and dropped
    zeros = [np.zeros(len(tok), np.float32) for _, tok in items]
    seqs = [_Seq(tok, z, z, 0.0, key) for (key, tok), z in zip(items, zeros, strict=True)]
    a, runs = _one_per_row(seqs, rows, t, pad_id)
    return {k: a[k] for k in REFERENCE_KEYS}, runs


def reference_values(
    items: Sequence[tuple[tuple[str, int], np.ndarray]], runs: Runs, ref_bt: np.ndarray
) -> dict[tuple[str, int], np.ndarray]:
    """Each item's reference logprobs read back from the (B, T) output for
    :func:`reference_rows`' arrays: what :func:`pack`'s ``ref_logprobs`` takes."""
    ref_bt = np.asarray(ref_bt, np.float32)
    return {
        key: ref_bt[row, col : col + m].copy()
        for (key, _), (row, col, m) in zip(items, runs, strict=True)
    }


class MissingReference(LookupError):
    """A kept trajectory whose reference logprobs were not given (or cover fewer positions
    than its row takes)."""


def _reference_bt(
    seqs: list[_Seq],
    runs: Runs,
    shape: tuple[int, int],
    given: Mapping[tuple[str, int], np.ndarray],
) -> np.ndarray:
    """(B, T) reference logprobs laid out as the targets: each trajectory's run of columns
    (``runs``: row, first column, positions) takes its values; padding is 0."""
    out = np.zeros(shape, np.float32)
    for s, (row, col, m) in zip(seqs, runs, strict=True):
        if m <= 0:
            continue
        values = given.get(s.key)
        if values is None or len(values) < m:
            have = "none" if values is None else f"{len(values)} positions"
            raise MissingReference(
                f"trajectory {s.key[1]} of group {s.key[0]}: the reference logprobs of "
                f"{m} positions are needed, {have} given"
            )
        out[row, col : col + m] = values[:m]
    return out


def _policy_lag(kept: list[tuple[TrajectoryGroup, np.ndarray]], version: int) -> dict[str, float]:
    """How many weight versions behind the learner the batch's generated tokens are: the
    mean and the largest over the loss tokens (0 on-policy; one step of asynchrony is 1)."""
    vers = [g.columns["versions"][g.columns["loss_mask"] > 0] for g, _ in kept]
    v = np.concatenate(vers) if vers else np.zeros(0, np.int32)
    v = v[v >= 0]
    if not v.size:
        return {"policy_lag": 0.0, "policy_lag_max": 0.0}
    lag = version - v.astype(np.int64)
    return {"policy_lag": float(lag.mean()), "policy_lag_max": float(lag.max())}


def _sequences(
    kept: list[tuple[TrajectoryGroup, np.ndarray]],
    policy_version: int | None,
    max_staleness: int | None,
    stale_count: list[int],
) -> Iterator[_Seq]:
    """The kept trajectories in order, stale tokens masked (counted in ``stale_count[0]``)."""
    for g, adv_g in kept:
        cols = g.columns
        for i, (off, length) in enumerate(zip(g.offsets[:-1], g.lengths, strict=True)):
            seq = slice(int(off), int(off) + int(length))
            tok, lm = cols["tokens"][seq], cols["loss_mask"][seq].astype(np.float32)
            lp, ver = cols["logprobs"][seq], cols["versions"][seq]
            if policy_version is not None and max_staleness is not None:
                stale = (ver >= 0) & (ver < policy_version - max_staleness) & (lm > 0)
                stale_count[0] += int(stale.sum())
                lm = np.where(stale, 0.0, lm)
            yield _Seq(tok, lm, lp, float(adv_g[i]), (g.group_id, i))


def _empty(rows: int, t: int, pad_id: int) -> dict[str, np.ndarray]:
    return {
        "tokens_bt": np.full((rows, t), pad_id, np.int32),
        "targets_bt": np.full((rows, t), pad_id, np.int32),
        "positions_bt": np.zeros((rows, t), np.int32),
        "attn_bt": np.zeros((rows, t), np.int32),
        "segment_bt": np.zeros((rows, t), np.int32),
        "mask_bt": np.zeros((rows, t), np.float32),
        "rollout_logp_bt": np.zeros((rows, t), np.float32),
    }


def _place(a: dict[str, np.ndarray], s: _Seq, row: int, col: int, m: int, segment: int) -> None:
    """Write ``s``'s first ``m`` prediction positions at columns col .. col + m - 1 of ``row``."""
    cols = slice(col, col + m)
    a["tokens_bt"][row, cols] = s.tokens[:m]
    a["targets_bt"][row, cols] = s.tokens[1 : m + 1]
    a["attn_bt"][row, cols] = 1
    a["segment_bt"][row, cols] = segment
    a["mask_bt"][row, cols] = s.mask[1 : m + 1]
    a["rollout_logp_bt"][row, cols] = s.logp[1 : m + 1]


def _one_per_row(
    seqs: list[_Seq], rows: int, t: int, pad_id: int
) -> tuple[dict[str, np.ndarray], Runs]:
    a = _empty(rows, t, pad_id)
    a["positions_bt"][:] = np.arange(t, dtype=np.int32)
    a["adv_b"] = np.zeros((rows,), np.float32)
    runs = []
    for row, s in enumerate(seqs):
        m = s.positions(t)
        if m > 0:
            _place(a, s, row, 0, m, 1)
        a["adv_b"][row] = s.adv
        runs.append((row, 0, m))
    return a, runs


def _packed_rows(
    seqs: list[_Seq], rows: int, t: int, buckets: Sequence[int], pad_id: int
) -> tuple[dict[str, np.ndarray], Runs]:
    """First-fit-decreasing into ``rows`` rows of ``t`` columns, else of a larger bucket."""
    for tb in [t, *(int(b) for b in buckets if b > t)]:
        sizes = [s.positions(tb) for s in seqs]
        where = first_fit_decreasing(sizes, rows, tb)
        if where is not None:
            break
    else:
        raise ValueError(
            f"{len(seqs)} trajectories of kept groups ({sum(sizes)} positions) do not fit "
            f"in {rows} rows of {tb} tokens, even packed"
        )
    a = _empty(rows, tb, pad_id)
    a["adv_bt"] = np.zeros((rows, tb), np.float32)
    runs = []
    for s, m, (row, col, segment) in zip(seqs, sizes, where, strict=True):
        if m > 0:
            _place(a, s, row, col, m, segment)
            a["positions_bt"][row, col : col + m] = np.arange(m, dtype=np.int32)
            a["adv_bt"][row, col : col + m] = s.adv
        runs.append((row, col, m))
    return a, runs


def first_fit_decreasing(
    sizes: Sequence[int], rows: int, t: int
) -> list[tuple[int, int, int]] | None:
    """Each item's (row, first column, segment number in the row), items taken longest
    first (ties in order) into the first row with room; None when one finds none.
    Empty items take no room (row -1, segment 0)."""
    free = np.full(rows, t, np.int64)
    count = np.zeros(rows, np.int64)
    out = [(-1, 0, 0)] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        size = sizes[i]
        if size <= 0:
            continue
        row = int(np.argmax(free >= size)) if rows else 0
        if not rows or free[row] < size:
            return None
        count[row] += 1
        out[i] = (row, int(t - free[row]), int(count[row]))
        free[row] -= size
    return out


def _stats(
    groups: Sequence[TrajectoryGroup], keep: list[bool], a: dict[str, np.ndarray], stale: int
) -> dict[str, float]:
    rewards = np.concatenate(
        [np.asarray(g.episode_rewards, np.float64) for g in groups] or [np.zeros(0)]
    )  # per episode, however many sequences each has
    lengths = np.concatenate([g.lengths for g in groups] or [np.zeros(0)])
    attn = a["attn_bt"]
    return (
        _process_parts(groups)
        | _episode_stats(groups)
        | {
            "reward": float(rewards.mean()) if rewards.size else 0.0,
            "success": float((rewards >= 1.0).mean()) if rewards.size else 0.0,  # as rollout.eval
            "groups": float(len(groups)),
            "groups_kept": float(sum(keep)),
            "trajectories": float(rewards.size),  # episodes
            "sequences": float(lengths.size),  # training sequences: episodes, or their turns
            "mean_length": float(lengths.mean()) if lengths.size else 0.0,
            "loss_tokens": float(a["mask_bt"].sum()),
            "stale_tokens": float(stale),
            "bucket": float(a["tokens_bt"].shape[1]),
            # real prediction positions over the batch's cells: what packing raises
            "packing_efficiency": float(attn.sum()) / max(attn.size, 1),
            "rows_used": float((attn.sum(axis=1) > 0).sum()),
        }
    )


ENDINGS = {"ok": "ended_answered", "truncated": "ended_budget", "infra_error": "ended_error"}


def _episode_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """Per-episode figures of a batch, whatever its rows are (whole episodes or their
    turns): actions per episode (mean and longest), training sequences per episode, and
    where episodes ended, as fractions: answered (status ``ok``), at the step or context
    budget (``truncated``) or on an infrastructure error."""
    steps = [g.ints[g.episodes[1], 2] for g in groups]
    codes = [g.ints[g.episodes[1], 3] for g in groups]
    n_steps = np.concatenate(steps or [np.zeros(0, np.int64)])
    n_codes = np.concatenate(codes or [np.zeros(0, np.int64)])
    episodes = int(n_steps.size)
    if not episodes:
        return {}
    out = {
        "episode_actions": float(n_steps.mean()),
        "episode_actions_max": float(n_steps.max()),
        "turns_per_episode": float(sum(len(g) for g in groups)) / episodes,
    }
    for code, status in enumerate(STATUSES):
        out[ENDINGS[status]] = float((n_codes == code).mean())
    return out


PROCESS_PARTS = {"outcome": "reward_outcome", "process": "reward_process",
                 "process_term": "reward_process_term"}  # fmt: skip


def _process_parts(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """Per-episode means of the process reward's parts (``rollout.verifiers.process``), over
    the groups that carry them: the outcome, r_process and the term added to the outcome;
    none when the process reward is off."""
    out = {}
    for part, metric in PROCESS_PARTS.items():
        values = [
            g.floats[g.episodes[1], 1 + g.part_names.index(part)]
            for g in groups
            if part in g.part_names
        ]
        if values:
            out[metric] = float(np.concatenate(values).mean()) if sum(map(len, values)) else 0.0
    return out
