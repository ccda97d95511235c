"""Mesh layout: sharded init, optimizer-state sharding, per-device bytes, activation
constraints and the start-up errors for layouts that do not divide."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from rljax.models import ModelConfig, init_model
from rljax.parallel import (MeshConfig, ShardingError, constrain, gather_weight, make_mesh, measured_bytes, shard_local_batch,
                            sharded_init, state_shardings)

CONFIG = ModelConfig(model_type="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     qkv_bias=True)


def mesh_of(**layout):
    return make_mesh(MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, **layout}))


@pytest.mark.slow  # compiles the sharded init of configs/sft_tiny.yaml (~8 s of CPU)
def test_sharded_init_params_and_optimizer_bytes_per_device_are_an_eighth_under_fsdp8(tiny_fsdp8):
    _, mesh, state = tiny_fsdp8
    # born in the layout of the rules table
    for leaf, sharding in zip(jax.tree.leaves(state.params), jax.tree.leaves(state_shardings(state.params, mesh))):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    per_device = measured_bytes((state.params, state.opt_state))
    total = sum(x.nbytes for x in jax.tree.leaves((state.params, state.opt_state)))
    assert len(per_device) == 8
    print({d.id: b for d, b in per_device.items()}, "total", total)
    for nbytes in per_device.values():
        assert abs(nbytes - total / 8) <= 0.1 * total / 8
    # AdamW's moments are split exactly like their parameters
    mu = state.opt_state[1][0].mu
    for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(mu)):
        assert m.sharding.is_equivalent_to(p.sharding, p.ndim)


def test_tensor_parallel_specs_follow_the_rules():
    mesh = mesh_of(data=2, fsdp=2, tensor=2)
    specs = state_shardings(nnx.state(nnx.eval_shape(lambda: init_model(CONFIG))), mesh)
    assert specs["layers"]["q_proj"].get_value().spec == P(None, "fsdp", "tensor", None)  # [L, embed, heads, D]
    assert specs["layers"]["o_proj"].get_value().spec == P(None, "tensor", None, "fsdp")  # [L, heads, D, embed]
    assert specs["layers"]["down_proj"].get_value().spec == P(None, "tensor", "fsdp")  # [L, mlp, embed]
    assert specs["embed"].get_value().spec == P("tensor", "fsdp")  # [vocab, embed]


def test_layout_that_does_not_divide_fails_naming_tensor_size_and_mesh():
    bad = ModelConfig(model_type="qwen2", vocab_size=128, hidden_size=36, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=9)
    mesh = mesh_of(fsdp=8)
    with pytest.raises(ShardingError) as err:
        sharded_init(lambda: init_model(bad), mesh)  # before any memory is allocated
    msg = str(err.value)
    assert "'embed'" in msg and "36" in msg and "fsdp=8" in msg
    assert msg.split(":")[0] in ("embed", "lm_head") or msg.startswith("layers/")  # the tensor's path
    # kv heads over tensor=4: 2 kv heads cannot be split four ways
    with pytest.raises(ShardingError, match=r"layers/k_(bias|proj): dimension 'kv_heads' of size 2 .*tensor=4"):
        state_shardings(nnx.state(nnx.eval_shape(lambda: init_model(CONFIG))), mesh_of(data=2, tensor=4))


def test_batch_that_does_not_divide_fails_naming_batch_size_and_mesh():
    mesh = mesh_of(data=2, fsdp=4)
    batch = {"input_ids": np.zeros((6, 4), np.int32)}
    with pytest.raises(ShardingError, match=r"batch\['input_ids'\] of size 6 .* data-parallel size 8 .*data=2, fsdp=4"):
        shard_local_batch(batch, mesh)
    with pytest.raises(ShardingError, match=r"needs 4 devices, 8 are available"):
        mesh_of(data=2, fsdp=2)


def test_constrain_is_a_noop_without_a_mesh_and_pins_the_layout_with_one():
    x = jnp.ones((8, 4, 6))
    assert constrain(x, ("batch", "length", "act_embed")) is x
    mesh = mesh_of(data=2, fsdp=2, tensor=2)
    f = jax.jit(lambda a: constrain(a * 2, ("batch", "length", "heads")))
    with jax.set_mesh(mesh):
        out = f(jnp.ones((8, 4, 6)))
    assert out.sharding.spec == P(("data", "fsdp"), None, "tensor")
    # a dimension that does not divide stays replicated instead of failing
    with jax.set_mesh(mesh):
        odd = jax.jit(lambda a: constrain(a + 1, ("batch", "length", "heads")))(jnp.ones((8, 4, 5)))
    assert odd.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"), None, None)), 3)
    # FSDP weights are all-gathered over fsdp for use; tensor-parallel splits stay
    w = jnp.ones((64, 4, 16))
    assert gather_weight(w, ("embed", "heads", "head_dim")) is w  # no mesh: no-op
    with jax.set_mesh(mesh):
        used = jax.jit(lambda a: gather_weight(a * 1, ("embed", "heads", "head_dim")))(w)
    assert used.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "tensor", None)), 3)


def test_processes_agree_on_the_longest_sequence_length():
    """Two processes bucketed their own rows to 32 and 48 tokens: both pad to 48, with
    zeros (padding in every mask), and leave per-row arrays alone."""
    import numpy as np

    from rljax.parallel import agree_lengths

    mine = {"input_ids": np.ones((2, 32), np.int32), "attention_mask": np.ones((2, 32), np.int32),
            "group_ids": np.arange(2, dtype=np.int32)}
    theirs = np.array([48, 48], np.int32)  # the other process's lengths, same keys in the same order
    out = agree_lengths(mine, allgather=lambda local: np.stack([local, theirs]))
    assert out["input_ids"].shape == out["attention_mask"].shape == (2, 48)
    assert (out["attention_mask"][:, 32:] == 0).all() and (out["input_ids"][:, :32] == 1).all()
    assert out["group_ids"] is mine["group_ids"]
    same = agree_lengths(mine, allgather=lambda local: np.stack([local, np.array([16, 16], np.int32)]))
    assert same["input_ids"].shape == (2, 32)  # the longest is ours: nothing to pad


def test_activation_block_is_a_devices_share_under_the_active_mesh():
    from rljax.parallel import activation_block

    logits = (64, 112, 49152)
    axes = ("batch", "length", "vocab")
    assert activation_block(logits, axes) == logits  # no mesh: the whole array
    with jax.set_mesh(mesh_of(data=2, fsdp=2, tensor=2)):
        assert activation_block(logits, axes) == (16, 112, 24576)  # rows over data x fsdp, vocab over tensor
        assert activation_block((3, 112, 49151), axes) == (3, 112, 49151)  # what does not divide stays whole
