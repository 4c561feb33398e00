"""Trajectories on the wire: the msgpack format the rollout sidecar serves to the learner.

A message is one msgpack document, an array of two ``bin`` items::

    [ header: bin(msgpack map), data: bin(raw little-endian array bytes) ]

The header holds the schema version, ids and names; every number lives in a
typed array in the data blob, described in the header by ``{"dtype", "shape",
"offset"}``. Any msgpack library can read the document; this module decodes it
without copying array bytes (``np.frombuffer`` on the received buffer) and
checks every declared size against :class:`WireLimits` *before* touching or
allocating anything, so a hostile or corrupt message costs microseconds and
raises :class:`WireError`, never anything else.

Decoding checks structure (sizes, dtypes, shapes, offsets, ids, names, the
per-trajectory ints and floats), not the per-token *values*: whether every
loss-mask byte is 0/1 and every logprob finite is :func:`check_values`, which the
consumer calls where it reads the values anyway (the learner's batch packer
drops a group that fails it). Building a :class:`Trajectory` checks them too,
so an honest sender never produces such a group.

A :class:`TrajectoryGroup` is stored column-wise, as it travels: each per-token
array of its G trajectories lies back to back (a ragged batch: trajectory i
spans ``offsets[i]:offsets[i+1]``), and its per-trajectory numbers are two small
blocks, ``ints`` (G, 4) and ``floats`` (G, 1 + parts + timings). That is also
the form the learner packs into padded buckets. :class:`Trajectory` is one
training sequence as the rollout side builds it; a group's ``trajectories`` are views.

Schema version 2 adds ``turns`` (G,) int32: -1 for a sequence that is a whole
episode (``rollout.trajectory = "sequence"``), k >= 0 for the sequence of an
episode's turn k (``"per_turn"``: the turn's prompt, mask 0, then its generated
tokens, mask 1). An episode is its ``sample_index``: the rows of one episode are
contiguous, numbered 0, 1, ... and share its reward, parts, status and steps; the
GRPO group is still the episodes (:meth:`TrajectoryGroup.episodes`). Version 1
messages (no ``turns``) still decode, every row a whole episode.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import msgpack
import numpy as np

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no "turns" array (every row a whole episode)

Status = Literal["ok", "truncated", "infra_error"]
STATUSES: tuple[str, ...] = ("ok", "truncated", "infra_error")

# The per-token arrays of a trajectory and the dtype each travels as.
ARRAY_DTYPES: dict[str, np.dtype] = {
    "tokens": np.dtype("<i4"),  # (T,) token ids
    "loss_mask": np.dtype("|u1"),  # (T,) 1 on model-generated tokens, else 0
    "logprobs": np.dtype("<f4"),  # (T,) rollout logprob of generated tokens, 0 elsewhere
    "versions": np.dtype("<i4"),  # (T,) policy version that generated the token, -1 elsewhere
}
INTS_DTYPE = np.dtype("<i4")  # (G, 4) block: length, sample_index, num_steps, status code
FLOATS_DTYPE = np.dtype("<f8")  # (G, 1 + P + K) block: reward, reward parts, timings
TURNS_DTYPE = np.dtype("<i4")  # (G,) -1: a whole episode; k >= 0: turn k of an episode
_INT_COLS = ("length", "sample_index", "num_steps", "status")

_ALIGN = 8  # array payloads start on 8-byte boundaries of the message buffer
_BIN32 = 0xC6
_FIXARRAY2 = 0x92
_PREFIX = struct.Struct(">BBI")  # fixarray(2), bin32 marker, header length
_BIN32_HEAD = struct.Struct(">BI")


class WireError(ValueError):
    """A message or trajectory that cannot be encoded or decoded; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class WireLimits:
    """Bounds enforced on decode, before anything is allocated."""

    max_total_bytes: int = 1 << 30  # whole message
    max_header_bytes: int = 16 << 20  # the msgpack header (ids, names, descriptors)
    max_array_elements: int = 1 << 24  # elements in one array (16 Mi tokens)
    max_str_len: int = 4096  # any string (ids, reward part and timing names)
    max_list_len: int = 4096  # groups per batch, trajectories per group
    max_names: int = 64  # reward parts, timings
    allowed_dtypes: frozenset[str] = frozenset(
        d.str for d in (*ARRAY_DTYPES.values(), INTS_DTYPE, FLOATS_DTYPE, TURNS_DTYPE)
    )


