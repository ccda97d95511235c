"""Weight hand-off: the training layout's arrays land in each replica's layout in device
memory with the source's exact values; a replica's device holds 1/tp of every split
weight; nothing is copied where the layouts coincide; the report counts what was
allocated, per device, from the arrays' shards."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.parallel import MeshConfig, make_mesh, measured_bytes, state_shardings
from rljax.rollout.handoff import HandOffCache, hand_off, timed_hand_off
from rljax.rollout.replicas import ReplicaLayout

from .replica_fixtures import CONFIG, numbered_params

SPLIT_AXES = {"vocab", "mlp", "heads", "kv_heads"}  # what tensor parallelism splits


@pytest.fixture(scope="module")
def params():
    return numbered_params()


def training_layout(params, devices, **mesh):
    mesh = make_mesh(MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, **mesh}), devices=devices)
    return jax.device_put(params, state_shardings(params, mesh))


def replica_bytes_per_device(params, tp: int) -> int:
    """Per device of a replica: split weights / tp, the rest whole (from logical axes)."""
    total = 0
    for var in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        value = var.get_value()
        split = SPLIT_AXES & set(var.get_metadata()["logical_axes"])
        total += value.nbytes // tp if split else value.nbytes
    return total


def buffers(tree) -> set[int]:
    return {s.data.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards}


@pytest.mark.slow
@pytest.mark.parametrize("mesh, tp, rollout_devices", [
    (dict(fsdp=8), 1, slice(None)),
    (dict(fsdp=8), 2, slice(None)),
    (dict(data=2, fsdp=2, tensor=2), 4, slice(None)),
    (dict(fsdp=4, tensor=2), 8, slice(None)),
    (dict(fsdp=4), 2, slice(4, 8)),  # rollout on devices the trainer does not use
])
def test_each_replica_gets_exact_weights_split_over_its_tp_devices(params, mesh, tp, rollout_devices):
    devices = jax.devices()
    train_devices = devices[: math.prod(mesh.values())]
    train = training_layout(params, train_devices, **mesh)
    layout = ReplicaLayout.create(devices[rollout_devices], tensor_parallel_size=tp)
    out, report = timed_hand_off(train, layout)
    assert len(out) == layout.num_replicas
    source = jax.tree.leaves(params)
    expected = replica_bytes_per_device(params, tp)
    for replica, mesh_r in zip(out, layout.replicas):
        assert jax.tree.structure(replica) == jax.tree.structure(params)
        for got, want in zip(jax.tree.leaves(replica), source):
            assert got.sharding.mesh == mesh_r and got.dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        per_device = measured_bytes(replica)
        assert sorted(per_device, key=lambda d: d.id) == list(mesh_r.devices.flat)
        assert set(per_device.values()) == {expected}
    # training and rollout layouts differ: every byte a replica holds is new
    assert report.allocated_bytes == {d.id: expected for d in devices[rollout_devices]}
    assert report.seconds > 0
    assert report.metrics()["memory/update_weights_GiB"] == expected / 2**30


@pytest.mark.parametrize("mesh, tp, devices", [
    (dict(data=4, tensor=2), 2, 8),  # tensor-parallel training, the same devices per replica
    (dict(data=8), 1, 8),  # pure data parallel training, one device per replica
    (dict(tensor=2), 2, 2),  # one replica that is the training mesh
])
def test_coinciding_layouts_are_handed_off_without_a_copy(params, mesh, tp, devices):
    devices = jax.devices()[:devices]
    train = training_layout(params, devices, **mesh)
    out, report = timed_hand_off(train, ReplicaLayout.create(devices, tensor_parallel_size=tp))
    assert set().union(*(buffers(replica) for replica in out)) == buffers(train)
    assert report.allocated_bytes == {d.id: 0 for d in devices}
    for replica in out:
        for got, want in zip(jax.tree.leaves(replica), jax.tree.leaves(params)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_hand_off_to_chosen_replicas(params):
    layout = ReplicaLayout.create(tensor_parallel_size=2)
    train = training_layout(params, jax.devices(), fsdp=8)
    (third,) = hand_off(train, layout, replicas=[2])
    assert {d.id for d in measured_bytes(third)} == {4, 5}


@pytest.mark.slow
def test_a_sampler_on_a_replica_samples_the_single_device_tokens(llama, roomy_sampler):
    """The plug-in path: the replica's state merged into the model runs a Sampler on the
    replica's devices (kv heads over its tensor axis) with the single-device tokens."""
    from rljax.rollout import Sampler, SamplingParams

    from .conftest import random_prompts

    graphdef, state = nnx.split(llama)
    train = training_layout(state, jax.devices(), fsdp=4, tensor=2)
    layout = ReplicaLayout.create(tensor_parallel_size=2)
    (replica,) = hand_off(train, layout, replicas=[3])
    prompts = random_prompts([5, 9, 14], seed=41)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=5)
    want = roomy_sampler.generate(prompts, params)
    with Sampler(nnx.merge(graphdef, replica), roomy_sampler.config) as sampler:
        got = sampler.generate(prompts, params)
        assert set(sampler.engine.device.pool.kv.sharding.device_set) == set(layout.replicas[3].devices.flat)
        assert sampler.engine.device.pool.kv.sharding.spec[3] == "tensor"  # [L, P, S, 2K, D]: kv heads
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    np.testing.assert_allclose([c.log_probs for c in got], [c.log_probs for c in want], atol=1e-5)


