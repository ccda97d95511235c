"""The MoE load-balancing loss against transformers' `load_balancing_loss_func`, a
hand-computed case, and the decoder's in-scan statistics against the aux_loss
transformers' Qwen3-MoE reports; the router's gradient is finite and not zero."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from rljax.algos.router_loss import load_balancing_loss, load_balancing_loss_from_logits
from rljax.models import load_hf
from tests.models.hf_fixtures import build_hf_model, padded_batch


def test_hand_case():
    """X = 2, k = 1. Tokens with p = (3/4, 1/4) both choose expert 0: f = (1, 0),
    P = (3/4, 1/4), L = 2 * 3/4 = 1.5. Tokens (3/4, 1/4) and (1/4, 3/4): f = P = (1/2, 1/2),
    L = 2 * (1/4 + 1/4) = 1; masking the second token out leaves the first case: 1.5."""
    a, b = [math.log(3.0), 0.0], [0.0, math.log(3.0)]
    same = jnp.asarray([[[a, a]]])  # [L=1, B=1, T=2, X=2]
    mixed = jnp.asarray([[[a, b]]])
    np.testing.assert_allclose(load_balancing_loss_from_logits(same, 1), 1.5, rtol=1e-6)
    np.testing.assert_allclose(load_balancing_loss_from_logits(mixed, 1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(load_balancing_loss_from_logits(mixed, 1, jnp.asarray([[1, 0]])), 1.5, rtol=1e-6)


def test_matches_transformers_load_balancing_loss_func():
    rng = np.random.RandomState(0)
    layers, b, t, x, k = 3, 2, 5, 8, 2
    logits = rng.randn(layers, b, t, x).astype(np.float32)
    mask = np.ones((b, t), np.int64)
    mask[1, 3:] = 0
    for m in (None, mask):
        ref = load_balancing_loss_func(tuple(torch.tensor(logits[i].reshape(b * t, x)) for i in range(layers)), x, k,
                                       None if m is None else torch.tensor(m))
        ours = load_balancing_loss_from_logits(jnp.asarray(logits), k, None if m is None else jnp.asarray(m))
        np.testing.assert_allclose(float(ours), float(ref), rtol=1e-5)


@pytest.mark.slow
def test_decoder_routing_statistics_give_transformers_aux_loss(tmp_path):
    hf_model = build_hf_model("qwen3_moe", seed=1)
    hf_model.save_pretrained(tmp_path)
    ids, mask = padded_batch(seed=3)
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                       position_ids=torch.tensor(np.clip(mask.cumsum(1) - 1, 0, None)), output_router_logits=True)
    model = load_hf(str(tmp_path))
    _, routing = model.hidden_states_and_routing(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    assert routing.experts.shape == (3, 12, 2, 2)  # [B, T, L, k]
    aux = load_balancing_loss(routing.counts, routing.prob_sum, mask.sum() * 2)
    np.testing.assert_allclose(float(aux), float(out.aux_loss), rtol=1e-5)

    graphdef, state = nnx.split(model)

    def aux_of(state):
        _, r = nnx.merge(graphdef, state).hidden_states_and_routing(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
        return load_balancing_loss(r.counts, r.prob_sum, mask.sum() * 2)

    grad = jax.grad(aux_of)(state)["layers"]["router"][...]  # [L, E, X]
    assert np.all(np.isfinite(np.asarray(grad))) and float(jnp.abs(grad).max()) > 0