DEFAULT_LIMITS = WireLimits()


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True, eq=False)
class Trajectory:
    """One training sequence: a whole episode (``turn`` -1: prompt, then actions, mask 1,
    and observations, mask 0) or one turn of it (``turn`` k: its prompt, mask 0, then
    the tokens generated in that turn, mask 1)."""

    task_id: str
    group_id: str
    sample_index: int
    tokens: np.ndarray  # (T,) int32
    loss_mask: np.ndarray  # (T,) uint8
    logprobs: np.ndarray  # (T,) float32
    versions: np.ndarray  # (T,) int32
    reward: float
    reward_parts: dict[str, float] = field(default_factory=dict)
    status: Status = "ok"
    num_steps: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    turn: int = -1

    def __post_init__(self) -> None:
        where = f"trajectory {self.group_id!r}/{self.sample_index!r}"
        with np.errstate(invalid="ignore"):
            _check_columns({n: getattr(self, n) for n in ARRAY_DTYPES}, where)
        _check_scalars(self, where)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _SCALAR_FIELDS) and all(
            np.array_equal(getattr(self, k), getattr(other, k)) for k in ARRAY_DTYPES
        )


_SCALAR_FIELDS = ("task_id", "group_id", "sample_index", "reward", "reward_parts", "status")
_SCALAR_FIELDS += ("num_steps", "timings", "turn")


def _check_scalars(t: Trajectory, where: str) -> None:
    for name in ("task_id", "group_id"):
        if type(getattr(t, name)) is not str:
            raise WireError(f"{where}: {name} must be a str")
    if t.status not in STATUSES:
        raise WireError(f"{where}: status {t.status!r} is not one of {STATUSES}")
    for name in ("sample_index", "num_steps"):
        v = getattr(t, name)
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or not 0 <= v < 2**31:
            raise WireError(f"{where}: {name} must be an int in [0, 2**31), got {v!r}")
    if not isinstance(t.turn, int | np.integer) or isinstance(t.turn, bool) or t.turn < -1:
        raise WireError(f"{where}: turn must be -1 or an int >= 0, got {t.turn!r}")
    if not _finite_number(t.reward):
        raise WireError(f"{where}: reward must be a finite number, got {t.reward!r}")
    for name in ("reward_parts", "timings"):
        m = getattr(t, name)
        if not isinstance(m, dict) or not all(
            type(k) is str and _finite_number(v) for k, v in m.items()
        ):
            raise WireError(f"{where}: {name} must map str to finite numbers")


def _finite_number(x: Any) -> bool:
    return isinstance(x, int | float | np.number) and not isinstance(x, bool) and math.isfinite(x)


