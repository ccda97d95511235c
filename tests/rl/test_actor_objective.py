"""The RL actor objective through the shared train step: the same update whole, in
micro-batches and on a data x fsdp mesh for every loss_agg_mode (policy + KL + entropy);
Clip-Cov's random selection drawn from the state's RNG per step; the exact full-vocabulary
KL against a direct unchunked computation; rollout-correction weights and rejections as
the objective applies them, against hand computations."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rljax.algos.kl import kl_from_hidden
from rljax.models import ModelConfig, init_model
from rljax.parallel import MeshConfig, make_mesh, shard_local_batch, state_shardings
from rljax.rl.config import ActorConfig, PolicyLossConfig, RolloutCorrectionConfig
from rljax.rl.actor_critic import ActorBatch, actor_objective
from rljax.train.steps import init_train_state, make_train_step

VOCAB = 32
CONFIG = ModelConfig(model_type="qwen2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def actor_batch(seed=0, rows=8, length=12):
    """Rows of different lengths, a 3-token prompt, old / ref log-probs near a random
    model's (about -log V) so that the PPO clip binds on some tokens."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(5, length + 1, rows)
    attn = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    response = attn.astype(np.float32)
    response[:, :3] = 0
    base = -np.log(VOCAB)
    return {
        "input_ids": rng.randint(0, VOCAB, (rows, length)).astype(np.int32),
        "attention_mask": attn,
        "response_mask": response,
        "old_log_probs": ((base + 0.3 * rng.randn(rows, length)) * response).astype(np.float32),
        "ref_log_probs": ((base + 0.3 * rng.randn(rows, length)) * response).astype(np.float32),
        "advantages": (rng.randn(rows, length) * response).astype(np.float32),
    }


def make_step(actor, num_micro, correction=None):
    """The jitted actor step with SGD(lr=1): the parameter change is the gradient."""
    graphdef, _ = nnx.split(init_model(CONFIG, seed=0))
    objective, totals = actor_objective(actor, 1.0, correction)
    return make_train_step(graphdef, objective, optax.sgd(1.0), optax.constant_schedule(1.0), num_micro,
                           totals_fn=totals)


def one_step(actor, num_micro, mesh=None, batch=None, frozen=None, state=None, correction=None, step=None):
    _, params = nnx.split(init_model(CONFIG, seed=0))
    batch = batch or actor_batch()
    if mesh is not None:
        params = jax.device_put(params, state_shardings(params, mesh))
        batch = shard_local_batch(batch, mesh)
        if frozen is not None:
            frozen = jax.device_put(frozen, state_shardings(frozen, mesh))
    batch = ActorBatch(**batch)
    state = state if state is not None else init_train_state(params, optax.sgd(1.0))
    step = step or make_step(actor, num_micro, correction)
    new_state, metrics = step(state, batch, frozen, None)
    return jax.device_get(new_state), jax.device_get(metrics)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_same_update(a, b, atol):
    (sa, ma), (sb, mb) = a, b
    # metrics are O(1): an absolute tolerance (pg_loss is a sum of +-A terms, it can be near 0)
    for key in ("train/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        np.testing.assert_allclose(ma[key], mb[key], rtol=1e-5, atol=2e-6)
    for x, y in zip(leaves(sa.params), leaves(sb.params)):
        np.testing.assert_allclose(x, y, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_actor_update_is_the_same_whole_in_micro_batches_and_sharded(mode):
    actor = ActorConfig(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="low_var_kl",
                        entropy_coeff=0.1, loss_scale_factor=12.0 if mode == "seq-mean-token-sum-norm" else None)
    whole = one_step(actor, 1)
    assert whole[1]["actor/pg_clipfrac"] > 0  # the clip binds somewhere: the test covers it
    assert_same_update(one_step(actor, 4), whole, atol=2e-6)
    mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1))
    assert_same_update(one_step(actor, 2, mesh=mesh), whole, atol=1e-5)


