"""The shared train step: exact micro-batching, skipped non-finite steps, sharded equality."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rljax.algos.aggregation import AggTerms
from rljax.models import ModelConfig, init_model
from rljax.parallel import MeshConfig, make_mesh, shard_local_batch, state_shardings
from rljax.train.objectives import sft_objective
from rljax.train.steps import init_train_state, make_train_step

CONFIG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     qkv_bias=True)


def sft_batch(seed=0, batch=8, length=16):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, 64, (batch, length)).astype(np.int32)
    lengths = rng.randint(4, length + 1, batch)
    attn = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    loss_mask = attn.astype(np.float32)
    loss_mask[:, :3] = 0  # "prompt"
    return {"input_ids": ids, "segment_ids": attn, "positions": np.clip(attn.cumsum(1) - 1, 0, None).astype(np.int32),
            "loss_mask": loss_mask}


def run_step(num_micro, mesh=None, batch=None, objective=None):
    model = init_model(CONFIG, seed=0)
    graphdef, params = nnx.split(model)
    # SGD with lr 1: the parameter change *is* the gradient, so equal params mean equal
    # gradients (Adam's g/sqrt(v) would amplify float noise of near-zero gradients).
    opt, sched = optax.sgd(1.0), optax.constant_schedule(1.0)
    batch = batch or sft_batch()
    if mesh is not None:
        shardings = state_shardings(params, mesh)
        params = jax.device_put(params, shardings)
        state = init_train_state(params, opt)
        step = make_train_step(graphdef, objective or sft_objective(), opt, sched, num_micro)
        batch = shard_local_batch(batch, mesh)
    else:
        state = init_train_state(params, opt)
        step = make_train_step(graphdef, objective or sft_objective(), opt, sched, num_micro)
    state, metrics = step(state, batch, None, None)
    return jax.device_get(state), jax.device_get(metrics)


def flat(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.mark.slow
def test_micro_batches_equal_whole_batch():
    whole, m1 = run_step(1)
    split, m4 = run_step(4)
    np.testing.assert_allclose(m4["train/loss"], m1["train/loss"], rtol=1e-6)
    np.testing.assert_allclose(m4["train/grad_norm"], m1["train/grad_norm"], rtol=1e-5)
    for a, b in zip(flat(split.params), flat(whole.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # a mean of micro-batch means would differ: rows have different token counts
    assert m1["train/loss_denominator"] == sft_batch()["loss_mask"].sum()


@pytest.mark.slow
@pytest.mark.parametrize("layout", [dict(fsdp=8), dict(data=2, fsdp=4), dict(data=2, fsdp=2, tensor=2)])
def test_sharded_step_equals_single_device(layout):
    single, m1 = run_step(2)
    mesh = make_mesh(MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, **layout}))
    sharded, m8 = run_step(2, mesh=mesh)
    np.testing.assert_allclose(m8["train/loss"], m1["train/loss"], rtol=1e-5)
    for a, b in zip(flat(sharded.params), flat(single.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_non_finite_step_is_skipped_and_counted():
    def objective(model, batch, frozen, totals, key):
        terms, metrics = sft_objective()(model, batch, frozen, totals, key)
        return AggTerms(terms.numerator * batch["scale"][0], terms.denominator), metrics

    batch = {**sft_batch(), "scale": np.full((8,), np.inf, np.float32)}
    before = flat(nnx.split(init_model(CONFIG, seed=0))[1])
    state, metrics = run_step(2, batch=batch, objective=objective)
    assert int(state.skipped_steps) == 1 and int(state.step) == 1
    for a, b in zip(flat(state.params), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("num_micro", [1, 4])
def test_per_row_outputs_come_back_in_the_batch_order(num_micro):
    """An objective's `ROWS` metrics (one value per row of its micro-batch) come back for
    the whole mini-batch, row i where row i was, whatever the micro-batch split; scalar
    metrics are still means."""
    from rljax.train.steps import ROWS

    def objective(model, batch, frozen, totals, key):
        loss = sft_objective()(model, batch, frozen, totals, key)[0]
        tag = batch["input_ids"][:, 0].astype(np.float32) * 10 + batch["input_ids"][:, 1]  # [b], unique per row
        return loss, {f"{ROWS}tag": tag, f"{ROWS}ids": batch["input_ids"], "mean_tag": tag.mean()}

    batch = sft_batch()
    _, metrics = run_step(num_micro, batch=batch, objective=objective)
    np.testing.assert_array_equal(metrics[f"{ROWS}ids"], batch["input_ids"])
    np.testing.assert_array_equal(metrics[f"{ROWS}tag"], batch["input_ids"][:, 0] * 10.0 + batch["input_ids"][:, 1])
    assert metrics["mean_tag"].shape == ()