class TrajectoryGroup:
    """G samples of one task, the unit GRPO normalises rewards over, stored column-wise.

    ``columns[name]``: (N,) concatenation of that per-token array over the G
    trajectories, N = sum of lengths. ``ints``: (G, 4) int32 of length,
    sample_index, num_steps and status code. ``floats``: (G, 1 + P + K) float64
    of reward, the P ``part_names`` and the K ``timing_names``. Every trajectory
    of a group carries the same reward part and timing names.
    """

    def __init__(self, group_id: str, task_id: str, trajectories: Iterable[Trajectory]):
        trajs = tuple(trajectories)
        where = f"group {group_id!r}"
        if type(group_id) is not str or type(task_id) is not str:
            raise WireError(f"{where}: group_id and task_id must be str")
        for t in trajs:
            if not isinstance(t, Trajectory):
                raise WireError(f"{where}: item is {type(t).__name__}, not Trajectory")
            if t.group_id != group_id or t.task_id != task_id:
                raise WireError(
                    f"{where} (task {task_id!r}) holds a trajectory of "
                    f"group {t.group_id!r} (task {t.task_id!r})"
                )
        parts = tuple(trajs[0].reward_parts) if trajs else ()
        timings = tuple(trajs[0].timings) if trajs else ()
        for t in trajs:
            if tuple(t.reward_parts) != parts or tuple(t.timings) != timings:
                raise WireError(
                    f"{where}: trajectories differ in reward part or timing names "
                    f"({list(t.reward_parts)} / {list(t.timings)} vs {list(parts)} / {list(timings)})"
                )
        ints = np.array(
            [[t.length, t.sample_index, t.num_steps, STATUSES.index(t.status)] for t in trajs],
            dtype=INTS_DTYPE,
        ).reshape(len(trajs), 4)
        floats = np.array(
            [[t.reward, *t.reward_parts.values(), *t.timings.values()] for t in trajs],
            dtype=FLOATS_DTYPE,
        ).reshape(len(trajs), 1 + len(parts) + len(timings))
        columns = {
            n: np.concatenate([getattr(t, n) for t in trajs]) if trajs else np.zeros(0, dt)
            for n, dt in ARRAY_DTYPES.items()
        }
        turns = np.array([t.turn for t in trajs], dtype=TURNS_DTYPE)
        _check_episodes(ints, floats, turns, where)
        self._set(group_id, task_id, columns, ints, floats, parts, timings, turns)

    def _set(
        self, group_id, task_id, columns, ints, floats, part_names, timing_names, turns
    ) -> None:
        self.group_id: str = group_id
        self.task_id: str = task_id
        self.columns: dict[str, np.ndarray] = columns
        self.ints: np.ndarray = ints
        self.floats: np.ndarray = floats
        self.part_names: tuple[str, ...] = part_names
        self.timing_names: tuple[str, ...] = timing_names
        self.turns: np.ndarray = turns  # (G,) -1: a whole episode; k: turn k of one

    @classmethod
    def _from_checked(cls, *fields: Any) -> TrajectoryGroup:
        obj = object.__new__(cls)
        obj._set(*fields)
        return obj

    def __len__(self) -> int:
        return self.ints.shape[0]

    @property
    def lengths(self) -> np.ndarray:
        return self.ints[:, 0]  # (G,)

    @cached_property
    def offsets(self) -> np.ndarray:
        """(G+1,) int64: trajectory i spans ``offsets[i]:offsets[i+1]`` of every column."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    @property
    def rewards(self) -> np.ndarray:
        return self.floats[:, 0]  # (G,)

    @cached_property
    def episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(episode_of_row (G,) int64, first_row (E,) int64): the episode (0 .. E-1) each
        row belongs to, and each episode's first row (whose reward is the episode's).
        A whole-episode row is its own episode; per-turn rows of one episode share one."""
        new = (self.turns <= 0) if len(self) else np.zeros(0, bool)
        first = np.flatnonzero(new)
        return np.cumsum(new) - 1, first

    @property
    def num_episodes(self) -> int:
        return int(self.episodes[1].shape[0])

    @property
    def episode_rewards(self) -> np.ndarray:
        return self.rewards[self.episodes[1]]  # (E,)

    @property
    def statuses(self) -> tuple[str, ...]:
        return tuple(STATUSES[c] for c in self.ints[:, 3].tolist())

    @cached_property
    def trajectories(self) -> tuple[Trajectory, ...]:
        """Per-trajectory records; their arrays are views of the columns (no copy)."""
        out = []
        p = len(self.part_names)
        for i, (ints, floats) in enumerate(
            zip(self.ints.tolist(), self.floats.tolist(), strict=True)
        ):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            t = object.__new__(Trajectory)
            t.__dict__.update(
                {n: col[a:b] for n, col in self.columns.items()},
                task_id=self.task_id,
                group_id=self.group_id,
                sample_index=ints[1],
                num_steps=ints[2],
                status=STATUSES[ints[3]],
                reward=floats[0],
                reward_parts=dict(zip(self.part_names, floats[1 : 1 + p], strict=True)),
                timings=dict(zip(self.timing_names, floats[1 + p :], strict=True)),
                turn=int(self.turns[i]),
            )
            out.append(t)
        return tuple(out)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrajectoryGroup):
            return NotImplemented
        return (
            self.group_id == other.group_id
            and self.task_id == other.task_id
            and self.trajectories == other.trajectories
        )

    def __repr__(self) -> str:
        return (
            f"TrajectoryGroup(group_id={self.group_id!r}, task_id={self.task_id!r}, "
            f"G={len(self)}, episodes={self.num_episodes}, tokens={int(self.lengths.sum())})"
        )


