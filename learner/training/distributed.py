"""Multi-process JAX: ``jax.distributed.initialize`` from the config or the environment.

``mesh.coordinator_address`` / ``num_processes`` / ``process_id`` win when set;
otherwise ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``;
otherwise, inside a multi-task SLURM job, JAX's own SLURM detection (the
coordinator is the first node of the job). A single process initialises nothing.
"""

from __future__ import annotations

import logging
import os

import jax

from shared.config import MeshConfig

log = logging.getLogger(__name__)


def initialize(cfg: MeshConfig) -> bool:
    """Join the job's processes; True when running multi-process."""
    address = cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address:
        n = cfg.num_processes if cfg.coordinator_address else _env_int("JAX_NUM_PROCESSES", 1)
        pid = cfg.process_id if cfg.coordinator_address else _env_int("JAX_PROCESS_ID", 0)
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid)
    elif _env_int("SLURM_NTASKS", 1) > 1:
        jax.distributed.initialize()  # JAX reads SLURM's variables
    else:
        return False
    log.info("process %d of %d, %d devices", jax.process_index(), jax.process_count(),
             jax.device_count())  # fmt: skip
    return True


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default
