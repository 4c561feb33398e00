"""The wire schema: round trips, zero-copy decoding, limits, and hostile input."""

import random
import struct
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.wire import (
    SCHEMA_VERSION,
    STATUSES,
    Trajectory,
    TrajectoryGroup,
    WireError,
    WireLimits,
    check_values,
    decode_group,
    decode_groups,
    encode_group,
    encode_groups,
)

pytestmark = pytest.mark.filterwarnings("error")  # hostile input must not even warn


def make_traj(i=0, T=16, gid="g", tid="t", **over):
    rng = np.random.default_rng(i)
    mask = (rng.random(T) < 0.5).astype(np.uint8)
    fields = dict(
        task_id=tid,
        group_id=gid,
        sample_index=i,
        tokens=rng.integers(0, 1000, T, dtype=np.int32),
        loss_mask=mask,
        logprobs=np.where(mask, -rng.random(T), 0).astype(np.float32),
        versions=np.where(mask, 3, -1).astype(np.int32),
        reward=float(i % 2),
        reward_parts={"correct": float(i % 2), "format": 0.1},
        status="ok",
        num_steps=4,
        timings={"wall_s": 1.5},
    )
    fields.update(over)
    return Trajectory(**fields)


def make_group(G=4, T=16, gid="g", tid="t"):
    return TrajectoryGroup(gid, tid, [make_traj(i, T + i, gid, tid) for i in range(G)])


def split(msg: bytes):
    """(header dict, data bytes) of a message, through plain msgpack."""
    hbytes, data = msgpack.unpackb(msg)
    return msgpack.unpackb(hbytes), data


def join(header, data: bytes) -> bytes:
    return msgpack.packb([msgpack.packb(header), data])


# ----------------------------------------------------------------------------- round trips

names = st.text(st.characters(codec="utf-8"), max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def groups(draw):
    G = draw(st.integers(0, 5))
    gid, tid = draw(names), draw(names)
    parts = draw(st.lists(names, max_size=3, unique=True))
    timings = draw(st.lists(names, max_size=3, unique=True))
    trajs = []
    for _ in range(G):
        T = draw(st.integers(0, 40))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        trajs.append(
            Trajectory(
                task_id=tid,
                group_id=gid,
                sample_index=draw(st.integers(0, 2**31 - 1)),
                tokens=rng.integers(-(2**31), 2**31, T, dtype=np.int32),
                loss_mask=rng.integers(0, 2, T, dtype=np.uint8),
                logprobs=(rng.standard_normal(T) * 10).astype(np.float32),
                versions=rng.integers(-1, 1000, T, dtype=np.int32),
                reward=draw(finite),
                reward_parts={k: draw(finite) for k in parts},
                status=draw(st.sampled_from(STATUSES)),
                num_steps=draw(st.integers(0, 2**31 - 1)),
                timings={k: draw(finite) for k in timings},
            )
        )
    return TrajectoryGroup(gid, tid, trajs)


@settings(max_examples=300)
@given(st.lists(groups(), max_size=4))
def test_round_trip_property(batch):
    msg = encode_groups(batch)
    out = decode_groups(msg)
    assert len(out) == len(batch)
    for a, b in zip(batch, out, strict=True):
        assert a == b
        assert a.part_names == b.part_names and a.timing_names == b.timing_names
        for t in b.trajectories:  # values come back with their Python types
            assert type(t.sample_index) is int and type(t.reward) is float
    assert encode_groups(out) == msg  # re-encoding is byte-identical


def test_decode_is_zero_copy_and_aligned():
    msg = encode_group(make_group(G=3, T=100))
    out = decode_group(msg)
    buf = np.frombuffer(msg, dtype=np.uint8)
    for name, col in out.columns.items():
        assert np.shares_memory(col, buf), name
        assert col.flags.aligned and not col.flags.writeable
    t = out.trajectories[1]
    assert np.shares_memory(t.tokens, buf)
    assert t == make_group(G=3, T=100).trajectories[1]


def test_any_msgpack_reader_can_read_the_document():
    msg = encode_group(make_group())
    header, data = split(msg)
    assert header["v"] == SCHEMA_VERSION
    assert header["groups"][0]["group_id"] == "g"
    assert isinstance(data, bytes)


def test_group_views_offsets_and_rewards():
    g = make_group(G=3, T=5)
    assert list(g.lengths) == [5, 6, 7]
    assert list(g.offsets) == [0, 5, 11, 18]
    assert g.columns["tokens"].shape == (18,)
    assert list(g.rewards) == [0.0, 1.0, 0.0]
    assert g.statuses == ("ok", "ok", "ok")
    assert len(g) == 3 and "G=3" in repr(g)


def test_bytearray_and_memoryview_inputs():
    msg = encode_group(make_group())
    assert decode_group(bytearray(msg)) == decode_group(memoryview(msg)) == decode_group(msg)


def test_empty_batch_and_empty_group():
    assert decode_groups(encode_groups([])) == []
    empty = TrajectoryGroup("g", "t", [])
    assert decode_group(encode_group(empty)) == empty


# ----------------------------------------------------------------------------- building records


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"tokens": np.zeros(3, np.int64)}, "tokens must be a 1-D int32 array"),
        ({"tokens": [1, 2, 3]}, "tokens must be a 1-D int32 array"),
        ({"loss_mask": np.zeros(5, np.uint8)}, "loss_mask has length 5, tokens 16"),
        ({"loss_mask": np.full(16, 2, np.uint8)}, "loss_mask holds values other than 0 and 1"),
        ({"logprobs": np.full(16, np.nan, np.float32)}, "logprobs are not all finite"),
        ({"logprobs": np.full(16, -np.inf, np.float32)}, "logprobs are not all finite"),
        ({"status": "crashed"}, "status 'crashed' is not one of"),
        ({"reward": float("nan")}, "reward must be a finite number"),
        ({"reward": "1"}, "reward must be a finite number"),
        ({"sample_index": -1}, "sample_index must be an int in [0, 2**31)"),
        ({"num_steps": 2**31}, "num_steps must be an int in [0, 2**31)"),
        ({"reward_parts": {"a": float("inf")}}, "reward_parts must map str to finite numbers"),
        ({"timings": {1: 1.0}}, "timings must map str to finite numbers"),
        ({"task_id": 7}, "task_id must be a str"),
    ],
)
def test_bad_trajectories_are_refused(over, message):
    with pytest.raises(WireError) as e:
        make_traj(**over)
    assert message in str(e.value)


