"""Host data shared by every process of a multi-process run, and device arrays built from it.

The RL loop follows one SPMD rule (docs/design.md): whatever feeds a program that spans
several processes is computed from data every process holds. Three moves make that cheap:

- `allgather_objects(x)`: every process contributes a picklable value and receives all of
  them, in process order (rollout results of the local replicas, reward scores of the
  local share). Two small collectives: the byte lengths, then the padded bytes.
- `global_array(host, sharding)`: a global `jax.Array` from a numpy array that every
  process holds in full (the RL batch): each process fills only its own shards.
- `shard_global_batch(batch, mesh)`: such a batch as global arrays split over data x fsdp.
- `fetch(x)`: the full value of a global array as numpy on every process (log-probs and
  values computed over the global mesh, a parameter being written to a file), without
  touching non-addressable devices. Every process must fetch the same arrays in the same
  order: gathering a sharded array is a collective.
- `any_process(flag)`: True on every process when `flag` is True on any of them (a run's
  stop after a SIGTERM that reached one process: `rljax.runs.Preemption`). One small
  allgather, which every process must make at the same point.

With one process each is a plain local operation.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np


def _allgather(x: np.ndarray) -> np.ndarray:
    """`[processes, *x.shape]`: `x` from every process (x has the same shape everywhere)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x))


def allgather_objects(value: Any) -> list[Any]:
    """`[value of process 0, value of process 1, ...]` on every process."""
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    lengths = _allgather(np.asarray([data.size], np.int64)).reshape(-1)  # [processes]
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: data.size] = data
    gathered = _allgather(padded)  # [processes, longest]
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(lengths)]


def any_process(flag: bool) -> bool:
    """Whether `flag` is True on at least one process (the same answer on all of them)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(_allgather(np.asarray([int(bool(flag))], np.int32)).max() > 0)


class ProcessesTimeout(RuntimeError):
    """Another process did not reach a point every process must reach in time."""


def wait_for_processes(name: str, timeout_s: float, what: str) -> None:
    """Every process marks `name` reached, then waits up to `timeout_s` seconds (in all)
    for the others' marks; `ProcessesTimeout` (one line: this process, the missing ones,
    `what` they did not reach) otherwise. `name` must be new for each point (a counter
    every process advances alike)."""
    if jax.process_count() == 1:
        return
    import time

    from jax._src import distributed

    client = distributed.global_state.client
    me = jax.process_index()
    client.key_value_set(f"rljax/reached/{name}/{me}", "1")
    deadline = time.monotonic() + max(timeout_s, 0.0)
    missing = []
    for p in range(jax.process_count()):
        if p == me:
            continue
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            client.blocking_key_value_get(f"rljax/reached/{name}/{p}", left_ms)
        except Exception:  # noqa: BLE001 - the coordination service's deadline error
            missing.append(p)
    if missing:
        raise ProcessesTimeout(f"process {me}: process(es) {missing} did not reach {what} within {timeout_s:g} s "
                               "(stalled or failed; see their log)")


def exchange_objects(name: str, value: Any, timeout_s: float, what: str) -> list[Any]:
    """`[value of process 0, value of process 1, ...]` on every process, through the
    coordination service's key-value store: no device program, so any thread may call it
    (a producer's, while the main thread runs the trainer's programs). `name` must be new
    for each exchange (a counter every process advances alike); `ProcessesTimeout` (one
    line naming the missing processes and `what`) after `timeout_s` seconds (0: none)."""
    if jax.process_count() == 1:
        return [value]
    import base64
    import time

    from jax._src import distributed

    client = distributed.global_state.client
    me = jax.process_index()
    client.key_value_set(f"rljax/exchange/{name}/{me}",
                         base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii"))
    deadline = time.monotonic() + (timeout_s if timeout_s > 0 else 10 * 365 * 86400)
    out, missing = [], []
    for p in range(jax.process_count()):
        if p == me:
            out.append(value)
            continue
        left_ms = max(1, min(int((deadline - time.monotonic()) * 1000), 2**31 - 1))
        try:
            out.append(pickle.loads(base64.b64decode(client.blocking_key_value_get(f"rljax/exchange/{name}/{p}",
                                                                                   left_ms))))
        except Exception:  # noqa: BLE001 - the coordination service's deadline error
            missing.append(p)
    if missing:
        raise ProcessesTimeout(f"process {me}: process(es) {missing} did not reach {what} within {timeout_s:g} s "
                               "(stalled or failed; see their log)")
    return out


def global_array(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array equal to `host`, which every process holds in full and identically;
    each process copies only the slices of its addressable shards."""
    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_global_batch(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
    """A batch every process holds in full (`[rows, ...]` numpy arrays), as global arrays
    with rows split over data x fsdp (`rljax.parallel.batch_sharding`)."""
    from rljax.parallel import batch_sharding, check_batch

    sharding = batch_sharding(mesh)
    for key, value in batch.items():
        check_batch(np.shape(value)[0], mesh, name=f"batch[{key!r}]")
    return {key: global_array(value, sharding) for key, value in batch.items()}


def fetch(x: jax.Array) -> np.ndarray:
    """The whole of `x` as numpy, on every process (an allgather when `x` has shards on
    other processes' devices; a device-to-host copy otherwise)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    if x.is_fully_replicated:  # every process holds all of it
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