def test_a_donated_source_does_not_break_the_next_hand_off():
    """Replicas on 2 of the 8 training devices (tp=1, dp=2): a leaf the training layout
    replicates (qwen2's q/k/v biases: no fsdp axis) is handed off as views of the
    training buffers on devices 0 and 1. The train step then donates (deletes) them; the
    next hand-off must neither read those dead arrays nor reuse them, and must deliver
    the new values. (A quickstart run with rollout.tensor_parallel_size=1
    rollout.data_parallel_size=2 stopped at step 1 on exactly this.)"""
    params = numbered_params(dataclasses.replace(CONFIG, model_type="qwen2", qkv_bias=True))
    assert any(leaf.ndim == 3 and leaf.shape[1:] == (8, 8) for leaf in jax.tree.leaves(params))  # biases
    layout = ReplicaLayout.create(jax.devices()[:2], tensor_parallel_size=1, data_parallel_size=2)
    expected = [np.asarray(leaf) + 1 for leaf in jax.tree.leaves(params)]
    cache = HandOffCache()
    train = training_layout(params, jax.devices(), fsdp=8)
    timed_hand_off(train, layout, cache=cache)
    step = jax.jit(lambda tree: jax.tree.map(lambda x: x + 1, tree), donate_argnums=0)
    train = step(train)  # the old arrays (and any replica view of them) are deleted
    out, report = timed_hand_off(train, layout, cache=cache)
    for replica in out:
        for got, want in zip(jax.tree.leaves(replica), expected):
            np.testing.assert_array_equal(np.asarray(got), want)
    assert set(report.allocated_bytes) == {0, 1}


@pytest.mark.parametrize("mesh, tp, rollout_devices, copies", [
    (dict(fsdp=8), 2, slice(None), True),  # resharded
    (dict(data=8), 1, slice(None), False),  # layouts coincide: float32 is zero copy, the cast is the only copy
    (dict(fsdp=4), 2, slice(4, 8), True),  # onto devices the trainer does not use
])
def test_a_bfloat16_hand_off_holds_the_cast_weights_in_half_the_bytes(params, mesh, tp, rollout_devices, copies):
    """`dtype=bfloat16`: every replica holds numpy's bfloat16 rounding of the float32 source
    (values that need more than 8 bits of mantissa, so the rounding shows) in half the
    bytes, and the hand-off allocates half of what a float32 copy takes on every device."""
    devices = jax.devices()
    train = training_layout(params, devices[: math.prod(mesh.values())], **mesh)
    train = jax.tree.map(lambda x: x * 1.001 + 0.3, train)  # not exact in bfloat16
    layout = ReplicaLayout.create(devices[rollout_devices], tensor_parallel_size=tp)
    full, full_report = timed_hand_off(train, layout)
    half, half_report = timed_hand_off(train, layout, dtype="bfloat16")
    for replica in half:
        for got, want in zip(jax.tree.leaves(replica), jax.tree.leaves(train)):
            assert got.dtype == jnp.bfloat16
            want = np.asarray(want)
            assert not np.array_equal(want.astype(jnp.bfloat16).astype(np.float32), want)
            np.testing.assert_array_equal(np.asarray(got), want.astype(jnp.bfloat16))
    expected = replica_bytes_per_device(params, tp)
    assert full_report.allocated_bytes == {d.id: expected if copies else 0 for d in devices[rollout_devices]}
    assert half_report.allocated_bytes == {d.id: expected // 2 for d in devices[rollout_devices]}
    assert all(measured_bytes(h) == {d: b // 2 for d, b in measured_bytes(f).items()} for f, h in zip(full, half))


@pytest.mark.slow
def test_bfloat16_weights_sample_exactly_like_float32_weights_at_bfloat16_compute(hf_models):
    """The model casts every weight to its compute dtype where it uses it (norms and the
    unembedding included), so at bfloat16 compute a replica holding the bfloat16 rounding
    of float32 weights samples the same tokens with the same log-probs, bit for bit: the
    default `rollout.weight_dtype` (the compute dtype) costs no accuracy. Every weight,
    norms included, is perturbed off the bfloat16 grid first, so a weight used uncast shows."""
    from rljax.models import load_hf
    from rljax.rollout import Sampler, SamplingParams

    from .conftest import random_prompts, sampler_config

    model = load_hf(hf_models["llama"][1], compute_dtype="bfloat16")
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(3)
    state = jax.tree.map(lambda x: jnp.asarray(np.asarray(x) * (1 + 0.01 * rng.normal(size=x.shape)) + 1e-3,
                                               np.float32), state)
    (half,) = hand_off(state, ReplicaLayout.create(jax.devices()[:1], tensor_parallel_size=1), dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(half)} == {jnp.dtype(jnp.bfloat16)}
    prompts = random_prompts([5, 9, 14], seed=7)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=11)
    results = []
    for weights in (state, half):
        with Sampler(nnx.merge(graphdef, weights), sampler_config(num_pages=64)) as sampler:
            results.append(sampler.generate(prompts, params))
    full, cast = results
    assert [c.token_ids for c in cast] == [c.token_ids for c in full]
    assert [c.log_probs for c in cast] == [c.log_probs for c in full]
