"""The device mesh and the one table that maps the model's logical axes onto it.

The model names only logical axes (``("embed", "mlp")``...); :data:`RULES` says
which mesh axis (``data``, ``fsdp``, ``tensor``) each is split over. A dimension
that the mesh axis does not divide is replicated instead (e.g. 2 KV heads on a
tensor axis of 4), so any mesh shape loads any model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from learner.model.params import Model, param_info
from shared.config import MeshConfig

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or None: replicated)
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("layers", None),  # the stacked decoder blocks' leading axis: each device holds every layer
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
)


def split_cpu(n: int) -> None:
    """Give JAX's CPU backend ``n`` devices (``mesh.cpu_devices``; 0 leaves its default).

    Must run before the backend starts (the first array or ``jax.devices()``): a process
    whose backend is already up with another count keeps it, with a warning."""
    if not n:
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # the backend is up: the count cannot change any more
        have = len(jax.devices("cpu"))
        if have != n:
            logging.getLogger("learner").warning(
                "mesh.cpu_devices=%d not applied: JAX's CPU backend had started with %d", n, have
            )


def make_mesh(cfg: MeshConfig | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over ``devices``; ``-1`` sizes take what is left.

    Axes are Auto (``jax.make_mesh`` would make them Explicit, which breaks indexing
    of sharded arrays in code written for Auto).
    """
    cfg = cfg or MeshConfig()
    devices = list(devices if devices is not None else jax.devices())
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if sizes.count(-1) > 1:
        raise ValueError("at most one mesh axis may be -1")
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into mesh axes of {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes, strict=True))} != {len(devices)} devices"
        )
    grid = np.array(devices, dtype=object).reshape(sizes)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def spec_for(
    axes: Sequence[str],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, str | tuple[str, ...] | None]] = RULES,
) -> PartitionSpec:
    """The partition spec of an array with logical ``axes``; undivisible dims are replicated."""
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name, size in zip(axes, shape, strict=True):
        target = table.get(name)
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n in mesh.shape and n not in used)
        ways = int(np.prod([mesh.shape[n] for n in names])) if names else 1
        if not names or size % ways:
            out.append(None)
            continue
        used.update(names)
        out.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*out)


def param_shardings(
    model: Model, mesh: Mesh, rules: Sequence[tuple[str, str | tuple[str, ...] | None]] = RULES
) -> dict[str, NamedSharding]:
    """The sharding of every parameter by dotted path (the keys of ``get_params``)."""
    return {
        p.path: NamedSharding(mesh, spec_for(p.axes, p.shape, mesh, rules))
        for p in param_info(model)
    }


def abstract_params(
    model: Model, shardings: Mapping[str, jax.sharding.Sharding]
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shape/dtype/sharding stand-ins of the parameters: restore targets for Orbax."""
    return {
        p.path: jax.ShapeDtypeStruct(p.shape, jnp.dtype(p.dtype), sharding=shardings[p.path])
        for p in param_info(model)
    }


def shard(params: Mapping[str, jax.Array], shardings: Mapping[str, jax.sharding.Sharding]):
    """Place parameters (by path) with their shardings."""
    return {k: jax.device_put(v, shardings[k]) for k, v in params.items()}
