"""Replica layout: devices grouped per process (never across hosts unless asked), one
line errors for impossible sizes, the same layout whatever order the devices come in;
and the KV pool per replica: per-device bytes measured from the pools' shards."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rljax.models import abstract_model
from rljax.parallel import ShardingError, measured_bytes, state_shardings
from rljax.rollout.handoff import hand_off
from rljax.rollout.kv_cache import CacheShape, allocate_pool, cache_sharding
from rljax.rollout.replicas import ReplicaLayout, group_devices, kv_bytes_per_device

from .replica_fixtures import CONFIG, numbered_params


@dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


def two_hosts():
    """2 processes x 4 devices, listed in a scrambled order."""
    devices = [FakeDevice(i, i // 4) for i in range(8)]
    return [devices[i] for i in (5, 2, 7, 0, 3, 6, 1, 4)]


def ids(groups):
    return [[d.id for d in g] for g in groups]


def test_replicas_stay_inside_a_process_and_ignore_the_listing_order():
    assert ids(group_devices(two_hosts(), 2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ids(group_devices(two_hosts(), 4, 2)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ids(group_devices(two_hosts(), 1)) == [[i] for i in range(8)]
    # ids interleaved across processes: grouping follows the process, then the id
    devices = [FakeDevice(i, i % 2) for i in range(8)]
    assert ids(group_devices(devices, 2)) == [[0, 2], [4, 6], [1, 3], [5, 7]]


def test_a_replica_spans_hosts_only_when_asked():
    with pytest.raises(ShardingError, match=r"spans processes \[0, 1\].*allow_cross_host_replicas"):
        group_devices(two_hosts(), 8)
    assert ids(group_devices(two_hosts(), 8, allow_cross_host=True)) == [list(range(8))]
    # 3 devices per process and tp = 2: replica 1 would take one device of each
    uneven = [FakeDevice(i, i // 3) for i in range(6)]
    with pytest.raises(ShardingError, match="replica 1 .* spans processes"):
        group_devices(uneven, 2)


@pytest.mark.parametrize("tp, dp, message", [
    (3, None, "tensor_parallel_size=3 does not divide the 8 rollout devices"),
    (2, 2, r"data_parallel_size=2 x rollout.tensor_parallel_size=2 = 4 replica devices, but the rollout has 8"),
    (0, None, "tensor_parallel_size=0: must be >= 1"),
])
def test_impossible_sizes_fail_in_one_line(tp, dp, message):
    with pytest.raises(ShardingError, match=message) as err:
        group_devices(two_hosts(), tp, dp)
    assert "\n" not in str(err.value)


def test_layout_meshes_over_the_real_devices():
    layout = ReplicaLayout.create(tensor_parallel_size=2)
    devices = jax.devices()
    assert layout.num_replicas == 4 and layout.tensor_parallel_size == 2
    assert dict(layout.mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    for r, mesh in enumerate(layout.replicas):
        assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 2}
        assert list(mesh.devices.flat) == list(layout.mesh.devices[r].flat) == devices[2 * r: 2 * r + 2]
    assert layout.local_replicas() == (0, 1, 2, 3)
    assert layout.local_replicas(process_index=1) == ()
    assert ReplicaLayout.create(devices[::-1], 2) == layout  # the same on every process
    # the model's logical rules apply on a replica mesh: heads / MLP / vocab over tensor
    specs = state_shardings(nnx.state(abstract_model(CONFIG)), layout.replicas[0])
    assert specs["layers"]["q_proj"].get_value().spec == P(None, None, "tensor", None)  # [L, embed, heads, D]
    assert specs["layers"]["down_proj"].get_value().spec == P(None, "tensor", None)  # [L, mlp, embed]
    assert specs["embed"].get_value().spec == P("tensor", None)  # [vocab, embed]


def test_kv_bytes_per_device_formula():
    shape = CacheShape(num_layers=2, num_pages=5, page_size=4, kv_heads=8, head_dim=8, dtype=jnp.bfloat16)
    whole = 2 * 2 * 5 * 4 * 8 * 8 * 2
    assert kv_bytes_per_device(shape, 1) == whole
    assert kv_bytes_per_device(shape, 4) == whole // 4
    assert kv_bytes_per_device(shape, 3) == whole  # 8 kv heads do not split 3 ways: whole on each


@pytest.fixture(scope="module")
def params():
    return numbered_params()


SEQS, PAGES_PER_SEQ = 8, 3  # sequences of the whole rollout; pages each


def replica_pools(layout: ReplicaLayout, params):
    """Real pools for every replica, sized for its share of SEQS (plus the null page),
    laid out by kv_cache.cache_sharding from the replica's own parameters."""
    seqs = SEQS // layout.num_replicas
    shape = CacheShape(CONFIG.num_hidden_layers, seqs * PAGES_PER_SEQ + 1, 4, CONFIG.num_key_value_heads,
                       CONFIG.head_dim, jnp.float32)
    pools = [allocate_pool(shape, cache_sharding(p, CONFIG.num_key_value_heads)) for p in hand_off(params, layout)]
    return shape, pools


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_kv_bytes_per_device_fall_as_one_over_replicas(replicas, params):
    """tp = 1 on `replicas` devices, SEQS sequences in all: each device's pool holds
    SEQS / replicas sequences (plus its null page)."""
    layout = ReplicaLayout.create(jax.devices()[:replicas], tensor_parallel_size=1)
    shape, pools = replica_pools(layout, params)
    per_device = measured_bytes(pools)
    assert sorted(d.id for d in per_device) == list(range(replicas))
    null_page = shape.bytes_per_page
    for nbytes in per_device.values():
        assert nbytes == kv_bytes_per_device(shape, 1)
        assert (nbytes - null_page) * replicas == SEQS * PAGES_PER_SEQ * shape.bytes_per_page


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_kv_pools_split_over_each_replicas_tensor_devices(replicas, params):
    """All 8 devices, tp = 8 / replicas: kv heads split over tp, so every device holds
    1/8 of the sequences' pages whatever the layout (vs all of them when the pool is
    replicated over data x fsdp)."""
    tp = 8 // replicas
    layout = ReplicaLayout.create(tensor_parallel_size=tp)
    shape, pools = replica_pools(layout, params)
    for pool, mesh in zip(pools, layout.replicas):
        assert pool.sharding.mesh == mesh
        assert pool.sharding.spec == (P(None, None, None, "tensor", None) if tp > 1 else P())  # [L, P, S, 2K, D]
    per_device = measured_bytes(pools)
    assert len(per_device) == 8
    for nbytes in per_device.values():
        assert nbytes == kv_bytes_per_device(shape, tp)
        assert (nbytes - shape.bytes_per_page // tp) * 8 == SEQS * PAGES_PER_SEQ * shape.bytes_per_page


@dataclass(frozen=True)
class SliceDevice:
    id: int
    process_index: int
    slice_index: int


def test_a_replica_never_spans_slices():
    """2 slices of one process each, 3 devices per slice: with tp = 2 replica 1 would take a
    device of each slice; that is refused even where crossing hosts is allowed."""
    devices = [SliceDevice(i, i // 3, i // 3) for i in range(6)]
    with pytest.raises(ShardingError, match=r"replica 1 of rollout.tensor_parallel_size=2 devices spans slices \[0, 1\]"):
        group_devices(devices, 2, allow_cross_host=True)
    assert ids(group_devices(devices, 3, allow_cross_host=True)) == [[0, 1, 2], [3, 4, 5]]