def test_huge_but_finite_logprobs_are_accepted():
    # The fast finiteness test overflows here; the exact fallback must accept them.
    t = make_traj(logprobs=np.full(16, -3e38, np.float32))
    assert decode_group(encode_group(TrajectoryGroup("g", "t", [t]))).trajectories[0] == t


def test_group_membership_and_names_are_checked():
    with pytest.raises(WireError, match="holds a trajectory of group 'other'"):
        TrajectoryGroup("g", "t", [make_traj(gid="other")])
    with pytest.raises(WireError, match="differ in reward part or timing names"):
        TrajectoryGroup("g", "t", [make_traj(0), make_traj(1, reward_parts={"correct": 1.0})])
    with pytest.raises(WireError, match="not Trajectory"):
        TrajectoryGroup("g", "t", [object()])
    with pytest.raises(WireError, match="expected TrajectoryGroup"):
        encode_groups([make_traj()])


# ----------------------------------------------------------------------------- decoding limits


def test_wrong_schema_version_is_refused_with_its_version():
    header, data = split(encode_group(make_group()))
    header["v"] = 99
    with pytest.raises(
        WireError, match=r"schema version 99 is not supported \(expected one of \(1, 2\)\)"
    ):
        decode_group(join(header, data))


def _declaring(per_traj: int, G: int = 1) -> bytes:
    """A valid-looking message whose G trajectories claim per_traj tokens each, in a tiny blob."""
    header, data = split(encode_group(make_group(G=G, T=4)))
    arrays = header["groups"][0]["arrays"]
    data = bytearray(data)
    for i in range(G):  # the length column of the (G, 4) ints block
        off = arrays["ints"]["offset"] + 16 * i
        data[off : off + 4] = struct.pack("<i", per_traj)
    for name in ("tokens", "loss_mask", "logprobs", "versions"):
        arrays[name]["shape"] = [per_traj * G]
    return join(header, bytes(data))


@pytest.mark.parametrize(
    ("G", "message"),
    [
        (12, "tokens: declares 25769803764 elements, limit 16777216"),  # 12 x (2**31 - 1)
        (1, "tokens: bytes 0..8589934588 lie outside the"),  # 8 GB in one trajectory
    ],
)
def test_a_declared_100gb_array_fails_fast_without_allocating(G, message):
    msg = _declaring(2**31 - 1, G)  # 12 x 2**31 int32 + f32 + i32 + u8 = 335 GB declared
    limits = WireLimits(max_array_elements=2**31) if G == 1 else WireLimits()
    tracemalloc.start()
    t0 = time.thread_time()  # this thread's CPU: work done, not the machine's load
    with pytest.raises(WireError) as e:
        decode_group(msg, limits)
    elapsed = time.thread_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert message in str(e.value)
    assert elapsed < 0.010, f"took {elapsed * 1e3:.2f} ms"
    assert peak < 1 << 20, f"allocated {peak} bytes"