@pytest.mark.slow
def test_a_zero_entropy_coefficient_leaves_the_entropy_out_of_the_backward():
    """With entropy_coeff 0 the entropy is a metric: the same value, and the compiled step
    holds no gradient of it (on a 4k vocabulary, the chunked log-probs' backward then keeps
    two [B, chunk, V] float32 buffers fewer: at least one full [B, T, V] block less here)."""
    vocab, rows, length = 4096, 8, 12
    config = dataclasses.replace(CONFIG, vocab_size=vocab)
    graphdef, params = nnx.split(init_model(config, seed=0))
    batch = ActorBatch(**{k: jnp.asarray(v) for k, v in actor_batch(rows=rows, length=length).items()})
    state = init_train_state(params, optax.sgd(1.0))

    def run(coeff):
        objective, totals = actor_objective(ActorConfig(entropy_coeff=coeff), 1.0)
        step = make_train_step(graphdef, objective, optax.sgd(1.0), optax.constant_schedule(1.0), 1, totals_fn=totals)
        compiled = step.lower(state, batch, None, None).compile()
        _, metrics = compiled(jax.tree.map(jnp.array, state), batch, None, None)
        return compiled.memory_analysis().temp_size_in_bytes, float(metrics["actor/entropy"])

    (temp_off, entropy_off), (temp_on, entropy_on) = run(0.0), run(1e-3)
    assert entropy_off == pytest.approx(entropy_on, rel=1e-6) and entropy_off > 1.0
    assert temp_on - temp_off >= rows * length * vocab * 4


@pytest.mark.slow
def test_clip_cov_selection_is_drawn_per_step_from_the_state_rng():
    """Clip-Cov detaches a random subset of tokens: with ratio 0.5 and a covariance window
    that admits every token, half of them. The subset must change from step to step (a
    fixed key would repeat it) and be a function of the TrainState (so a resumed run,
    which restores rng and step, draws the same)."""
    actor = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="clip_cov", clip_cov_ratio=0.5,
                                                      clip_cov_lb=-1e9, clip_cov_ub=1e9), clip_ratio=10.0)
    batch = actor_batch()
    _, params = nnx.split(init_model(CONFIG, seed=0))
    state = init_train_state(params, optax.sgd(1.0), seed=3)
    copy = lambda s: jax.tree.map(jnp.array, s)  # noqa: E731  (the step donates its input)
    step = make_step(actor, 1)
    at0, m0 = one_step(actor, 1, batch=batch, state=copy(state), step=step)
    again, _ = one_step(actor, 1, batch=batch, state=copy(jax.device_put(jax.device_get(state))), step=step)
    at5, m5 = one_step(actor, 1, batch=batch, state=copy(state.replace(step=jnp.asarray(5, jnp.int32))), step=step)
    assert 0.3 < m0["actor/pg_clipfrac"] < 0.7 and 0.3 < m5["actor/pg_clipfrac"] < 0.7  # ~half detached
    for x, y in zip(leaves(at0.params), leaves(again.params)):
        np.testing.assert_array_equal(x, y)  # same state (restored from host copies): same selection
    assert any(not np.allclose(x, y) for x, y in zip(leaves(at0.params), leaves(at5.params)))
    other_seed = state.replace(rng=jax.random.key_data(jax.random.key(4)))
    at0_seed4, _ = one_step(actor, 1, batch=batch, state=copy(other_seed), step=step)
    assert any(not np.allclose(x, y) for x, y in zip(leaves(at0.params), leaves(at0_seed4.params)))


# ---- the exact full-vocabulary KL ------------------------------------------------------


def direct_full_kl(hidden, unembed, ref_hidden, ref_unembed, temperature):
    """Straight from the definition on full [B, T, V] logits, aligned to input_ids."""
    log_p = jax.nn.log_softmax(hidden @ unembed / temperature, axis=-1)
    log_q = jax.nn.log_softmax(ref_hidden @ ref_unembed / temperature, axis=-1)
    kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
    return jnp.pad(kl[:, :-1], ((0, 0), (1, 0)))


