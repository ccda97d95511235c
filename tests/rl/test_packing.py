"""Sequence packing for the actor update (`rljax.rl.packing`): the placement, hand-computed;
pack / unpack moving every token and nothing else; when packing is exact
(`packs_sequences`); and a packed update equal to the unpacked one (parameters, losses,
the old log-probs it returns) while running fewer micro-batches."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.config import load_config
from rljax.models import ModelConfig, init_model
from rljax.parallel import MeshConfig, make_mesh
from rljax.rl.actor_critic import ActorBatch, actor_objective, packs_sequences
from rljax.rl.batch import StepBatch, take
from rljax.rl.config import ActorConfig, PolicyLossConfig, RLConfig, RolloutCorrectionConfig
from rljax.rl.learner import make_learner
from rljax.models.attention import branch_mask
from rljax.rl.packing import pack, pack_rows, plan_packing, row_factor, row_prompts, unpack


def right_padded(lengths, length):
    return (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(np.int32)


def placement(packing):
    """(packed row, first column, segment) of each source row's first token."""
    (src_row, src_col), (dst_row, dst_col) = packing.source, packing.dest
    first = src_col == 0
    order = np.argsort(src_row[first])
    return dst_row[first][order], dst_col[first][order], packing.segment[first][order]


def test_first_fit_decreasing_placement_by_hand():
    # sorted: 7 (row 6), 6 (4), 5 (0), 4 (2), 3 (1), 2 (3), 2 (7), 1 (5); rows of 8 tokens:
    # bin 0 = 7 + 1, bin 1 = 6 + 2, bin 2 = 5 + 3, bin 3 = 4 + 2
    packing = plan_packing(right_padded([5, 3, 4, 2, 6, 1, 7, 2], 8), micro_rows=2)
    # bin j: micro-batch j // 2, slot j % 2; packed row = slot * 4 micro-batches + micro-batch
    bins_to_rows = {0: 0, 1: 4, 2: 1, 3: 5}
    expected_bin = [2, 2, 3, 1, 1, 0, 0, 3]
    row, start, segment = placement(packing)
    np.testing.assert_array_equal(row, [bins_to_rows[b] for b in expected_bin])
    np.testing.assert_array_equal(start, [0, 5, 0, 6, 0, 7, 0, 4])
    np.testing.assert_array_equal(segment, [1, 2, 1, 2, 1, 2, 1, 2])
    assert packing.micro_batches == 2  # of 4: rows 2, 3, 6, 7 (micro-batches 2 and 3) stay empty


def test_rows_twice_as_long_hold_any_two_sequences_by_hand():
    # rows of 16: bin 0 = 7 + 6 + 3, bin 1 = 5 + 4 + 2 + 2 + 1; both in micro-batch 0 (2 packed rows)
    packing = plan_packing(right_padded([5, 3, 4, 2, 6, 1, 7, 2], 8), micro_rows=4, factor=2)
    assert packing.shape == (4, 16) and packing.source_shape == (8, 8)
    row, start, segment = placement(packing)
    np.testing.assert_array_equal(row, [2, 0, 2, 2, 0, 2, 0, 2])  # bin 1: slot 1 -> row 1 * 2 + 0
    np.testing.assert_array_equal(start, [0, 13, 5, 9, 7, 13, 0, 11])
    np.testing.assert_array_equal(segment, [1, 3, 2, 3, 2, 5, 1, 4])
    assert packing.micro_batches == 1  # of 2


def test_row_factor_keeps_whole_packed_rows_per_device():
    assert row_factor(micro_rows=16, devices=1) == 2
    assert row_factor(micro_rows=8, devices=4) == 2
    assert row_factor(micro_rows=4, devices=4) == 1  # one row per device: no room to pair


