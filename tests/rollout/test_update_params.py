"""update_params: the sampler samples with the trainer's arrays from the next step on,
on device (same buffers when the layout matches, moved / cast when not), without
recompiling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.rollout import SamplingParams

from .conftest import random_prompts, training_log_probs


def leaves(state):
    return jax.tree.leaves(state)


def same_buffers(a, b) -> list[bool]:
    return [x.unsafe_buffer_pointer() == y.unsafe_buffer_pointer() for x, y in zip(leaves(a), leaves(b))]


def test_update_params_swaps_weights_without_recompiling(llama, roomy_sampler):
    prompts = random_prompts([6, 10], seed=30)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    before = roomy_sampler.generate(prompts, greedy)
    compiled = roomy_sampler.num_compiled_programs

    graphdef, original = nnx.split(llama)
    # Another model of the same shape: the layers in reverse order, the vocabulary permuted.
    state = jax.tree.map(lambda a: jnp.flip(a, 0) if a.ndim > 1 else a, original)
    other = nnx.merge(graphdef, state)
    roomy_sampler.update_params(state)
    # Same layout: the sampler holds the trainer's very buffers.
    assert all(same_buffers(roomy_sampler.engine.state, state))
    after = roomy_sampler.generate(prompts, greedy)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    for c, ref in zip(after, training_log_probs(other, after)):  # the new weights are the ones used
        np.testing.assert_allclose(c.log_probs, ref, atol=1e-5)

    # A state on another device, in bfloat16: moved and cast on device.
    moved = jax.tree.map(lambda a: jax.device_put(a.astype(jnp.bfloat16), jax.devices()[1]), nnx.state(llama))
    roomy_sampler.update_params(moved)
    for a in leaves(roomy_sampler.engine.state):
        assert a.dtype == jnp.float32 and a.sharding == leaves(nnx.state(llama))[0].sharding

    roomy_sampler.update_params(llama, copy=True)  # a Decoder works too; copy=True copies
    assert not any(same_buffers(roomy_sampler.engine.state, nnx.state(llama)))
    again = roomy_sampler.generate(prompts, greedy)
    assert [c.token_ids for c in again] == [c.token_ids for c in before]
    assert roomy_sampler.num_compiled_programs == compiled
    with pytest.raises(ValueError, match="does not match"):
        roomy_sampler.update_params({"embed": jnp.zeros(3)})


@pytest.mark.slow  # a second sampler, over a mesh: its own prefill and decode compiles
def test_sampler_over_a_mesh_matches_single_device(llama, roomy_sampler):
    """Parameters sharded over a mesh (tensor = 2): the pools follow the mesh (kv heads
    over "tensor") and the tokens are the single-device ones."""
    from rljax.parallel import MeshConfig, make_mesh, state_shardings
    from rljax.rollout import Sampler

    mesh = make_mesh(MeshConfig(fsdp=1, tensor=2), devices=jax.devices()[:2])
    graphdef, state = nnx.split(llama)
    shardings = jax.tree.map(lambda v: v.get_value(), state_shardings(state, mesh),
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
    sharded = nnx.merge(graphdef, jax.device_put(state, shardings))
    prompts = random_prompts([5, 9, 14], seed=40)
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    want = roomy_sampler.generate(prompts, params)
    with Sampler(sharded, roomy_sampler.config) as sampler:
        got = sampler.generate(prompts, params)
        assert sampler.engine.device.pool.kv.sharding.spec[3] == "tensor"  # [L, P, S, 2K, D]: kv heads
        assert sampler.num_compiled_programs == 2
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    np.testing.assert_allclose([c.log_probs for c in got], [c.log_probs for c in want], atol=1e-5)
