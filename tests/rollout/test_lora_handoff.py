"""Adapter-only weight sync: when only the LoRA adapters changed since the last hand-off,
only they move; each replica keeps its copy of the base (the same buffers), and every
value is the source's."""

import jax
import numpy as np
import pytest

from rljax.models import init_model
from rljax.models.lora import LoRAConfig, add_adapters, join, split_trainable
from rljax.parallel import MeshConfig, make_mesh, state_shardings
from rljax.rollout.handoff import HandOffCache, timed_hand_off
from rljax.rollout.replicas import ReplicaLayout
from tests.tiny_models import TWO_LAYER_QWEN2


def buffers(tree) -> set[int]:
    return {s.data.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards}


@pytest.mark.slow
def test_only_changed_adapters_are_handed_off_again():
    config = TWO_LAYER_QWEN2
    decoder = init_model(config)
    add_adapters(decoder, LoRAConfig(rank=2, target_modules=["q_proj", "down_proj"]))
    mesh = make_mesh(MeshConfig(fsdp=8))
    adapters, base = split_trainable(decoder)
    base = jax.device_put(base, state_shardings(base, mesh))
    adapters = jax.device_put(adapters, state_shardings(adapters, mesh))
    layout = ReplicaLayout.create(jax.devices(), tensor_parallel_size=2)
    cache = HandOffCache()
    first, _ = timed_hand_off(join(adapters, base), layout, cache=cache)

    new_adapters = jax.tree.map(lambda x: x + 1.0, adapters)  # an update: new arrays for the adapters only
    second, report = timed_hand_off(join(new_adapters, base), layout, cache=cache)
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(new_adapters))
    assert 0 < max(report.allocated_bytes.values()) <= adapter_bytes  # per device: at most the adapters; no base
    for old, new in zip(first, second):
        old_adapters, old_base = split_trainable(decoder, old)
        new_adapters_r, new_base = split_trainable(decoder, new)
        assert buffers(new_base) == buffers(old_base)  # the replica's base copy, kept
        assert not buffers(new_adapters_r) & buffers(old_adapters)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_adapters_r), jax.device_get(new_adapters))
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_base), jax.device_get(base))

    full = jax.tree.map(lambda x: x * 1.0, join(new_adapters, base))  # full fine-tuning: every leaf new
    third, report = timed_hand_off(full, layout, cache=cache)
    assert not buffers(third) & buffers(second)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(third[0]), jax.device_get(full))