def _check_episodes(ints: np.ndarray, floats: np.ndarray, turns: np.ndarray, where: str) -> None:
    """Per-turn rows: each episode's turns contiguous and numbered 0, 1, ..., sharing its
    sample index, steps, status, reward, parts and timings."""
    if not turns.shape[0] or turns.max() <= 0:
        if turns.shape[0] and turns.min() < -1:
            raise WireError(f"{where}: turns must be -1 or >= 0")
        return
    if turns.min() < -1:
        raise WireError(f"{where}: turns must be -1 or >= 0")
    cont = turns[1:] > 0  # rows that continue the previous row's episode
    if turns[0] > 0 or (turns[1:][cont] != turns[:-1][cont] + 1).any():
        raise WireError(f"{where}: an episode's turns must be contiguous rows numbered 0, 1, ...")
    if (ints[1:, 1:][cont] != ints[:-1, 1:][cont]).any() or (
        floats[1:][cont] != floats[:-1][cont]
    ).any():
        raise WireError(
            f"{where}: the turns of an episode differ in sample index, steps, status or reward"
        )


def _check_columns(cols: Mapping[str, Any], where: str) -> None:
    """Dtype, rank, equal lengths, 0/1 mask and finite logprobs of the per-token arrays."""
    n = None
    for name, dtype in ARRAY_DTYPES.items():
        arr = cols[name]
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != dtype:
            got = f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr)
            raise WireError(f"{where}: {name} must be a 1-D {dtype} array, got {got}")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise WireError(f"{where}: {name} has length {arr.shape[0]}, tokens {n}")
    if n:
        _check_values(cols["loss_mask"], cols["logprobs"], where)


def check_values(group: TrajectoryGroup) -> None:
    """Raise :class:`WireError` unless the group's loss mask is 0/1 and its logprobs finite."""
    cols = group.columns
    if cols["loss_mask"].shape[0]:
        with np.errstate(invalid="ignore"):
            _check_values(cols["loss_mask"], cols["logprobs"], f"group {group.group_id!r}")


def _check_values(loss_mask: np.ndarray, logprobs: np.ndarray, where: str) -> None:
    if loss_mask.max() > 1:
        raise WireError(f"{where}: loss_mask holds values other than 0 and 1")
    if not _all_finite(logprobs):
        raise WireError(f"{where}: logprobs are not all finite")


def _all_finite(x: np.ndarray) -> bool:
    """True when no element is NaN or infinite, in one BLAS pass.

    x . 0 is exactly 0 when every element is finite and NaN otherwise (0 * inf is NaN),
    and unlike x . x it cannot overflow on large finite values. Callers hold
    ``np.errstate(invalid="ignore")`` so bad input raises no RuntimeWarning.
    """
    x = x.reshape(-1)
    return math.isfinite(np.dot(x, _zeros(x.shape[0], x.dtype)))


_ZEROS: dict[np.dtype, np.ndarray] = {}


def _zeros(n: int, dtype: np.dtype) -> np.ndarray:
    buf = _ZEROS.get(dtype)
    if buf is None or buf.shape[0] < n:
        buf = _ZEROS[dtype] = np.zeros(
            max(n, 1024, 2 * (0 if buf is None else buf.shape[0])), dtype
        )
        buf.flags.writeable = False
    return buf[:n]


# ----------------------------------------------------------------------------- encode