def test_shapes_disagreeing_with_the_lengths_are_refused():
    header, data = split(encode_group(make_group(G=1, T=4)))
    header["groups"][0]["arrays"]["tokens"]["shape"] = [25 * 10**9]
    with pytest.raises(WireError, match=r"shape \[25000000000\], the header implies \[4\]"):
        decode_group(join(header, data))


def test_declared_sizes_beyond_the_data_are_refused():
    with pytest.raises(WireError, match="lie outside"):
        decode_group(_declaring(1000, G=2))


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (WireLimits(max_total_bytes=100), "limit 100"),
        (WireLimits(max_header_bytes=10), "header declares"),
        (WireLimits(max_array_elements=10), "limit 10"),
        (WireLimits(max_str_len=3), "header is not valid msgpack"),
        (WireLimits(max_list_len=2), r"shape must be \[G, 4\] with G <= 2"),
        (WireLimits(max_names=1), "must be a list of at most 1 distinct strings"),
    ],
)
def test_each_limit_is_enforced(limits, message):
    msg = encode_group(make_group(G=3, T=20, gid="group-id", tid="task-id"))
    with pytest.raises(WireError, match=message):
        decode_group(msg, limits)


def _mutate_array(name: str, key: str, value):
    header, data = split(encode_group(make_group()))
    header["groups"][0]["arrays"][name][key] = value
    return join(header, data)


