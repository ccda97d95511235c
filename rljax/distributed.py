"""Multi-host start-up: `jax.distributed.initialize` from the environment, once, before
anything touches a JAX backend.

Every process of a run executes the same program (SPMD); after `initialize()`,
`jax.devices()` lists the devices of all processes and one mesh spans them. Process 0 is
the coordinator: it alone logs, prints and writes run metadata (`is_coordinator()`).

Environment variables (read by `initialize()`):

    RLJAX_DISTRIBUTED          auto (default) | 1 | 0
        auto: initialise when a coordinator address is given (below) or a multi-host
              TPU environment is detected (GKE: TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES
              with more than one host; Multislice: MEGASCALE_COORDINATOR_ADDRESS);
              otherwise run as a single process.
        1:    always call `jax.distributed.initialize`, letting JAX auto-detect whatever
              is not given (Cloud TPU VMs via the metadata server, GKE, Slurm, Open MPI).
              `launch/tpu_vm.sh` sets this on every worker.
        0:    never (single process, even if the variables below are set).
    RLJAX_COORDINATOR_ADDRESS  host:port of process 0 (JAX_COORDINATOR_ADDRESS also works)
    RLJAX_NUM_PROCESSES        number of processes
    RLJAX_PROCESS_ID           this process's index, 0 .. N-1
    RLJAX_LOCAL_DEVICE_IDS     optional, comma-separated local device ids this process uses
    RLJAX_CPU_COLLECTIVES      CPU cross-process collectives (default gloo; "mpi" needs MPI)
    RLJAX_INIT_TIMEOUT         seconds to wait for all processes (default 300)

On CPU (`JAX_PLATFORMS=cpu`, tests and `launch/local_multiprocess.py`) each process
also sets `--xla_force_host_platform_device_count` in its own XLA_FLAGS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import jax

from rljax import xla_flags

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class DistributedSettings:
    """What `initialize` will do, decided from the environment alone (no JAX calls)."""

    mode: str  # "single" | "explicit" | "auto-detect"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    cpu_collectives: str = "gloo"
    timeout_s: int = 300


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={value!r}: expected an integer") from None


def _tpu_multihost(env: Mapping[str, str]) -> bool:
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    return len([h for h in hosts.split(",") if h.strip()]) > 1 or bool(env.get("MEGASCALE_COORDINATOR_ADDRESS"))


def settings_from_env(env: Mapping[str, str] | None = None) -> DistributedSettings:
    """Read the RLJAX_* variables (see the module docstring) into settings."""
    env = os.environ if env is None else env
    flag = env.get("RLJAX_DISTRIBUTED", "auto").strip().lower()
    if flag not in _TRUE | _FALSE | {"auto"}:
        raise ValueError(f"RLJAX_DISTRIBUTED={flag!r}: expected auto, 1 or 0")
    address = env.get("RLJAX_COORDINATOR_ADDRESS") or env.get("JAX_COORDINATOR_ADDRESS") or None
    num = _int(env, "RLJAX_NUM_PROCESSES")
    pid = _int(env, "RLJAX_PROCESS_ID")
    ids_text = env.get("RLJAX_LOCAL_DEVICE_IDS", "")
    ids = tuple(int(i) for i in ids_text.split(",") if i.strip()) or None
    common = dict(
        cpu_collectives=env.get("RLJAX_CPU_COLLECTIVES", "gloo"),
        timeout_s=_int(env, "RLJAX_INIT_TIMEOUT") or 300,
    )
    if flag in _FALSE:
        return DistributedSettings("single", **common)
    if address is not None:
        if num is None or pid is None:
            raise ValueError(
                f"RLJAX_COORDINATOR_ADDRESS={address} needs RLJAX_NUM_PROCESSES and RLJAX_PROCESS_ID "
                f"(got {num} and {pid})"
            )
        if not 0 <= pid < num:
            raise ValueError(f"RLJAX_PROCESS_ID={pid} is not in 0..{num - 1} (RLJAX_NUM_PROCESSES={num})")
        return DistributedSettings("explicit", address, num, pid, ids, **common)
    if flag in _TRUE or _tpu_multihost(env):
        return DistributedSettings("auto-detect", None, num, pid, ids, **common)
    return DistributedSettings("single", **common)


def initialize(env: Mapping[str, str] | None = None) -> DistributedSettings:
    """Start `jax.distributed` as the environment says; a no-op for a single process or
    when already initialised. Call it first thing in a process, before any JAX
    computation or `jax.devices()`."""
    xla_flags.apply()  # read by XLA when the backend starts, below or at the first computation
    settings = settings_from_env(env)
    if settings.mode == "single" or jax.distributed.is_initialized():
        return settings
    # CPU cross-process collectives (only the CPU backend reads this flag).
    jax.config.update("jax_cpu_collectives_implementation", settings.cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=settings.coordinator_address,
        num_processes=settings.num_processes,
        process_id=settings.process_id,
        local_device_ids=list(settings.local_device_ids) if settings.local_device_ids else None,
        initialization_timeout=settings.timeout_s,
    )
    return settings


def is_coordinator() -> bool:
    """True on process 0, the one that logs, prints and writes run metadata."""
    return jax.process_index() == 0


def print0(*args, **kwargs) -> None:
    """`print` on process 0 only."""
    if is_coordinator():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def sync(name: str) -> None:
    """Barrier: every process waits here until all have arrived (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
