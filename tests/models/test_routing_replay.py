"""Routing replay in the MoE layer (`rljax.models.moe.replay_routing`) and the decoder
(`expert_ids`): hand-computed weights, -1 fallback, router gradients, dense refusal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models import ModelConfig, init_model
from rljax.models.moe import replay_routing, route


def test_replay_by_hand():
    """Logits (1, 3, 2, 0): own top-2 {1, 2}; token 0 replays {0, 3}, token 1 has no record."""
    router = jnp.eye(4)  # logits = h
    h = jnp.asarray([[[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]]])  # [1, 2, 4]
    p = np.exp([1.0, 3.0, 2.0, 0.0]) / np.exp([1.0, 3.0, 2.0, 0.0]).sum()
    replay = jnp.asarray([[[3, 0], [-1, -1]]], jnp.int32)  # [1, 2, k=2]
    for renormalise in (False, True):
        w, experts, probs = route(h, router, 2, renormalise)
        w, experts = replay_routing(probs, experts, replay, renormalise)
        assert experts.tolist() == [[[3, 0], [1, 2]]]
        s0 = p[3] + p[0] if renormalise else 1.0  # w_j = p_j / sum_S p  or  p_j
        s1 = p[1] + p[2] if renormalise else 1.0
        np.testing.assert_allclose(np.asarray(w)[0], [[p[3] / s0, p[0] / s0], [p[1] / s1, p[2] / s1]], rtol=1e-6)


def test_replayed_weights_give_the_router_gradients():
    """d/dlogits of sum(w) at replayed experts {0, 3} without renormalisation: p_j (1[j in S] - sum_S p)."""
    logits = jnp.asarray([1.0, 3.0, 2.0, 0.0])
    replay = jnp.asarray([[[0, 3]]], jnp.int32)

    def total(z):
        h = z[None, None, :]
        _, experts, probs = route(h, jnp.eye(4), 2, False)
        return replay_routing(probs, experts, replay, False)[0].sum()

    p = np.exp(logits) / np.exp(logits).sum()
    chosen = np.asarray([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(jax.jit(jax.grad(total))(logits), p * (chosen - (p[0] + p[3])), rtol=1e-5, atol=1e-7)


MOE = dict(model_type="qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, initializer_range=0.2)


@pytest.mark.slow
def test_decoder_replaying_its_own_routing_is_the_plain_forward():
    model = init_model(ModelConfig.from_hf_dict(MOE), seed=1)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 7)), jnp.int32)
    hidden, routing = model.hidden_states_and_routing(ids)
    assert routing.experts.shape == (2, 7, 2, 2)
    same = model.hidden_states(ids, expert_ids=routing.experts)
    np.testing.assert_allclose(same, hidden, atol=1e-6)
    none = model.hidden_states(ids, expert_ids=jnp.full_like(routing.experts, -1))  # no record anywhere
    np.testing.assert_allclose(none, hidden, atol=1e-6)
    other = jnp.where(jnp.arange(7)[None, :, None, None] == 3, (routing.experts + 1) % 8, -1)  # token 3 only
    moved, used = model.hidden_states_and_routing(ids, expert_ids=other)
    np.testing.assert_array_equal(used.experts[:, 3], (routing.experts[:, 3] + 1) % 8)
    diff = np.abs(np.asarray(moved - hidden)).max(axis=-1)  # [B, T]
    assert (diff[:, :3] < 1e-6).all() and (diff[:, 3:] > 1e-4).all()  # causal: from token 3 on


def test_expert_ids_refused_for_a_dense_model():
    config = ModelConfig.from_hf_dict({k: v for k, v in MOE.items() if k not in (
        "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob")} | {"model_type": "qwen3"})

    def replayed_forward():
        dense = init_model(config)
        return dense.hidden_states(jnp.zeros((1, 3), jnp.int32), expert_ids=jnp.zeros((1, 3, 2, 2), jnp.int32))

    with pytest.raises(ValueError, match="routing replay needs a mixture-of-experts model"):
        jax.eval_shape(replayed_forward)  # traced, not compiled: the refusal comes before any computation