@pytest.mark.parametrize(
    ("name", "key", "value", "message"),
    [
        ("tokens", "dtype", "<f4", "dtype '<f4', expected '<i4'"),
        ("tokens", "dtype", "<i8", "dtype '<i8' is not allowed"),
        ("tokens", "dtype", "|O", "dtype '|O' is not allowed"),
        ("tokens", "dtype", ">i4", "dtype '>i4' is not allowed"),
        ("tokens", "shape", [2, 3], "shape [2, 3], the header implies"),
        ("tokens", "offset", 3, "offset 3 is not an aligned"),
        ("tokens", "offset", -8, "offset -8 is not an aligned"),
        ("logprobs", "offset", 2**40, "lie outside"),
        ("ints", "shape", [2**40, 4], "shape must be [G, 4]"),
        ("ints", "shape", "8", "shape must be [G, 4]"),
    ],
)
def test_bad_descriptors_are_refused(name, key, value, message):
    with pytest.raises(WireError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_group(_mutate_array(name, key, value))


def test_bad_values_inside_the_data_are_refused():
    g = make_group(G=2, T=8)
    msg = bytearray(encode_group(g))
    header, data = split(bytes(msg))
    data_start = len(msg) - len(data)
    arrays = header["groups"][0]["arrays"]

    def poke(name, index, value, dtype):
        m = bytearray(msg)
        off = data_start + arrays[name]["offset"] + index * np.dtype(dtype).itemsize
        m[off : off + np.dtype(dtype).itemsize] = np.array([value], dtype).tobytes()
        return bytes(m)

    # Per-token values are the consumer's check (the learner's packer calls it).
    check_values(decode_group(msg))
    with pytest.raises(WireError, match="loss_mask holds values"):
        check_values(decode_group(poke("loss_mask", 3, 7, np.uint8)))
    with pytest.raises(WireError, match="logprobs are not all finite"):
        check_values(decode_group(poke("logprobs", 5, np.nan, np.float32)))
    with pytest.raises(WireError, match="logprobs are not all finite"):
        check_values(decode_group(poke("logprobs", 0, -np.inf, np.float32)))
    with pytest.raises(WireError, match="negative sample_index"):
        decode_group(poke("ints", 1, -1, np.int32))
    with pytest.raises(WireError, match="status code 5"):
        decode_group(poke("ints", 3, 5, np.int32))
    with pytest.raises(WireError, match="must be finite"):
        decode_group(poke("floats", 0, np.inf, np.float64))


def test_frame_errors():
    msg = encode_group(make_group())
    with pytest.raises(WireError, match="expected bytes"):
        decode_group("not bytes")
    with pytest.raises(WireError, match="not a msgpack bin item"):
        decode_group(b"\x92")
    with pytest.raises(WireError, match="length is cut off"):
        decode_group(b"\x92\xc6\x00")
    with pytest.raises(WireError, match="bad frame prefix"):
        decode_group(b"\x93" + msg[1:])
    with pytest.raises(WireError, match="truncated"):
        decode_group(msg[:-1])
    with pytest.raises(WireError, match="padded"):
        decode_group(msg + b"\0")
    with pytest.raises(WireError, match="exactly one group"):
        decode_group(encode_groups([make_group(), make_group()]))
    hlen = struct.unpack_from(">I", msg, 2)[0]
    with pytest.raises(WireError, match="the data is not a msgpack bin item"):
        decode_group(msg[: 6 + hlen] + b"\xa0" + msg[7 + hlen :])


# ----------------------------------------------------------------------------- hostile input


def _only_wire_errors(buf) -> None:
    try:
        out = decode_groups(buf)
    except WireError:
        return
    for g in out:  # what decodes must be usable
        for t in g.trajectories:
            assert t.tokens.shape == t.loss_mask.shape == t.logprobs.shape == t.versions.shape


@pytest.mark.reliability
def test_10000_random_byte_strings_raise_only_wire_errors(fault):
    row = fault("10,000 random byte strings to the msgpack decoder", "WireError only")
    rng = random.Random(1234)
    prefix = encode_group(make_group())[:6]
    for i in range(10_000):
        n = rng.choice([0, 1, 5, 6, 11, 16, 64, 300, 2000])
        body = rng.randbytes(n)
        if i % 2:  # half start with a plausible frame so they reach deeper checks
            body = prefix[:2] + struct.pack(">I", rng.randrange(0, n + 8)) + body
        _only_wire_errors(body)
    row["observed"] = "WireError or a valid decode, never another exception"


@pytest.mark.reliability
def test_10000_mutated_and_truncated_messages_raise_only_wire_errors(fault):
    row = fault("10,000 mutated and truncated messages to the msgpack decoder", "WireError only")
    rng = random.Random(99)
    base = [
        encode_group(make_group(G=3, T=12)),
        encode_groups([make_group(G=2, T=5), make_group(G=1, T=0, gid="x")]),
        encode_groups([]),
    ]
    for i in range(10_000):
        msg = bytearray(rng.choice(base))
        kind = i % 4
        if kind == 0:  # truncate
            msg = msg[: rng.randrange(len(msg))]
        elif kind == 1:  # flip bytes, mostly in the header
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(min(len(msg), 400))
                msg[pos] = rng.randrange(256)
        elif kind == 2:  # insert or delete bytes
            pos = rng.randrange(len(msg))
            if rng.random() < 0.5:
                msg[pos:pos] = rng.randbytes(rng.randint(1, 16))
            else:
                del msg[pos : pos + rng.randint(1, 16)]
        else:  # flip bytes anywhere, including the data
            for _ in range(rng.randint(1, 4)):
                msg[rng.randrange(len(msg))] ^= 1 << rng.randrange(8)
        _only_wire_errors(bytes(msg))
    row["observed"] = "only WireError"


def _random_value(rng: random.Random, depth: int = 0):
    choices = [
        lambda: None,
        lambda: rng.choice([True, False]),
        lambda: rng.randint(-(2**63), 2**64 - 1),
        lambda: rng.choice([0, -1, 1, 7, 8, 2**31, 2**32]),
        lambda: rng.uniform(-1e300, 1e300),
        lambda: float(rng.choice(["nan", "inf", "-inf"])),
        lambda: rng.choice(["", "ok", "<i4", "|u1", "<f8", "x" * 50]),
        lambda: rng.randbytes(rng.randint(0, 12)),
    ]
    if depth < 2:
        choices += [
            lambda: [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            lambda: {
                "shape": [rng.randint(-2, 100)],
                "dtype": "<i4",
                "offset": rng.randint(-8, 64),
            },
        ]
    return rng.choice(choices)()


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    yield path


@pytest.mark.reliability
def test_10000_structurally_mutated_headers_raise_only_wire_errors(fault):
    row = fault("10,000 structurally mutated headers", "WireError only")
    rng = random.Random(7)
    header, data = split(encode_group(make_group(G=3, T=12)))
    paths = list(_leaves(header))
    for _ in range(10_000):
        h = msgpack.unpackb(msgpack.packb(header))
        path = rng.choice(paths)
        if not path:
            h = _random_value(rng)
        else:
            parent = h
            for k in path[:-1]:
                parent = parent[k]
            if rng.random() < 0.2 and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = _random_value(rng)
        try:
            msg = join(h, data)
        except (TypeError, ValueError, OverflowError):
            continue  # not representable in msgpack
        _only_wire_errors(msg)
    row["observed"] = "only WireError"


def test_unknown_fields_and_extension_types_are_refused():
    header, data = split(encode_group(make_group()))
    header["groups"][0]["extra"] = 1
    with pytest.raises(WireError, match="unknown fields"):
        decode_group(join(header, data))
    header, data = split(encode_group(make_group()))
    header["groups"][0]["group_id"] = msgpack.ExtType(5, b"x")
    with pytest.raises(WireError, match=r"max_ext_len|extension type 5"):
        decode_group(join(header, data))
