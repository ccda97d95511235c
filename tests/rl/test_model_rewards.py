"""A reward model and a generative verifier as the RL reward (`reward.reward_model`,
`reward.verifier`).

- `load_hf_reward_model`: an RM exported with `save_hf` reloads bit-identically (tied and
  untied embeddings) and scores like transformers' `AutoModelForSequenceClassification`
  on a right-padded batch; directories that are not one-label sequence-classification
  checkpoints are named in the error.
- Reward sources without any model: rule / RM / verifier scores combine as configured,
  a data_source with no rule scores 0 instead of failing, a verdict becomes the reward
  through `generate_and_score`.
- One tiny GRPO step with `reward.reward_model.enable`: `token_level_scores` are the RM's
  scores of the sampled `prompt + response` ids (recomputed with transformers); then the
  policy grades its own samples as a self-verifier.

Tiny models with few distinct shapes: on CPU every new shape is a compile.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForSequenceClassification

from rljax.config import ConfigError, from_dict
from rljax.data.tokenizer import build_char_tokenizer
from rljax.models import CheckpointMismatchError, ModelConfig, init_model, load_hf_reward_model, save_hf
from rljax.models.heads import ScalarHeadModel
from rljax.rewards import GenerativeVerifier, parse_yes_no
from rljax.rewards.manager import RewardManager
from rljax.rewards.sources import Combine, FunctionSource, RewardBatch, RewardModelSource, RewardSources, VerifierSource
from rljax.rl.batch import Sample, build_batch
from rljax.rl.config import RLConfig, RewardModelConfig, VerifierConfig
from rljax.rl.model_rewards import build_model_rewards
from rljax.rl.scoring import generate_and_score
from rljax.rl.trainer import RLTrainer
from rljax.rollout.params import Completion, SamplingParams
from tests.rl.test_rl_train import capture_batches, make_config
from tests.tiny_models import CHAR_VOCAB, char_qwen2

VOCAB = CHAR_VOCAB  # the RM shares the policy's vocabulary in the RL test


def rm_config(tied: bool) -> ModelConfig:
    return char_qwen2(tied)


def random_rm(tied: bool, seed: int = 0) -> ScalarHeadModel:
    """A random RM whose norms and biases are perturbed too, so every tensor matters (numpy
    noise: no program to compile per parameter shape)."""
    model = ScalarHeadModel(init_model(rm_config(tied), seed=seed), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed + 1)
    noisy = lambda x: jnp.asarray(np.asarray(x) + 0.05 * rng.normal(size=x.shape).astype(x.dtype))  # noqa: E731
    nnx.update(model, jax.tree.map(noisy, nnx.state(model)))
    return model


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory, tok):
    """{tied: (original model, exported dir)}; exported with the char tokenizer."""
    out = {}
    for tied in (True, False):
        model = random_rm(tied, seed=int(tied))
        path = str(tmp_path_factory.mktemp("rm_tied" if tied else "rm_untied"))
        save_hf(model, path, tokenizer=tok)
        out[tied] = (model, path)
    return out


@nnx.jit
def _scores(model, ids, mask):
    return model(ids, mask)


def right_padded(seed: int = 0, lengths=(12, 7, 3), width: int = 12):
    """Token ids in [1, VOCAB) (never the pad id 0), right-padded with 0."""
    rng = np.random.RandomState(seed)
    ids = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), np.int32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.randint(1, VOCAB, n)
        mask[i, :n] = 1
    return ids, mask


def hf_scores(hf_model, ids, mask=None) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                       attention_mask=None if mask is None else torch.tensor(mask, dtype=torch.long))
    return out.logits[:, 0].float().numpy()


# ---- the loader ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_exported_rm_reloads_bit_identically_and_matches_transformers(rm_dirs, tied):
    model, path = rm_dirs[tied]
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["architectures"] == ["Qwen2ForSequenceClassification"]
    loaded = load_hf_reward_model(path)
    assert isinstance(loaded, ScalarHeadModel) and not hasattr(loaded.backbone, "lm_head")
    ours = dict(jax.tree_util.tree_leaves_with_path(nnx.state(loaded)))
    for key, value in jax.tree_util.tree_leaves_with_path(nnx.state(model)):
        if "lm_head" not in jax.tree_util.keystr(key):
            assert np.array_equal(np.asarray(ours[key]), np.asarray(value)), jax.tree_util.keystr(key)
    ids, mask = right_padded()
    before = np.asarray(_scores(model, jnp.asarray(ids), jnp.asarray(mask)))
    after = np.asarray(_scores(loaded, jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_array_equal(after, before)  # bit-identical

    hf_model, info = AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf_model.config.num_labels == 1 and hf_model.config.pad_token_id == 0
    ref = hf_scores(hf_model.eval(), ids, mask)
    print(f"tied={tied}: max |score diff| vs transformers = {np.abs(after - ref).max():.3g}")
    np.testing.assert_allclose(after, ref, atol=1e-5, rtol=1e-5)


def test_loader_names_what_is_not_a_reward_model(rm_dirs, tmp_path):
    _, path = rm_dirs[True]
    causal = str(tmp_path / "causal")
    save_hf(init_model(rm_config(True)), causal)
    with pytest.raises(CheckpointMismatchError, match=r"causal/config\.json: architectures \['Qwen2ForCausalLM'\]"):
        load_hf_reward_model(causal)

    def variant(name, config_edit=None, tensors_edit=None, src=path):
        out = tmp_path / name
        out.mkdir()
        config = json.load(open(os.path.join(src, "config.json")))
        tensors = load_file(os.path.join(src, "model.safetensors"))
        if config_edit:
            config_edit(config)
        if tensors_edit:
            tensors_edit(tensors)
        (out / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(out / "model.safetensors"))
        return str(out)

    two = variant("two_labels", lambda c: c.update(id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1}))
    with pytest.raises(CheckpointMismatchError, match=r"two_labels/config\.json: num_labels=2"):
        load_hf_reward_model(two)
    no_score = variant("no_score", tensors_edit=lambda t: t.pop("score.weight"))
    with pytest.raises(CheckpointMismatchError, match=r"no_score/model\.safetensors: no tensor score\.weight"):
        load_hf_reward_model(no_score)
    wide = variant("wide", lambda c: (c.pop("id2label"), c.pop("label2id")),
                   lambda t: t.update({"score.weight": np.zeros((2, 32), np.float32)}))
    with pytest.raises(CheckpointMismatchError, match=r"wide/model\.safetensors: tensor score\.weight has shape \(2,"):
        load_hf_reward_model(wide)
    # untied: an LM head in a reward-model checkpoint is unexpected (tied: ignored, as load_hf does)
    extra = variant("extra", tensors_edit=lambda t: t.update({"lm_head.weight": np.zeros((VOCAB, 32), np.float32)}),
                    src=rm_dirs[False][1])
    with pytest.raises(CheckpointMismatchError, match=r"unexpected tensors \['lm_head\.weight'\]"):
        load_hf_reward_model(extra)


# ---- config --------------------------------------------------------------------------------


def rl_config(reward: dict) -> RLConfig:
    return from_dict(RLConfig, {"model": {"tokenizer": "char"}, "reward": reward})


def test_config_sections_and_errors(rm_dirs, tmp_path, tok):
    cfg = rl_config({"reward_model": {"enable": True, "path": "/nowhere/rm", "combine": "add", "weight": 0.5},
                     "verifier": {"enable": False, "parse": "score"}})
    assert cfg.reward.reward_model == RewardModelConfig(enable=True, path="/nowhere/rm", combine="add", weight=0.5)
    assert cfg.reward.verifier.path == "policy" and cfg.reward.verifier.parse == "score"
    assert build_model_rewards(rl_config({}), tok) == []  # neither enabled: the rule source alone
    with pytest.raises(ConfigError, match=r"reward\.reward_model\.path='/nowhere/rm': no such directory"):
        build_model_rewards(cfg, tok)
    with pytest.raises(ConfigError, match=r"unknown config key 'reward\.reward_model\.pth'; did you mean 'path'"):
        rl_config({"reward_model": {"pth": "x"}})
    with pytest.raises(ConfigError, match=r"reward\.verifier\.parse: expected one of \['yes_no', 'score'\]"):
        rl_config({"verifier": {"parse": "json"}})
    with pytest.raises(ConfigError, match=r"reward\.reward_model\.combine"):
        rl_config({"reward_model": {"combine": "multiply"}})
    causal = str(tmp_path / "causal")
    save_hf(init_model(rm_config(True)), causal)
    with pytest.raises(ConfigError, match=r"reward\.reward_model\.path='.*causal'.*ForCausalLM"):
        build_model_rewards(rl_config({"reward_model": {"enable": True, "path": causal}}), tok)
    with pytest.raises(ConfigError, match=r"reward\.verifier\.path='/nowhere/judge': no such directory"):
        build_model_rewards(rl_config({"verifier": {"enable": True, "path": "/nowhere/judge"}}), tok)
    with_agent = build_model_rewards(from_dict(RLConfig, {"agent": {"max_turns": 2}, "reward": {
        "reward_model": {"enable": True, "path": rm_dirs[True][1]}}}), tok)  # agent rollouts score with it too
    assert [(type(source), how) for source, how in with_agent] == [(RewardModelSource, Combine("replace", 1.0))]
    with_agent[0][0].close()


# ---- combination, without models ------------------------------------------------------------


class LengthScorer:
    """A fake reward model: the score is the sequence length / 10."""

    def __init__(self):
        self.seqs, self.chats = [], []

    def score(self, seqs):
        self.seqs += [list(s) for s in seqs]
        return np.asarray([len(s) / 10 for s in seqs], np.float32)

    def score_messages(self, chats):
        self.chats += chats
        return np.asarray([len(c[-1]["content"]) / 10 for c in chats], np.float32)


def items_and_samples():
    items = [{"data_source": "synthetic/arithmetic", "solution_str": "7", "ground_truth": "7", "extra_info": {}},
             {"data_source": "synthetic/arithmetic", "solution_str": "8", "ground_truth": "7", "extra_info": {}},
             {"data_source": "my/judged_only", "solution_str": "abc", "ground_truth": None, "extra_info": {}}]
    samples = [Sample([1, 2, 3], [9] * n, [1] * n, [0.0] * n, group_id=0) for n in (1, 2, 5)]
    return items, samples


def test_rule_and_reward_model_scores_combine():
    items, samples = items_and_samples()
    batch = RewardBatch(items, [s.prompt_ids + s.response_ids for s in samples])
    with RewardManager(mode="inline") as manager:
        rule_source = FunctionSource(manager, zero_where_no_rule=True)
        rule = rule_source.score(batch)  # no error for the unregistered data_source
        assert rule.scores.tolist() == [1.0, 0.0, 0.0] and rule.extras["acc"] == [True, False, None]
        scorer = LengthScorer()
        replace = RewardSources([(rule_source, Combine()),
                                 (RewardModelSource(scorer), Combine("replace", 2.0))]).score(batch)
        assert scorer.seqs == [[1, 2, 3, 9], [1, 2, 3, 9, 9], [1, 2, 3, 9, 9, 9, 9, 9]]  # prompt + response ids
        np.testing.assert_allclose(replace.scores, [0.8, 1.0, 1.6], rtol=1e-6)
        assert replace.extras["acc"] == [True, False, None]
        np.testing.assert_allclose(replace.extras["reward_model_score"], [0.4, 0.5, 0.8], rtol=1e-6)
        assert replace.metrics["reward_model/score/mean"] == pytest.approx(1.7 / 3)
        add = RewardSources([(rule_source, Combine()),
                             (RewardModelSource(LengthScorer()), Combine("add", 0.5))]).score(batch)
        np.testing.assert_allclose(add.scores, [1.2, 0.25, 0.4], rtol=1e-6)
        # an RM with its own vocabulary: each chat is re-rendered (raw prompt + decoded response)
        other = LengthScorer()
        raw = [[{"role": "user", "content": "3+4="}]] * 3
        RewardSources([(rule_source, Combine()), (RewardModelSource(other, reuses_ids=False), Combine())]).score(
            RewardBatch(items, batch.sequences, raw))
        assert other.chats[2] == [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "abc"}]


class Judge:
    """Scripted verifier model: "Yes" when the graded answer equals the reference."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, prompts):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            answer, truth = text.split("A=")[1].split(";")[0], text.split("R=")[1].split(";")[0]
            reply = "Yes" if answer == truth else ("No" if answer else "hmm")
            out.append(self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id])
        return out


