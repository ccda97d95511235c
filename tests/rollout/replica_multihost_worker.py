"""One of two processes (4 CPU devices each) in `test_replicas_multihost.py`: lays out
replicas over all 8 devices (tp = 2 inside hosts, then tp = 8 across them), hands the
training layout's weights off, checks its own replicas and prints a JSON line of what it
saw for each layout."""

import json

from rljax.distributed import initialize

initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax.parallel import MeshConfig, make_mesh, measured_bytes, state_shardings  # noqa: E402
from rljax.rollout.handoff import timed_hand_off  # noqa: E402
from rljax.rollout.replicas import ReplicaLayout  # noqa: E402

from replica_fixtures import numbered_params  # noqa: E402  (this script's folder is on sys.path)


def check(replica, source) -> None:
    """Every shard this process holds is the source's block, bit for bit."""
    for got, want in zip(jax.tree.leaves(replica), jax.tree.leaves(source)):
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(want)[shard.index])


def describe(train, params, tp: int, cross_host: bool) -> None:
    layout = ReplicaLayout.create(tensor_parallel_size=tp, allow_cross_host=cross_host)
    out, cost = timed_hand_off(train, layout)
    for replica in out:
        check(replica, params)
    print(json.dumps({
        "process": jax.process_index(),
        "local_replicas": list(layout.local_replicas()),
        "replica_devices": [[d.id for d in m.devices.flat] for m in layout.replicas],
        "replica_processes": [[d.process_index for d in m.devices.flat] for m in layout.replicas],
        "bytes": sorted(set(measured_bytes(out).values())),
        "allocated": sorted(set(cost.allocated_bytes.values())),
    }), flush=True)


if __name__ == "__main__":
    params = numbered_params()  # the same values on both processes
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))  # fsdp over all 8 devices, both processes
    train = jax.device_put(params, state_shardings(params, mesh))
    describe(train, params, tp=2, cross_host=False)
    describe(train, params, tp=8, cross_host=True)