def encode_groups(groups: Sequence[TrajectoryGroup]) -> bytes:
    """Encode a batch of groups as one message (what ``GET /batch`` returns)."""
    pieces: list[Any] = []  # the data blob: arrays and alignment gaps, in order
    offset = 0
    header_groups = []
    for g in groups:
        if not isinstance(g, TrajectoryGroup):
            raise WireError(f"expected TrajectoryGroup, got {type(g).__name__}")
        arrays = {}
        named = (*g.columns.items(), ("ints", g.ints), ("floats", g.floats), ("turns", g.turns))
        for name, arr in named:
            gap = -offset % _ALIGN
            if gap:
                pieces.append(_GAPS[gap])
                offset += gap
            arrays[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset}
            # bytes.join reads a C-contiguous array through the buffer protocol: one copy.
            pieces.append(arr if arr.data.c_contiguous else np.ascontiguousarray(arr))
            offset += arr.nbytes
        header_groups.append(
            {
                "group_id": g.group_id,
                "task_id": g.task_id,
                "part_names": list(g.part_names),
                "timing_names": list(g.timing_names),
                "arrays": arrays,
            }
        )
    # "pad" is packed last as bin8 b"": growing it by p bytes grows the header by p, which
    # puts the data blob on an aligned offset of the message without packing twice.
    hbytes = msgpack.packb({"v": SCHEMA_VERSION, "groups": header_groups, "pad": b""})
    pad = -(_PREFIX.size + len(hbytes) + _BIN32_HEAD.size) % _ALIGN
    if pad:
        hbytes = hbytes[:-1] + bytes([pad]) + bytes(pad)
    if len(hbytes) > 0xFFFFFFFF or offset > 0xFFFFFFFF:
        raise WireError("message exceeds the 4 GiB bin32 limit")

    head = [_PREFIX.pack(_FIXARRAY2, _BIN32, len(hbytes)), hbytes, _BIN32_HEAD.pack(_BIN32, offset)]
    return b"".join(head + pieces)


_GAPS = [bytes(n) for n in range(_ALIGN)]


def encode_group(group: TrajectoryGroup) -> bytes:
    return encode_groups([group])


# ----------------------------------------------------------------------------- decode


def decode_groups(
    buf: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS
) -> list[TrajectoryGroup]:
    """Decode a message into groups; arrays are read-only views of ``buf`` (no copy)."""
    try:
        return _decode(buf, limits)
    except WireError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, AttributeError) as e:
        # Defence in depth: every malformed input should already have hit an explicit check.
        raise WireError(f"malformed message: {type(e).__name__}: {e}") from None


def decode_group(
    buf: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS
) -> TrajectoryGroup:
    groups = decode_groups(buf, limits)
    if len(groups) != 1:
        raise WireError(f"expected exactly one group, message holds {len(groups)}")
    return groups[0]


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _decode(buf: Any, limits: WireLimits) -> list[TrajectoryGroup]:
    if not isinstance(buf, bytes | bytearray | memoryview):
        raise WireError(f"expected bytes, got {type(buf).__name__}")
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    total = mv.nbytes
    if total > limits.max_total_bytes:
        raise WireError(f"message is {total} bytes, limit {limits.max_total_bytes}")
    if total < 1 or mv[0] != _FIXARRAY2:
        raise WireError("not a trajectory message (bad frame prefix: expected a 2-item array)")
    hstart, hlen = _bin_item(mv, 1, "header")
    if hlen > limits.max_header_bytes:
        raise WireError(f"header declares {hlen} bytes, limit {limits.max_header_bytes}")
    dpos = hstart + hlen
    if dpos > total:
        raise WireError(f"truncated: header declares {hlen} bytes, message has {total}")
    data_start, dlen = _bin_item(mv, dpos, "data")
    if data_start + dlen != total:
        raise WireError(
            f"truncated or padded: data declares {dlen} bytes, {total - data_start} present"
        )
    try:
        header = msgpack.unpackb(
            mv[hstart:dpos],
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=_ALIGN,
            max_array_len=limits.max_list_len,
            max_map_len=16,
            max_ext_len=0,
        )
    except WireError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise WireError(f"header is not valid msgpack: {type(e).__name__}: {e}") from None
    if type(header) is not dict:
        raise WireError("header is not a map")
    version = header.get("v")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise WireError(
            f"schema version {version!r} is not supported (expected one of {READABLE_VERSIONS})"
        )
    _expect_keys(header, _HEADER_KEYS, "header")
    groups = _expect_type(header["groups"], list, "groups")
    reader = _ArrayReader(mv, data_start, dlen, limits)
    keys = _ARRAY_KEYS if version >= 2 else _ARRAY_KEYS_V1
    return [_decode_group(g, reader, keys) for g in groups]


