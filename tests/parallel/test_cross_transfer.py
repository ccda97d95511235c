"""Weights from the trainer's devices to disjoint rollout devices as one program over
their union (`rljax.rollout.cross_transfer`), on 2 processes x 4 CPU devices (jax.distributed
over gloo): each process gives 2 devices to the trainer and 2 to the rollout
(`split_devices`), a sharded leaf and a replicated one cross bit for bit, keep their
layout, land only on the rollout devices, and are then resharded into the rollout
replicas' layout within those devices; `jax.device_put` of the same move is refused
(the multi-controller limit the union program avoids)."""

import textwrap

import pytest

from tests.parallel.helpers import run_two_processes

pytestmark = pytest.mark.slow


WORKER = textwrap.dedent("""
    import json, time
    import numpy as np
    from rljax.distributed import initialize
    initialize()
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from rljax.hostsync import fetch, global_array
    from rljax.rl.async_config import split_devices
    from rljax.rollout.cross_transfer import UnionTransfer
    from rljax.rollout.replicas import ReplicaLayout

    split = split_devices(jax.devices(), "one_step_off", 2)
    trainer = jax.make_mesh((1, 4, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3,
                            devices=split.trainer)
    host = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    tree = {"w": global_array(host, NamedSharding(trainer, P("fsdp", None))),
            "b": global_array(np.full(8, 3.0, np.float32), NamedSharding(trainer, P()))}
    transfer = UnionTransfer(trainer, split.rollout)
    out = jax.block_until_ready(transfer(tree))
    big = {"w": global_array(np.ones((2048, 2048), np.float32), NamedSharding(trainer, P("fsdp", None)))}
    jax.block_until_ready(transfer(big))  # compiles
    seconds = []
    for _ in range(3):  # 16 MiB, 4 MiB per trainer device
        start = time.perf_counter()
        jax.block_until_ready(transfer(big))
        seconds.append(time.perf_counter() - start)
    layout = ReplicaLayout.create(split.rollout, 1)  # 4 replicas of 1 device, 2 per process
    replicated = jax.device_put(out["w"], NamedSharding(layout.mesh, P()))  # within the rollout devices
    try:
        jax.device_put(tree["w"], NamedSharding(transfer.mirror, P("fsdp", None)))
        refused = ""
    except Exception as e:
        refused = type(e).__name__
    print("RESULT " + json.dumps({
        "pid": jax.process_index(), "w": bool((fetch(out["w"]) == host).all()), "b": fetch(out["b"]).tolist(),
        "w_devices": sorted(d.id for d in out["w"].devices()), "spec": str(out["w"].sharding.spec),
        "rollout": [(d.process_index, d.id % 2048) for d in split.rollout],
        "trainer": [(d.process_index, d.id % 2048) for d in split.trainer], "rollout_ids": [d.id for d in split.rollout],
        "replicated": bool((fetch(replicated) == host).all()), "seconds": min(seconds), "refused": refused,
    }), flush=True)
""")


def test_weights_cross_to_disjoint_rollout_devices_on_two_processes():
    outs = run_two_processes(WORKER, timeout=300)
    print("union transfer of 16 MiB, 2 processes, best of 3 (s):", [o["seconds"] for o in outs])
    for i, result in enumerate(outs):
        assert result["pid"] == i
        # (process, local device): each process's first two devices sample, the other two train
        assert result["rollout"] == [[0, 0], [0, 1], [1, 0], [1, 1]]
        assert result["trainer"] == [[0, 2], [0, 3], [1, 2], [1, 3]]
        assert result["w"] and result["b"] == [3.0] * 8 and result["replicated"]
        assert result["w_devices"] == sorted(result["rollout_ids"]) and result["spec"] == "P('fsdp', None)"
        assert result["refused"]  # jax.device_put cannot make this move across processes
