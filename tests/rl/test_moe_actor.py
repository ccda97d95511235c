"""The actor objective on a tiny mixture-of-experts model: the load-balancing term
(`actor.router_aux_loss_coef`) adds coef * L_aux with L_aux from a direct forward, moves
the router's gradient (finite), and the whole update is the same with the experts split
over an 8-way fsdp mesh (expert parallelism) as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rljax.algos.router_loss import load_balancing_loss
from rljax.models import ModelConfig, init_model
from rljax.parallel import MeshConfig, make_mesh, shard_local_batch, state_shardings
from rljax.rl.config import ActorConfig
from rljax.rl.actor_critic import ActorBatch, actor_objective
from rljax.train.steps import init_train_state, make_train_step
from tests.rl.test_actor_objective import CONFIG as DENSE, actor_batch

MOE = ModelConfig(model_type="qwen3_moe", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, qk_norm=True, num_experts=8,
                  num_experts_per_tok=2, moe_intermediate_size=8, norm_topk_prob=True, initializer_range=0.3)


def one_step(actor, mesh=None, config=MOE):
    graphdef, params = nnx.split(init_model(config, seed=0))
    objective, totals = actor_objective(actor, 1.0)
    step = make_train_step(graphdef, objective, optax.sgd(1.0), optax.constant_schedule(1.0), 1, totals_fn=totals)
    batch = actor_batch()
    if mesh is None:
        return jax.device_get(step(init_train_state(params, optax.sgd(1.0)), ActorBatch(**batch), None, None))
    with jax.set_mesh(mesh):
        params = jax.device_put(params, state_shardings(params, mesh))
        gate = params["layers"]["expert_gate"][...]
        assert gate.sharding.shard_shape(gate.shape)[1] == 8 // mesh.shape["fsdp"]  # experts split
        return jax.device_get(step(init_train_state(params, optax.sgd(1.0)), ActorBatch(**shard_local_batch(batch, mesh)),
                                   None, None))


@pytest.mark.slow
def test_load_balancing_term_in_the_actor_loss():
    coef = 0.5
    _, plain = one_step(ActorConfig())
    state, metrics = one_step(ActorConfig(router_aux_loss_coef=coef))
    batch = actor_batch()
    _, routing = init_model(MOE, seed=0).hidden_states_and_routing(
        jnp.asarray(batch["input_ids"]), attention_mask=jnp.asarray(batch["attention_mask"]))
    aux = load_balancing_loss(routing.counts, routing.prob_sum, batch["attention_mask"].sum() * 2)
    np.testing.assert_allclose(metrics["actor/router_aux_loss"], aux, rtol=1e-5)
    np.testing.assert_allclose(plain["actor/router_aux_loss"], aux, rtol=1e-5)  # reported at coef 0 too
    np.testing.assert_allclose(metrics["train/loss"] - plain["train/loss"], coef * aux, rtol=1e-4)
    # SGD(lr=1): the parameter change is minus the gradient; the router's moved, and is finite
    router0 = np.asarray(init_model(MOE, seed=0).layers.router[...])
    moved = router0 - np.asarray(state.params["layers"]["router"])
    assert np.all(np.isfinite(moved)) and np.abs(moved).max() > 0


def test_dense_model_with_router_aux_loss_is_refused():
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.1.*not a mixture of experts"):
        # traced, not compiled: the objective refuses while the step is traced
        jax.eval_shape(lambda: one_step(ActorConfig(router_aux_loss_coef=0.1), config=DENSE))


@pytest.mark.slow
@pytest.mark.parametrize("mesh_config", [MeshConfig(fsdp=8), MeshConfig(data=2, fsdp=2, tensor=2)])
def test_expert_parallel_update_equals_one_device(mesh_config):
    actor = ActorConfig(router_aux_loss_coef=0.1, use_kl_loss=True)
    single_state, single = one_step(actor)
    state, metrics = one_step(actor, make_mesh(mesh_config))
    for key in ("train/loss", "actor/pg_loss", "actor/router_aux_loss", "actor/kl_loss", "train/grad_norm"):
        np.testing.assert_allclose(metrics[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(single_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.slow
def test_expert_parallel_dispatch_in_row_chunks_equals_one_device(monkeypatch):
    """Rows that would gather more than MAX_GATHERED_TOKENS go through in chunks
    (`lax.map`): same outputs and gradients as one device."""
    import rljax.models.moe as moe

    keys = jax.random.split(jax.random.key(1), 5)
    h = jax.random.normal(keys[0], (16, 3, 8))  # 16 rows: 2 per device on fsdp = 8
    gate, up = (0.5 * jax.random.normal(k, (8, 8, 4)) for k in keys[1:3])
    down = 0.5 * jax.random.normal(keys[3], (8, 4, 8))
    w, ex, _ = moe.route(h, jax.random.normal(keys[4], (8, 8)), 2, renormalise=False)

    def loss(h, gate, up, down):
        return jnp.sum(moe.expert_parallel_dispatch(h, w, ex, gate, up, down) ** 2)

    want = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(h, gate, up, down)
    monkeypatch.setattr(moe, "MAX_GATHERED_TOKENS", 8 * 3)  # one row per device per gather: 2 chunks
    mesh = make_mesh(MeshConfig(fsdp=8))
    with jax.set_mesh(mesh):
        text = str(jax.make_jaxpr(loss)(h, gate, up, down))
        assert "shard_map" in text and "scan" in text  # expert parallel, in chunks
        got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(h, gate, up, down)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    # 3 rows do not divide over fsdp: every device takes all rows, partial sums meet in a psum
    h3, w3, ex3 = h[:3], w[:3], ex[:3]
    for mesh_config in (MeshConfig(fsdp=8), MeshConfig(fsdp=4, tensor=2)):
        with jax.set_mesh(make_mesh(mesh_config)):
            got = jax.jit(lambda *a: moe.expert_parallel_dispatch(h3, w3, ex3, *a))(gate, up, down)
        np.testing.assert_allclose(np.asarray(got), np.asarray(moe.dispatch(h3, w3, ex3, gate, up, down)), atol=1e-5)