def test_verifier_verdict_is_the_reward(tok, caplog, monkeypatch):
    monkeypatch.setattr("rljax.rewards.registry._WARNED_UNSCORED", set())  # a fresh process's state
    prompts = {"prompt_ids": [[5, 6], [7]], "data_source": ["my/judged_only"] * 2, "ground_truth": ["12", "5"],
               "extra_info": [{"question": "5+7="}, {}], "raw_prompt": [[{"role": "user", "content": "5+7="}],
                                                                          [{"role": "user", "content": "2+3="}]]}
    answers = [["12", "13"], ["5", ""]]
    encode = lambda s: list(tok.encode(s, add_special_tokens=False)) + [tok.eos_token_id]  # noqa: E731

    def generate(prompt_ids, params):
        return [Completion(i, k, list(p), encode(answers[i][k]), [-0.5] * len(encode(answers[i][k])), "stop")
                for i, p in enumerate(prompt_ids) for k in range(params.n)]

    verifier = GenerativeVerifier(Judge(tok), tok, "Q={question}; A={answer}; R={ground_truth};")
    cfg = rl_config({})
    with RewardManager(mode="inline") as manager:
        rewards = RewardSources([(FunctionSource(manager, zero_where_no_rule=True), Combine()),
                                 (VerifierSource(verifier), Combine("add", 2.0))])
        rollout = generate_and_score(generate, rewards, tok, prompts, SamplingParams(n=2, max_tokens=8), cfg, 10)
    assert [s.score for s in rollout.samples] == [2.0, 0.0, 2.0, 0.0]  # no rule applies: 0 + 2 x verdict
    # ... which is said once, loudly, not silently
    assert len([r for r in caplog.records if "NO REWARD FUNCTION for data_source 'my/judged_only'"
                in r.getMessage()]) == 1
    assert [r["verifier_output"] for r in rollout.records] == ["Yes", "No", "Yes", "hmm"]
    assert rollout.metrics["verifier/parse_failures"] == 1.0  # "hmm" scores the failure score 0
    batch = build_batch(rollout.samples, 8, 16)
    assert batch.token_level_scores[0].tolist() == [0] * 4 + [2.0] + [0] * 3  # on the last response token
    assert [s.group_id for s in rollout.samples] == [10, 10, 11, 11]