_BIN_SIZES = {0xC4: struct.Struct(">B"), 0xC5: struct.Struct(">H"), 0xC6: struct.Struct(">I")}


def _bin_item(mv: memoryview, pos: int, what: str) -> tuple[int, int]:
    """(start, length) of the msgpack bin item at ``pos`` (bin 8, 16 or 32: any writer's)."""
    size = _BIN_SIZES.get(mv[pos]) if pos < mv.nbytes else None
    if size is None:
        raise WireError(f"bad frame: the {what} is not a msgpack bin item at byte {pos}")
    if pos + 1 + size.size > mv.nbytes:
        raise WireError(f"truncated: the {what}'s length is cut off at byte {pos}")
    return pos + 1 + size.size, size.unpack_from(mv, pos + 1)[0]


class _ArrayReader:
    """Turns array descriptors into zero-copy views of the message, checking sizes first."""

    def __init__(self, mv: memoryview, start: int, length: int, limits: WireLimits):
        self.mv, self.start, self.length, self.limits = mv, start, length, limits

    def read(
        self, desc: Any, where: str, name: str, expected: np.dtype, shape: list[int], count: int
    ) -> np.ndarray:
        """A view of ``shape`` (known from elsewhere in the header) if ``desc`` agrees."""
        if type(desc) is dict and desc.keys() == _DESC_KEYS:
            off = desc["offset"]
            if (
                desc["dtype"] == _DTYPE_STR[expected]
                and desc["shape"] == shape
                and count <= self.limits.max_array_elements
                and type(off) is int
                and off >= 0
                and off % _ALIGN == 0
                and off + count * expected.itemsize <= self.length
            ):
                arr = np.frombuffer(self.mv, dtype=expected, count=count, offset=self.start + off)
                return arr.reshape(shape) if len(shape) > 1 else arr
        raise WireError(self._diagnose(desc, f"{where}.{name}", expected, shape))

    def _diagnose(self, desc: Any, name: str, expected: np.dtype, shape: list[int]) -> str:
        desc = _expect_type(desc, dict, name)
        _expect_keys(desc, _DESC_KEYS, name)
        dt, got, offset = desc["dtype"], desc["shape"], desc["offset"]
        if type(dt) is not str or dt not in self.limits.allowed_dtypes:
            return f"{name}: dtype {dt!r} is not allowed ({sorted(self.limits.allowed_dtypes)})"
        if dt != expected.str:
            return f"{name}: dtype {dt!r}, expected {expected.str!r}"
        if got != shape:
            return f"{name}: shape {got!r}, the header implies {shape}"
        count = math.prod(shape)
        if count > self.limits.max_array_elements:
            return f"{name}: declares {count} elements, limit {self.limits.max_array_elements}"
        if type(offset) is not int or offset < 0 or offset % _ALIGN:
            return f"{name}: offset {offset!r} is not an aligned non-negative int"
        end = offset + count * expected.itemsize
        return f"{name}: bytes {offset}..{end} lie outside the {self.length}-byte data"