@pytest.mark.slow
def test_full_kl_in_chunks_equals_the_direct_computation_value_and_gradient():
    rng = np.random.RandomState(0)
    b, t, h, v = 3, 11, 8, 40
    hidden, ref_hidden = (jnp.asarray(rng.randn(b, t, h), jnp.float32) for _ in range(2))
    unembed, ref_unembed = (jnp.asarray(rng.randn(h, v) * 0.5, jnp.float32) for _ in range(2))
    weights = jnp.asarray(rng.rand(b, t), jnp.float32)

    def loss(fn, hid, w):
        return jnp.sum(fn(hid, w, ref_hidden, ref_unembed) * weights)

    chunked = lambda *a: kl_from_hidden(*a, temperature=0.7, chunk_size=4)  # noqa: E731  (3 chunks, one padded)
    direct = lambda *a: direct_full_kl(*a, 0.7)  # noqa: E731
    kl = jax.jit(chunked)(hidden, unembed, ref_hidden, ref_unembed)
    np.testing.assert_allclose(kl, direct(hidden, unembed, ref_hidden, ref_unembed), rtol=1e-5, atol=1e-6)
    assert float(kl[:, 0].max()) == 0.0 and float(kl.min()) >= -1e-6
    g_chunked = jax.jit(jax.grad(lambda hid, w: loss(chunked, hid, w), argnums=(0, 1)))(hidden, unembed)
    g_direct = jax.grad(lambda hid, w: loss(direct, hid, w), argnums=(0, 1))(hidden, unembed)
    for a, b_ in zip(g_chunked, g_direct):
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-6)
    # KL(p || p) = 0
    np.testing.assert_allclose(kl_from_hidden(hidden, unembed, hidden, unembed, chunk_size=4), 0.0, atol=1e-6)


@pytest.mark.slow
def test_full_kl_loss_in_the_actor_objective_matches_the_direct_kl_and_splits_exactly():
    """kl_loss_type=full: the KL term is the direct [B, T, V] KL against the frozen
    reference (params perturbed from the policy's), token-mean over response tokens; the
    update with 2 micro-batches equals the whole one."""
    actor = ActorConfig(use_kl_loss=True, kl_loss_type="full", kl_loss_coef=1.0)
    model = init_model(CONFIG, seed=0)
    _, params = nnx.split(model)
    reference = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)),
                             params)
    batch = actor_batch()
    ref_model = nnx.merge(nnx.graphdef(model), reference)
    ids, attn = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
    kl = direct_full_kl(model.hidden_states(ids, attn), model.unembedding(), ref_model.hidden_states(ids, attn),
                        ref_model.unembedding(), 1.0)
    expected = float(jnp.sum(kl * batch["response_mask"]) / batch["response_mask"].sum())
    whole = one_step(actor, 1, batch=batch, frozen=reference)
    np.testing.assert_allclose(whole[1]["actor/kl_loss"], expected, rtol=1e-5)
    np.testing.assert_allclose(whole[1]["train/loss"], whole[1]["actor/pg_loss"] + expected, rtol=1e-5)
    assert_same_update(one_step(actor, 2, batch=batch, frozen=reference), whole, atol=2e-6)


# ---- rollout correction in the objective -----------------------------------------------


def model_log_probs(batch):
    return np.asarray(init_model(CONFIG, seed=0).token_log_probs(batch["input_ids"], batch["attention_mask"]))