def test_sampler_generate_fn_skips_prompts_too_long_for_the_verdict():
    from types import SimpleNamespace

    from rljax.rl.model_rewards import sampler_generate_fn

    class Echo:
        config = SimpleNamespace(max_model_len=10)

        def generate(self, prompts, params):
            assert params.temperature == 0.0 and params.max_tokens == 4 and params.n == 1
            return [Completion(i, 0, p, [len(p)], [0.0], "stop") for i, p in enumerate(prompts)]

    generate = sampler_generate_fn(Echo(), max_tokens=4)
    assert generate([[1] * 6, [1] * 7, [1] * 2]) == [[6], [], [2]]  # 7 + 4 > 10: not sent, no verdict


# ---- one RL step -----------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_step_rewards_are_reward_model_scores(tmp_path, rm_dirs, tok):
    _, rm_path = rm_dirs[False]  # untied: the loaded backbone has no lm_head
    cfg = make_config(tmp_path, "trainer.total_steps=1", "data.train_batch_size=2", "rollout.n=4",
                      "actor.ppo_mini_batch_size=2", "actor.optim.lr=1e-2", "reward.reward_model.enable=true",
                      f"reward.reward_model.path={rm_path}", "reward.reward_model.batch_size=8")
    trainer = RLTrainer(cfg)
    assert trainer.generation.rewards.sources[1].reuses_ids  # the RM folder's tokenizer is the policy's
    captured = capture_batches(trainer)
    try:
        metrics = trainer.step()
        # the same trainer, now with the policy grading its own samples (verifier.path: policy)
        judge_cfg = dataclasses.replace(cfg, reward=dataclasses.replace(
            cfg.reward, reward_model=RewardModelConfig(),
            verifier=VerifierConfig(enable=True, prompt_template="Q:{question} A:{answer} R:{ground_truth} ok?",
                                     max_tokens=4, max_model_len=96, max_num_seqs=8, num_pages=32,
                                     combine="add", weight=2.0)))
        policy = nnx.merge(trainer.actor.graphdef, trainer.actor.state.params)
        rule, (rm_source, _) = trainer.generation.rewards.steps
        rm_source.close()
        trainer.generation.rewards = RewardSources([rule] + build_model_rewards(
            judge_cfg, trainer.tokenizer, policy, lambda: trainer.actor.state.params, trainer.mesh))
        judged = trainer.run_rollout(next(trainer.train_data), cfg.sampling_params(step=1), 0)
    finally:
        trainer.close()

    batch, samples = captured["batch"], captured["rollout"].samples
    assert len(samples) == 8
    hf_model = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    hf_model.config.pad_token_id = None  # one unpadded sequence at a time: its last token, whatever it is
    expected = np.asarray([hf_scores(hf_model, np.asarray([s.prompt_ids + s.response_ids]))[0]
                           for s in samples], np.float32)
    for b, s in enumerate(samples):
        last = len(s.prompt_ids) + len(s.response_ids) - 1
        assert batch.input_ids[b, last] == s.response_ids[-1]
        assert np.flatnonzero(batch.token_level_scores[b]).tolist() == [last]
    assert np.ptp(expected) > 0  # distinct sequences, distinct scores
    np.testing.assert_allclose(batch.token_level_scores.sum(-1), expected, atol=1e-5, rtol=1e-5)
    assert metrics["reward_model/score/mean"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert metrics["critic/score/mean"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert np.isfinite(metrics["actor/pg_loss"])

    # self-verification: rule (digit fraction of the response) + 2 x the parsed verdict
    failures = 0
    for s, r in zip(judged.samples, judged.records):
        verdict = parse_yes_no(r["verifier_output"])
        failures += verdict is None
        assert r["verifier_score"] == (0.0 if verdict is None else verdict)
        text = r["solution_str"]
        digits = sum(c.isdigit() for c in text) / max(len(text), 1)
        assert s.score == pytest.approx(digits + 2.0 * r["verifier_score"], abs=1e-6)
    assert judged.metrics["verifier/parse_failures"] == failures
    print("self-verifier verdicts:", [r["verifier_output"] for r in judged.records])


@pytest.mark.slow
def test_replicas_score_the_gathered_batch_with_the_reward_model(tmp_path, rm_dirs):
    """8 rollout replicas of a device each (4 get prompts): the rule scores each replica's
    samples, the reward model the gathered batch over the training mesh; each sample's reward is the digit
    fraction + 0.5 x transformers' RM score, then DAPO's overlong penalty (by hand)."""
    _, rm_path = rm_dirs[True]
    cfg = make_config(tmp_path, "trainer.total_steps=1", "data.train_batch_size=4", "rollout.n=2",
                      "actor.ppo_mini_batch_size=4", "rollout.tensor_parallel_size=1",
                      "reward.reward_model.enable=true", f"reward.reward_model.path={rm_path}",
                      "reward.reward_model.batch_size=8", "reward.reward_model.combine=add",
                      "reward.reward_model.weight=0.5", "reward.overlong_buffer.enable=true",
                      "reward.overlong_buffer.len=4", "reward.overlong_buffer.penalty_factor=2.0")
    trainer = RLTrainer(cfg)
    assert trainer.generation.replicas.layout.num_replicas == 8
    (rm_source, _), = trainer.generation.batch_rewards.steps
    calls = []  # (samples scored, on the main thread) per reward model call
    score = rm_source.score
    rm_source.score = lambda b: calls.append((len(b), threading.current_thread() is threading.main_thread())) or score(b)
    captured = capture_batches(trainer)
    try:
        metrics = trainer.step()
    finally:
        trainer.close()
    rollout, batch = captured["rollout"], captured["batch"]
    assert rollout.pending is None and len(rollout.samples) == 8
    assert calls == [(8, True)]  # once, over the whole batch
    hf_model = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    hf_model.config.pad_token_id = None
    rm = np.asarray([hf_scores(hf_model, np.asarray([s.prompt_ids + s.response_ids]))[0] for s in rollout.samples])
    lengths = np.asarray([len(s.response_ids) for s in rollout.samples])
    assert np.ptp(rm) > 0 and lengths.max() > 4  # some responses reach into the buffer
    penalty = np.minimum(-(lengths - (8 - 4)) / 4 * 2.0, 0.0)
    digits = np.asarray([sum(c.isdigit() for c in r["solution_str"]) / max(len(r["solution_str"]), 1)
                         for r in rollout.records])
    expected = digits + 0.5 * rm + penalty
    np.testing.assert_allclose([s.score for s in rollout.samples], expected, atol=1e-5)
    np.testing.assert_allclose([r["score"] for r in rollout.records], expected, atol=1e-5)
    np.testing.assert_allclose([r["reward_model_score"] for r in rollout.records], rm, atol=1e-5)
    np.testing.assert_allclose(batch.token_level_scores.sum(-1), expected, atol=1e-5)
    assert metrics["reward_model/score/mean"] == pytest.approx(float(rm.mean()), abs=1e-5)
    assert metrics["reward/overlong_reward/mean"] == pytest.approx(float(penalty.mean()), abs=1e-6)


@pytest.mark.slow
def test_replicas_grade_with_the_self_verifier_like_one_sampler(tmp_path):
    """8 rollout replicas: the policy grades its own samples on the replicas (a verifier
    sampler per replica on its handed-off weights, the grading prompts cut over them and the
    verdicts gathered), and the verdicts equal one verifier sampler's over the training mesh
    on the same weights; each reward is the digit fraction + 2 x the parsed verdict."""
    cfg = make_config(tmp_path, "trainer.total_steps=1", "data.train_batch_size=4", "rollout.n=2",
                      "actor.ppo_mini_batch_size=4", "rollout.tensor_parallel_size=1", "reward.verifier.enable=true",
                      "reward.verifier.prompt_template='Q:{question} A:{answer} R:{ground_truth} ok?'",
                      "reward.verifier.max_tokens=4", "reward.verifier.max_model_len=96",
                      "reward.verifier.max_num_seqs=8", "reward.verifier.num_pages=32", "reward.verifier.combine=add",
                      "reward.verifier.weight=2.0", "model.hf_config.initializer_range=0.5")  # varied verdicts
    trainer = RLTrainer(cfg)
    (source, _), = trainer.generation.batch_rewards.steps
    graded = []
    score = source.score
    source.score = lambda b: graded.append(b) or score(b)
    weights = jax.tree.map(jnp.copy, trainer.actor.state.params)  # what the replicas sample and grade with
    captured = capture_batches(trainer)
    try:
        trainer.step()
        policy = nnx.merge(trainer.actor.graphdef, weights)
        (mesh_source, _), = build_model_rewards(cfg, trainer.tokenizer, policy, lambda: weights, trainer.mesh)
        try:
            reference = mesh_source.score(graded[0])
        finally:
            mesh_source.close()
    finally:
        trainer.close()
    rollout = captured["rollout"]
    assert len(graded) == 1 and len(graded[0]) == len(rollout.samples) == 8
    outputs = [r["verifier_output"] for r in rollout.records]
    assert outputs == reference.extras["verifier_output"]
    assert len(set(outputs)) > 2  # graded prompts differ, and so do the verdicts: a shuffled one shows
    for s, r in zip(rollout.samples, rollout.records):
        digits = sum(c.isdigit() for c in r["solution_str"]) / max(len(r["solution_str"]), 1)
        assert s.score == pytest.approx(digits + 2.0 * r["verifier_score"], abs=1e-6)
    print("verdicts:", outputs)
