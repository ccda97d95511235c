"""`rljax.rollout.cross_transfer` on one process (8 CPU devices): arrays sharded over a
trainer mesh on devices 4-7 arrive on devices 0-3 bit for bit, laid out alike; the union
mesh refuses overlapping or unequal device sets."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from rljax.parallel import ShardingError
from rljax.rollout.cross_transfer import UnionTransfer, union_mesh


def trainer_mesh(devices):
    return jax.make_mesh((1, len(devices), 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3,
                         devices=devices)


def test_arrays_cross_to_the_rollout_devices_unchanged():
    devices = jax.devices()
    mesh = trainer_mesh(devices[4:])
    w = np.random.default_rng(0).normal(size=(32, 12)).astype(np.float32)
    tree = {"w": jax.device_put(w, NamedSharding(mesh, P("fsdp", None))),
            "n": jax.device_put(np.arange(6, dtype=np.int32), NamedSharding(mesh, P()))}
    transfer = UnionTransfer(mesh, devices[:4])
    for _ in range(2):  # the second call reuses the compiled program and the placeholders
        out = transfer(tree)
        np.testing.assert_array_equal(np.asarray(out["w"]), w)
        np.testing.assert_array_equal(np.asarray(out["n"]), np.arange(6))
        assert {d.id for d in out["w"].devices()} == {0, 1, 2, 3}
        assert out["w"].sharding.spec == P("fsdp", None) and out["w"].sharding.mesh == transfer.mirror
    assert len(transfer._programs) == 1


def test_union_mesh_needs_disjoint_sets_of_one_size():
    devices = jax.devices()
    with pytest.raises(ShardingError, match="as many rollout devices as trainer devices"):
        union_mesh(trainer_mesh(devices[4:]), devices[:2])
    with pytest.raises(ShardingError, match="overlap"):
        union_mesh(trainer_mesh(devices[4:]), devices[2:6])