@pytest.mark.parametrize("factor", [1, 2])
def test_pack_moves_every_token_and_unpack_brings_it_back(factor):
    rng = np.random.RandomState(0)
    rows, length = 32, 12
    lengths = rng.randint(2, length + 1, rows)
    mask = right_padded(lengths, length)
    view = ActorBatch(
        input_ids=rng.randint(1, 50, (rows, length)) * mask, attention_mask=mask,
        response_mask=(rng.rand(rows, length) < 0.5) * mask.astype(np.float32), old_log_probs=None,
        advantages=rng.randn(rows, length).astype(np.float32) * mask,
        expert_ids=np.where(mask[..., None, None] > 0, rng.randint(0, 4, (rows, length, 2, 2)), -1))
    packing = plan_packing(mask, micro_rows=4 * factor, devices=2, factor=factor)
    packed = pack(view, packing)
    seg = packed.segment_ids
    assert packed.input_ids.shape == (rows // factor, length * factor)
    np.testing.assert_array_equal(packed.attention_mask, (seg > 0).astype(np.int32))
    assert (packed.expert_ids[seg == 0] == -1).all()  # packed padding routes as the router would
    for name in ("input_ids", "response_mask", "advantages"):
        np.testing.assert_array_equal(unpack(getattr(packed, name), packing), getattr(view, name) * mask)
    np.testing.assert_array_equal(unpack(packed.expert_ids, packing)[mask > 0], view.expert_ids[mask > 0])
    # each sequence is contiguous, numbered within its row, its positions 0, 1, ...
    row, start, segment = placement(packing)
    for i in range(rows):
        r, s, n = row[i], start[i], lengths[i]
        assert (seg[r, s : s + n] == segment[i]).all()
        np.testing.assert_array_equal(packed.positions[r, s : s + n], np.arange(n))
    assert packed.branch_ids is None  # no shared prompts asked
    # the filled rows sit in the first micro-batches (rows m, M + m, ...), half on each device
    num_micro, packed_rows = rows // (4 * factor), rows // factor
    filled = np.flatnonzero(seg.any(axis=1))
    assert set(filled % num_micro) == set(range(packing.micro_batches))
    assert packing.micro_batches == -(-len(filled) // 4) < num_micro
    per_device = [(filled < packed_rows // 2).sum(), (filled >= packed_rows // 2).sum()]
    assert abs(per_device[0] - per_device[1]) <= 1


def test_samples_of_one_prompt_share_it_by_hand():
    """Rows 0 and 2: prompt [5, 6, 7] and responses [8, 9] and [10]; row 1 another prompt.
    The packed row: the prompt's first 2 tokens once, then each sample from the prompt's
    last token on as a branch (longest first), then row 1 as its own segment."""
    ids = np.array([[5, 6, 7, 8, 9, 0, 0, 0], [5, 6, 4, 3, 0, 0, 0, 0], [5, 6, 7, 10, 0, 0, 0, 0],
                    [0] * 8], np.int32)
    mask = right_padded([5, 4, 4, 0], 8)
    response = np.zeros((4, 8), np.float32)
    response[0, 3:5] = response[1, 3] = response[2, 3] = 1
    view = ActorBatch(input_ids=ids, attention_mask=mask, response_mask=response, old_log_probs=None,
                      advantages=response * 2)
    groups = row_prompts(ids, response)
    assert sorted(groups) == [[0, 2], [1], [3]]
    packed, packing = pack_rows(view, micro_rows=4, devices=1, factor=2, share_prompts=True)
    assert packed.input_ids.shape == (2, 16) and packing.micro_batches == 1
    np.testing.assert_array_equal(packed.input_ids[0], [5, 6, 7, 8, 9, 7, 10, 5, 6, 4, 3, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(packed.segment_ids[0], [1] * 7 + [2] * 4 + [0] * 5)
    np.testing.assert_array_equal(packed.branch_ids[0], [0, 0, 1, 1, 1, 2, 2] + [0] * 9)
    np.testing.assert_array_equal(packed.positions[0], [0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3] + [0] * 5)
    np.testing.assert_array_equal(packed.advantages[0], [0, 0, 0, 2, 2, 0, 2] + [0, 0, 0, 2] + [0] * 5)
    assert not packed.segment_ids[1].any()
    # the second sample's tokens see the prompt's first two tokens and their own branch only
    visible = np.asarray(branch_mask(packed.segment_ids, packed.branch_ids))[0]
    np.testing.assert_array_equal(np.flatnonzero(visible[6]), [0, 1, 5, 6])
    np.testing.assert_array_equal(np.flatnonzero(visible[4]), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(np.flatnonzero(visible[10]), [7, 8, 9, 10])
    # every source token comes back, the shared ones to each of their rows
    np.testing.assert_array_equal(unpack(packed.input_ids, packing), ids)


def test_rows_differing_before_their_response_or_in_routing_do_not_share():
    ids = np.array([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 4], [1, 2, 3, 6]], np.int32)
    response = np.array([[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 1]], np.float32)
    assert sorted(row_prompts(ids, response)) == [[0, 1], [2], [3]]  # row 3's response starts earlier
    routing = np.zeros((4, 4, 1, 1), np.int32)
    routing[1, 0] = 1
    assert sorted(row_prompts(ids, response, routing)) == [[0], [1], [2], [3]]
    assert sorted(row_prompts(ids, np.zeros_like(response))) == [[0], [1], [2], [3]]  # no response: alone


def test_a_prompt_whose_samples_overflow_a_row_is_split_repeating_it():
    ids = np.tile(np.arange(1, 9, dtype=np.int32), (4, 1))  # prompt of 4, responses of 4: 4 + 4 x 5 > 16
    response = np.zeros((4, 8), np.float32)
    response[:, 4:] = 1
    view = ActorBatch(input_ids=ids, attention_mask=right_padded([8] * 4, 8), response_mask=response,
                      old_log_probs=None, advantages=response)
    packed, packing = pack_rows(view, micro_rows=4, devices=1, factor=2, share_prompts=True)
    # two items of 3 + 5 + 5 = 13 tokens: one per row (13 + 13 > 16)
    np.testing.assert_array_equal((packed.segment_ids > 0).sum(axis=1), [13, 13])
    np.testing.assert_array_equal(packed.input_ids[0, :13], [1, 2, 3, 4, 5, 6, 7, 8, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(unpack(packed.input_ids, packing), ids)


def test_a_row_with_a_gap_is_refused():
    mask = right_padded([3, 4], 6)
    mask[1, 1] = 0
    with pytest.raises(ValueError, match="row 1 is not right-padded"):
        plan_packing(mask, micro_rows=1)


@pytest.mark.parametrize("actor, correction, packs", [
    (ActorConfig(), RolloutCorrectionConfig(), True),  # token-mean PPO clip
    (ActorConfig(pack_sequences=False), RolloutCorrectionConfig(), False),
    (ActorConfig(loss_agg_mode="seq-mean-token-mean"), RolloutCorrectionConfig(), False),
    (ActorConfig(policy_loss=PolicyLossConfig(loss_mode="gspo")), RolloutCorrectionConfig(), False),  # its own mode
    (ActorConfig(policy_loss=PolicyLossConfig(loss_mode="clip_cov")), RolloutCorrectionConfig(), False),  # batch stats
    (ActorConfig(policy_loss=PolicyLossConfig(loss_mode="cispo"), use_kl_loss=True, entropy_coeff=0.01),
     RolloutCorrectionConfig(), True),
    (ActorConfig(), RolloutCorrectionConfig(bypass_mode=True, rollout_is="token", rollout_is_threshold=2.0), True),
    (ActorConfig(), RolloutCorrectionConfig(bypass_mode=True, rollout_is="sequence", rollout_is_threshold=2.0), False),
    (ActorConfig(), RolloutCorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0), True),  # decoupled
])
def test_packing_only_where_the_loss_is_the_same(actor, correction, packs):
    assert packs_sequences(actor, correction) is packs


VOCAB = 40
CONFIG = ModelConfig(model_type="qwen2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def step_batch(rows=16, length=16, seed=0):
    """4 prompts of 3-5 tokens, 4 samples each, responses of 1-7: rows of 4-12 of 16
    positions (the KL loss reads ref_log_probs: also at the shared prompt's positions,
    where each row has its own values and the loss none)."""
    rng = np.random.RandomState(seed)
    prompt, response = np.repeat(rng.randint(3, 6, rows // 4), 4), rng.randint(1, 8, rows)
    mask = right_padded(prompt + response, length)
    response_mask = (mask * (np.arange(length)[None] >= prompt[:, None])).astype(np.float32)
    input_ids = rng.randint(1, VOCAB, (rows, length))
    input_ids[:, :5] = np.repeat(rng.randint(1, VOCAB, (rows // 4, 5)), 4, axis=0)  # a group's prompt
    zeros = np.zeros((rows, length), np.float32)
    base = -np.log(VOCAB)
    return StepBatch(
        input_ids=(input_ids * mask).astype(np.int32), attention_mask=mask,
        response_mask=response_mask, rollout_log_probs=zeros, token_level_scores=zeros,
        group_ids=np.repeat(np.arange(rows // 4), 4).astype(np.int32),
        ref_log_probs=((base + 0.3 * rng.randn(rows, length)) * mask).astype(np.float32),
        advantages=(rng.randn(rows, length) * response_mask).astype(np.float32))


def test_shared_prompts_hold_each_prompt_once_per_segment():
    """Each packed segment is a prompt's first P - 1 tokens once, then samples of that prompt
    from its last prompt token on; every sample is in exactly one segment."""
    batch = step_batch()
    view = take(ActorBatch, batch)
    prompt = np.argmax(batch.response_mask > 0, axis=1)  # P per row
    packed, packing = pack_rows(view, micro_rows=4, devices=2, factor=2, share_prompts=True)
    source_row = np.full(packed.input_ids.shape, -1)
    source_row[packing.dest] = packing.source[0]  # a shared token: one of its group's rows
    samples, segments, prefix_tokens = 0, 0, 0
    for row in range(packed.input_ids.shape[0]):
        for seg in set(packed.segment_ids[row][packed.segment_ids[row] > 0]):
            cols = np.flatnonzero(packed.segment_ids[row] == seg)
            branches = packed.branch_ids[row, cols]
            group = source_row[row, cols[0]] // 4
            p = prompt[4 * group]
            np.testing.assert_array_equal(cols[branches == 0] - cols[0], np.arange(p - 1))  # the prompt, once, first
            np.testing.assert_array_equal(packed.input_ids[row, cols[:p - 1]], batch.input_ids[4 * group, :p - 1])
            assert (source_row[row, cols[branches > 0]] // 4 == group).all()  # samples of that prompt only
            samples += len(set(branches[branches > 0]))
            segments += 1
            prefix_tokens += p - 1
    assert samples == 16 and segments < 16
    tails = int((batch.attention_mask.sum(1) - prompt + 1).sum())
    assert int((packed.segment_ids > 0).sum()) == tails + prefix_tokens < int(batch.attention_mask.sum())
    np.testing.assert_array_equal(unpack(packed.input_ids, packing), batch.input_ids)


@pytest.mark.slow
@pytest.mark.parametrize("old_given, share, micro", [(False, False, 2), (True, False, 2), (False, True, 2),
                                                    (True, True, 2), (False, True, 4)])
def test_a_packed_update_equals_the_unpacked_one(old_given, share, micro):
    """16 rows, micro-batches of `micro` rows per device on data=2: 4 (2) micro-batches
    unpacked; packed into rows twice as long, fewer of them run. Same parameters after the
    step, same losses, same old log-probs."""
    cfg = load_config(RLConfig, None, ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
                                       f"actor.ppo_micro_batch_size_per_device={micro}", "trainer.total_steps=1",
                                       "actor.optim.lr=1e-2", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.5",
                                       "actor.entropy_coeff=0.1"])
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=1), jax.devices()[:2])
    batch = step_batch()
    if old_given:
        rng = np.random.RandomState(1)
        batch = dataclasses.replace(batch, old_log_probs=(batch.ref_log_probs + 0.2 * rng.randn(*batch.input_ids.shape)
                                                          * batch.response_mask).astype(np.float32))
    objective, totals = actor_objective(cfg.actor, 1.0, cfg.algorithm.rollout_correction)
    assert packs_sequences(cfg.actor, cfg.algorithm.rollout_correction)
    results = {}
    for packed in (False, True):
        learner = make_learner(init_model(CONFIG, seed=0), cfg.actor.optim, objective, totals, cfg, mesh, 4, micro,
                               1, False, ActorBatch, 0, "actor", pack=packed, share_prompts=share)
        assert learner.pack_factor == (2 if packed else 0)
        assert learner.share_prompts == (packed and share)
        metrics, per_row = learner.update(batch, mesh, np.random.default_rng(0))
        results[packed] = metrics, per_row, [np.asarray(x) for x in jax.tree.leaves(learner.state.params)]
    (m0, r0, p0), (m1, r1, p1) = results[False], results[True]
    assert m0["actor/micro_batches"] == 8 // micro and m1["actor/micro_batches"] < 8 // micro
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-6, err_msg=key)
    if old_given:
        assert m0["actor/pg_clipfrac"] > 0  # the clip binds: the ratio enters
        assert not r0 and not r1
    else:
        mask = batch.response_mask > 0
        np.testing.assert_allclose(r1["old_log_probs"][mask], r0["old_log_probs"][mask], atol=1e-5)
    for a, b in zip(p1, p0):  # Adam's first step is lr * g / |g| per element: 1e-5 is 0.1% of it
        np.testing.assert_allclose(a, b, atol=1e-5)
    initial = jax.tree.leaves(nnx.split(init_model(CONFIG, seed=0))[1])
    assert max(np.abs(a - np.asarray(b)).max() for a, b in zip(p1, initial)) > 1e-4  # the step moved them