def _decode_group(g: Any, reader: _ArrayReader, array_keys: frozenset[str]) -> TrajectoryGroup:
    limits = reader.limits
    if not (type(g) is dict and g.keys() == _GROUP_KEYS):
        _expect_keys(_expect_type(g, dict, "group"), _GROUP_KEYS, "group")
    gid, tid, parts, timings, arrays = _group_fields(g)
    if not (
        type(gid) is str
        and type(tid) is str
        and _is_names(parts, limits)
        and _is_names(timings, limits)
        and type(arrays) is dict
        and arrays.keys() == array_keys
    ):
        raise WireError(_diagnose_group(g, limits, array_keys))
    where = f"group {gid!r}"
    # The shape of ints says G; take it from the descriptor, then check it like any other.
    ints_desc = arrays["ints"]
    shape = ints_desc.get("shape") if type(ints_desc) is dict else None
    G = shape[0] if type(shape) is list and shape else None
    if type(G) is not int or not 0 <= G <= limits.max_list_len:
        raise WireError(f"{where}.ints: shape must be [G, 4] with G <= {limits.max_list_len}")
    ints = reader.read(ints_desc, where, "ints", INTS_DTYPE, [G, 4], G * 4)
    K = 1 + len(parts) + len(timings)
    floats = reader.read(arrays["floats"], where, "floats", FLOATS_DTYPE, [G, K], G * K)
    total = 0
    for length, sample_index, num_steps, status in ints.tolist():
        if not (
            length >= 0 and sample_index >= 0 and num_steps >= 0 and 0 <= status < len(STATUSES)
        ):
            raise WireError(f"{where}: {_diagnose_ints(ints)}")
        total += length
    if G and not np.isfinite(floats).all():
        raise WireError(f"{where}: rewards, reward parts and timings must be finite")
    shape = [total]
    read = reader.read
    cols = {n: read(arrays[n], where, n, dt, shape, total) for n, dt in ARRAY_DTYPES.items()}
    if "turns" in array_keys:
        turns = read(arrays["turns"], where, "turns", TURNS_DTYPE, [G], G)
        _check_episodes(ints, floats, turns, where)
    else:  # version 1: every row a whole episode
        turns = np.full(G, -1, TURNS_DTYPE)
    return TrajectoryGroup._from_checked(
        gid, tid, cols, ints, floats, tuple(parts), tuple(timings), turns
    )


def _is_names(x: Any, limits: WireLimits) -> bool:
    return (
        type(x) is list
        and len(x) <= limits.max_names
        and set(map(type, x)) <= _STR_TYPE
        and len(set(x)) == len(x)
    )


_STR_TYPE = {str}


def _diagnose_group(g: dict, limits: WireLimits, array_keys: frozenset[str]) -> str:
    for key in ("group_id", "task_id"):
        _expect_type(g[key], str, key)
    where = f"group {g['group_id']!r}"
    for key in ("part_names", "timing_names"):
        if not _is_names(g[key], limits):
            return f"{where}.{key}: must be a list of at most {limits.max_names} distinct strings"
    arrays = _expect_type(g["arrays"], dict, f"{where}.arrays")
    _expect_keys(arrays, array_keys, f"{where}.arrays")
    return f"{where}: malformed"  # pragma: no cover - one of the checks above fires


def _diagnose_ints(ints: np.ndarray) -> str:
    for j, name in enumerate(_INT_COLS):
        if ints[:, j].min() < 0:
            return f"negative {name} {int(ints[:, j].min())}"
    return f"status code {int(ints[:, 3].max())} is not one of 0..{len(STATUSES) - 1}"


_DTYPE_STR = {d: d.str for d in (*ARRAY_DTYPES.values(), INTS_DTYPE, FLOATS_DTYPE, TURNS_DTYPE)}
_HEADER_KEYS = frozenset({"v", "groups", "pad"})
_DESC_KEYS = frozenset({"dtype", "shape", "offset"})
_ARRAY_KEYS_V1 = frozenset({*ARRAY_DTYPES, "ints", "floats"})
_ARRAY_KEYS = _ARRAY_KEYS_V1 | {"turns"}
_GROUP_FIELDS = ("group_id", "task_id", "part_names", "timing_names", "arrays")
_GROUP_KEYS = frozenset(_GROUP_FIELDS)
_group_fields = operator.itemgetter(*_GROUP_FIELDS)


def _expect_type(x: Any, typ: type, name: str) -> Any:
    if not isinstance(x, typ):
        raise WireError(f"{name}: expected {typ.__name__}, got {type(x).__name__}")
    return x


def _expect_keys(m: Mapping, keys: frozenset[str], name: str) -> None:
    if m.keys() != keys:
        missing = sorted(keys - set(m))
        extra = sorted(map(repr, set(m) - keys))
        raise WireError(f"{name}: missing fields {missing}, unknown fields {extra}")