@pytest.mark.slow
def test_decoupled_is_weights_multiply_the_policy_gradient_term():
    """old_log_probs = the model's own (ratio 1, vanilla PPO: per-token loss -A), so the
    policy term is -sum(w A m) / sum(m) with the batch's weights, by hand."""
    batch = actor_batch()
    batch["old_log_probs"] = model_log_probs(batch) * batch["response_mask"]
    w = (np.random.RandomState(1).rand(*batch["response_mask"].shape) * 2).astype(np.float32)
    batch["rollout_is_weights"] = w * batch["response_mask"]
    _, metrics = one_step(ActorConfig(), 1, batch=batch)
    m, adv = batch["response_mask"], batch["advantages"]
    np.testing.assert_allclose(metrics["actor/pg_loss"], -(w * adv * m).sum() / m.sum(), rtol=1e-5)


@pytest.mark.slow
def test_bypass_reinforce_weights_and_rejection_from_the_current_policy():
    """Bypass mode, loss_type=reinforce, token IS truncated at 1.5, token_k1 rejection
    "0.5_1.6" (verl: bounds on exp(k1) = 1/rho): rho = pi_theta / pi_rollout from the current
    model; the loss is -sum(min(rho, 1.5) A log pi m_kept) / sum(m) (denominator: the
    unrejected tokens)."""
    batch = actor_batch()
    logp = model_log_probs(batch)
    m = batch["response_mask"]
    log_rho = np.random.RandomState(2).choice([-1.0, -0.3, 0.0, 0.3, 0.6], size=m.shape).astype(np.float32)
    batch["old_log_probs"] = ((logp - log_rho) * m).astype(np.float32)  # the sampler's, in bypass mode
    corr = RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce", rollout_is="token",
                                    rollout_is_threshold=1.5, rollout_rs="token_k1", rollout_rs_threshold="0.5_1.6")
    _, metrics = one_step(ActorConfig(), 1, batch=batch, correction=corr)
    rho = np.exp(log_rho)
    kept = m * (1 / rho >= 0.5) * (1 / rho <= 1.6)  # rho = e^-1 is rejected, e^0.6 is kept
    expected = -(np.minimum(rho, 1.5) * batch["advantages"] * logp * kept).sum() / m.sum()
    np.testing.assert_allclose(metrics["actor/pg_loss"], expected, rtol=1e-4)
    np.testing.assert_allclose(metrics["rollout_corr/rollout_rs_masked_fraction"], 1 - kept.sum() / m.sum(),
                               rtol=1e-5)
    assert 0 < kept.sum() < m.sum()


def test_rollout_correction_config_errors():
    from rljax.config import ConfigError, load_config
    from rljax.rl.config import RLConfig

    bad = [["algorithm.rollout_correction.rollout_is=tokens"],
           ["algorithm.rollout_correction.rollout_is_threshold=0"],
           ["algorithm.rollout_correction.rollout_rs=token_k1"],  # no threshold
           ["algorithm.rollout_correction.rollout_rs=token_k9", "algorithm.rollout_correction.rollout_rs_threshold=2"],
           ["algorithm.rollout_correction.rollout_token_veto_threshold=2"],
           ["algorithm.rollout_correction.loss_type=reinforce"],  # bypass only
           ["algorithm.rollout_correction.rollout_is_mode=clip"],
           ["algorithm.rollout_correction.rollout_rs_threshold_lower=0.5"],  # verl's older key: unknown
           ["actor.tis_imp_ratio_cap=2.0"],  # replaced, with a message naming the new keys
           ["actor.kl_loss_type=ful"], ["algorithm.kl_penalty=k4"]]
    for overrides in bad:
        with pytest.raises(ConfigError):
            load_config(RLConfig, None, overrides)
    cfg = load_config(RLConfig, None, ["algorithm.rollout_correction.rollout_rs=seq_mean_k3,token_k1",
                                       "algorithm.rollout_correction.rollout_rs_threshold=0.01,0.5_2.0",
                                       "actor.kl_loss_type=full", "algorithm.kl_penalty=full"])
    assert cfg.algorithm.rollout_correction.enabled
    assert not dataclasses.replace(cfg.algorithm.rollout_correction, rollout_rs=None,
                                   rollout_rs_threshold=None).enabled
