"""Agent RL integration: cold-start SFT data, agent rollouts and the RL step agree token by token.

- A tool-use demonstration (`rljax.data.synthetic_tools`) renders, in SFT, to exactly the
  token buffer the agent loop builds when the model samples the demonstration's assistant
  turns: same tokens, and SFT's loss mask equals the trajectory's response mask.
- `agent_generate_and_score` (scripted sampler): sampled tokens mask 1 with their
  log-probs, the calculator's observation delta mask 0, exact-match reward of the final
  answer, length checks.
- One RL step with `agent:` on a tiny random model: the first turn of every episode is a
  scripted calculator call, later turns come from the real sampler (or a scripted right
  answer for half of the episodes); the training batch is checked token by token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from rljax.agent import AgentConfig, Episode, run_episodes
from rljax.agent.chat_deltas import ChatFormatter
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.agent.tools.registry import load_tools
from rljax.config import load_config
from rljax.data.config import DataConfig
from rljax.data.rl import RLTransform
from rljax.data.sft import SFTTransform
from rljax.data.sources import Row
from rljax.data.synthetic_spec import materialize
from rljax.data.synthetic_tools import CALCULATOR_SCHEMA, DATA_SOURCE, make_rows
from rljax.data.tokenizer import build_char_tokenizer
from rljax.rewards import compute_score
from rljax.rewards.manager import RewardManager
from rljax.rewards.sources import Combine, FunctionSource, RewardModelSource, RewardSources
from rljax.rl.agent_rollout import agent_config, agent_generate_and_score, resolve_tool_config_path
from rljax.rl.batch import build_batch
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer
from rljax.rollout.params import Completion, SamplingParams
from tests.rl.test_rl_train import capture_batches
from tests.tiny_models import tiny_qwen2_hf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS_YAML = os.path.join(REPO, "configs", "tools", "calculator.yaml")
IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def enc(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def call_text(expression: str) -> str:
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expression


def runs_of_ones(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


# ---- data, reward, config -----------------------------------------------------------------

def test_rows_spec_reward_and_tool_config(tmp_path):
    (path,) = materialize(["synthetic:tool_arithmetic/sft?n=40&seed=3&tool_fraction=0.5"], str(tmp_path))
    rows = [json.loads(line) for line in open(path)]
    assert rows == make_rows("sft", 40, seed=3, tool_fraction=0.5)
    demos = [r for r in rows if len(r["messages"]) == 4]
    assert 5 < len(demos) < 35  # about half call the tool
    for r in rows:
        assert r["tools"] == [CALCULATOR_SCHEMA]
        user, answer = r["messages"][0]["content"], r["messages"][-1]["content"]
        a, b = map(int, user.rstrip("=").split("*"))
        assert answer == str(a * b) and 10 <= a < 1000 and 10 <= b < 1000
    (bare,) = materialize(["synthetic:tool_arithmetic/rl?n=4&seed=3&tools=false"], str(tmp_path))
    assert [json.loads(line) for line in open(bare)] == make_rows("rl", 4, seed=3, tools=False)
    assert all("tools" not in json.loads(line) for line in open(bare))
    rl = make_rows("rl", 3, seed=0)[0]
    assert rl["data_source"] == DATA_SOURCE and rl["tools"] == [CALCULATOR_SCHEMA]
    truth = rl["reward_model"]["ground_truth"]
    assert compute_score(DATA_SOURCE, f" {truth}\n", truth)["score"] == 1.0
    assert compute_score(DATA_SOURCE, truth + "0", truth)["score"] == 0.0
    assert compute_score(DATA_SOURCE, call_text("1*2"), truth) == {"score": 0.0, "acc": 0.0, "pred": None}
    with pytest.raises(ValueError, match="not available"):
        make_rows("preference", 1)
    # the tool YAML declares the schema the data renders; its path resolves from any cwd
    assert load_tools(TOOLS_YAML)["calculator"].schema == CALCULATOR_SCHEMA
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert resolve_tool_config_path("configs/tools/calculator.yaml") == TOOLS_YAML
        assert agent_config(quickstart_config().agent).tool_config_path == TOOLS_YAML
        with pytest.raises(FileNotFoundError, match="no_such.yaml"):
            resolve_tool_config_path("configs/tools/no_such.yaml")
    finally:
        os.chdir(cwd)


def quickstart_config() -> RLConfig:
    return load_config(RLConfig, os.path.join(REPO, "configs", "agent_quickstart.yaml"))


def _sft_cases():
    cases = ["char", "quickstart"]  # schemas in the prompt; the quickstart's template without them
    if os.environ.get("RLJAX_TEST_TOKENIZERS"):
        cases.append("qwen2.5-instruct")
    return cases


@pytest.mark.parametrize("case", _sft_cases())
def test_sft_demonstration_equals_agent_trajectory(case, tok):
    """Cold-start SFT trains on exactly the tokens (and mask) the agent loop produces."""
    config = AgentConfig(max_response_tokens=1024)
    if case == "qwen2.5-instruct":
        from transformers import AutoTokenizer

        path = os.path.join(os.environ["RLJAX_TEST_TOKENIZERS"], case)
        assert os.path.isdir(path), f"RLJAX_TEST_TOKENIZERS has no {case}/ (see tests/agent/conftest.py)"
        tok = AutoTokenizer.from_pretrained(path)
    if case == "quickstart":  # rows without tools, an agent template that does not show them
        config = AgentConfig(max_response_tokens=1024, chat_template=quickstart_config().agent.chat_template)
    sft = SFTTransform(DataConfig(format="sft", max_length=4096), tok)
    rows = make_rows("sft", 12, seed=7, tool_fraction=0.5, tools=case != "quickstart")
    kinds = set()
    for i, row in enumerate(rows):
        example = sft(Row(file="demo.jsonl", row=i, line=i + 1, data=row, index=i))
        ids, loss_mask = [int(x) for x in example["input_ids"]], [int(x) for x in example["loss_mask"]]
        turns = [ids[a:b] for a, b in runs_of_ones(loss_mask)]
        assert len(turns) == sum(m["role"] == "assistant" for m in row["messages"])
        kinds.add(len(turns))
        sampler = ScriptedSampler(turns)
        (traj,) = asyncio.run(run_episodes(
            sampler, [Episode(messages=row["messages"][:1])], tok, config, tools=load_tools(TOOLS_YAML)))
        n = len(traj.input_ids)
        assert traj.termination == "stop" and traj.num_turns == len(turns)
        assert traj.tool_calls == len(turns) - 1 and traj.tool_errors.get("bad_arguments", 0) == 0
        assert traj.input_ids == ids[:n]  # the same tokens ...
        assert [0] * len(traj.prompt_ids) + traj.response_mask == loss_mask[:n]  # ... and the same mask
        assert all(m == 0 for m in loss_mask[n:])  # SFT only adds template glue after the last turn
        assert len(ids) - n <= 2
        assert traj.messages[-1] == {"role": "assistant", "content": row["messages"][-1]["content"]}
        if len(turns) == 2:  # the real calculator's answer is the demonstration's tool message
            assert traj.messages[2]["content"] == row["messages"][2]["content"]
    assert kinds == {1, 2}


@pytest.mark.parametrize("quickstart", [False, True])
def test_rl_prompt_equals_agent_prompt(tok, quickstart):
    row = make_rows("rl", 1, seed=5, tools=not quickstart)[0]
    assert ("tools" in row) != quickstart
    example = RLTransform(DataConfig(format="rl", max_prompt_length=512), tok)(
        Row(file="rl.jsonl", row=0, line=1, data=row, index=0))
    template = quickstart_config().agent.chat_template if quickstart else None
    formatter = ChatFormatter(tok, tools=[t.schema for t in load_tools(TOOLS_YAML).values()],
                              chat_template=template)
    assert example["prompt_ids"] == formatter.prompt_ids(example["raw_prompt"])
    assert (len(example["prompt_ids"]) <= quickstart_config().data.max_prompt_length) == quickstart


# ---- agent_generate_and_score with a scripted rollout sampler ---------------------------------

class ScriptedRolloutSampler:
    """`rljax.rollout.Sampler`'s async API from a script ``fn(turn, request) -> token ids``."""

    def __init__(self, tok, fn, max_model_len: int = 400):
        self.tok, self.fn = tok, fn
        self.config = SimpleNamespace(max_model_len=max_model_len)
        self.log: list[tuple[list[int], Completion]] = []

    async def generate_async(self, request):
        prompt = list(request.prompt_token_ids)
        turn = self.tok.decode(prompt).count("<|im_start|>assistant") - 1
        ids = list(self.fn(turn, request))[: request.sampling_params.max_tokens]
        stop = ids and ids[-1] in request.sampling_params.stop_token_ids
        comp = Completion(request.request_id, 0, prompt, ids, [-0.5 - 0.01 * k for k in range(len(ids))],
                          "stop" if stop else "length")
        self.log.append((prompt, comp))
        return [comp]


def question_of(tok, prompt_ids) -> str:
    return re.findall(r"user\n(\d+\*\d+)=", tok.decode(prompt_ids))[-1]


def check_sample(tok, sample, log, mask_row=None, logp_row=None):
    """Response = sampled completions (mask 1, their log-probs) + calculator deltas (mask 0)."""
    by_prompt: dict[tuple, list[Completion]] = {}
    for prompt, comp in log:
        by_prompt.setdefault(tuple(prompt), []).append(comp)
    formatter = ChatFormatter(tok, tools=[CALCULATOR_SCHEMA])
    resp, mask = sample.response_ids, sample.response_mask
    if mask_row is not None:
        p = len(sample.prompt_ids)
        assert list(mask_row[:p]) == [0] * p and not mask_row[p + len(resp):].any()
        assert list(mask_row[p:p + len(resp)]) == mask
        assert list(logp_row[p:p + len(resp)]) == pytest.approx(sample.response_log_probs)
    pos, turns = 0, 0
    expression = question_of(tok, sample.prompt_ids)
    while pos < len(resp):
        # the sampler was asked to continue exactly the buffer so far, and returned these tokens
        (comp,) = [c for c in by_prompt[tuple(sample.prompt_ids + resp[:pos])]
                   if resp[pos:pos + len(c.token_ids)] == c.token_ids][:1]
        k = len(comp.token_ids)
        assert resp[pos:pos + k] == comp.token_ids and mask[pos:pos + k] == [1] * k
        assert sample.response_log_probs[pos:pos + k] == pytest.approx(comp.log_probs)
        pos, turns = pos + k, turns + 1
        if pos == len(resp):
            break
        a, b = map(int, expression.split("*"))
        obs = formatter.observation_ids([{"role": "tool", "name": "calculator", "content": str(a * b)}])
        assert resp[pos:pos + len(obs)] == obs and mask[pos:pos + len(obs)] == [0] * len(obs)
        assert sample.response_log_probs[pos:pos + len(obs)] == [0.0] * len(obs)
        pos += len(obs)
    return turns


def test_agent_generate_and_score_masks_and_rewards(tok):
    rows = make_rows("rl", 3, seed=11)
    prompts = {"raw_prompt": [r["prompt"] for r in rows], "data_source": [r["data_source"] for r in rows],
               "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
               "extra_info": [r["extra_info"] for r in rows], "tools": [r["tools"] for r in rows]}

    def script(turn, request):
        expression = question_of(tok, request.prompt_token_ids)
        if turn == 0:
            return enc(tok, call_text(expression) + IM_END)
        a, b = map(int, expression.split("*"))
        # by episode: the right answer, a wrong one, or a run-on cut by the response budget
        return enc(tok, [str(a * b) + IM_END, str(a * b + 1) + IM_END, "9" * 200][request.sampling_params.stream % 3])

    sampler = ScriptedRolloutSampler(tok, script)
    config = agent_config({"tool_config_path": TOOLS_YAML, "max_turns": 3, "max_tokens_per_turn": 96,
                           "min_turn_tokens": 8})
    manager = RewardManager.from_config({"mode": "inline"})
    rewards = RewardSources([(FunctionSource(manager), Combine())])
    params = SamplingParams(n=2, temperature=1.0, max_tokens=128, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rows' tools are the agent's: no warning
        out = agent_generate_and_score(sampler, rewards, tok, prompts, params, config, group_offset=5)
    assert len(out.samples) == 6 and [s.group_id for s in out.samples] == [5, 5, 6, 6, 7, 7]
    for s, rec in zip(out.samples, out.records):
        assert check_sample(tok, s, sampler.log) == 2
        truth = prompts["ground_truth"][s.group_id - 5]
        assert s.score == float(rec["solution_str"] == truth) and rec["acc"] == s.score
        assert rec["tool_use"] == 1.0 and rec["num_turns"] == 2.0
        assert s.truncated == (len(s.response_ids) == 128) == (set(rec["solution_str"]) == {"9"})
    assert out.metrics["agent/tool_use_rate"] == 1.0 and out.metrics["agent/num_turns/mean"] == 2.0
    assert out.metrics["agent/tool_calls_by_name/calculator"] == 6.0
    assert sorted(s.score for s in out.samples) == [0, 0, 0, 0, 1, 1]
    assert sum(s.truncated for s in out.samples) == 2
    # a reward model on top (`add`, weight 0.5) scores the whole trajectory's exact tokens
    class LengthScorer:
        def score(self, sequences):
            return np.asarray([len(x) for x in sequences], np.float32)

    with_rm_sources = RewardSources([(FunctionSource(manager, zero_where_no_rule=True), Combine()),
                                     (RewardModelSource(LengthScorer()), Combine("add", 0.5))])
    with_rm = agent_generate_and_score(sampler, with_rm_sources, tok, prompts, params, config, group_offset=5)
    for plain, s, rec in zip(out.samples, with_rm.samples, with_rm.records):
        assert s.response_ids == plain.response_ids  # seeded episodes: the same trajectories
        assert s.score == plain.score + 0.5 * (len(s.prompt_ids) + len(s.response_ids))
        assert rec["reward_model_score"] == len(s.prompt_ids) + len(s.response_ids)
    assert "reward_model/score/mean" in with_rm.metrics
    # DAPO's overlong shaping applies to agent episodes too, on the whole response (turns and
    # observations) against the episode budget (128): past 128 - 64 tokens the penalty grows
    # linearly to -1 at the budget
    from rljax.rl.config import OverlongBufferConfig

    shaped = agent_generate_and_score(sampler, rewards, tok, prompts, params, config, group_offset=5,
                                      overlong_buffer=OverlongBufferConfig(enable=True, len=64, penalty_factor=1.0))
    for plain, s, rec in zip(out.samples, shaped.samples, shaped.records):
        assert s.response_ids == plain.response_ids
        excess = len(s.response_ids) - (128 - 64)
        assert s.score == pytest.approx(plain.score + min(0.0, -excess / 64)) == rec["score"]
    assert sum(s.score == p.score - 1.0 for p, s in zip(out.samples, shaped.samples)) == 2  # the two run-ons
    assert shaped.metrics["reward/overlong_frac"] == pytest.approx(np.mean([len(s.response_ids) > 64
                                                                            for s in shaped.samples]))
    # every episode's response budget is the rollout's response length, and the batch fits
    assert max(len(s.response_ids) for s in out.samples) <= 128
    batch = build_batch(out.samples, 16, 400)
    for b, s in enumerate(out.samples):
        check_sample(tok, s, sampler.log, batch.response_mask[b], batch.rollout_log_probs[b])
        last = len(s.prompt_ids) + int(np.flatnonzero(s.response_mask)[-1])
        assert batch.token_level_scores[b, last] == s.score and batch.token_level_scores[b].sum() == s.score
    # an agent prompt (tools included) longer than data.max_prompt_length is an error
    short = ScriptedRolloutSampler(tok, script, max_model_len=128 + 100)
    with pytest.raises(ValueError, match="max_prompt_length=100"):
        agent_generate_and_score(short, rewards, tok, prompts, params, config)
    # rows declaring other tools than the agent's get a warning
    other = {**prompts, "tools": [[{"type": "function", "function": {"name": "search"}}]] * 3}
    with pytest.warns(UserWarning, match="differ from the agent's tools"):
        agent_generate_and_score(sampler, rewards, tok, other, params, config)
    reordered = {"function": CALCULATOR_SCHEMA["function"], "type": "function"}  # equal dict, other text
    with pytest.warns(UserWarning, match="differ from the agent's tools"):
        agent_generate_and_score(sampler, rewards, tok, {**prompts, "tools": [[reordered]] * 3}, params, config)
    rewards.close()


# ---- one RL step with agent rollouts on a tiny random model ------------------------------------

class FirstTurnScripted:
    """The trainer's sampler, with every episode's first turn replaced by a calculator call
    and, for episodes with an even seed, the second turn by the right answer. Other turns
    are sampled by the real model through the real sampler."""

    def __init__(self, sampler, tok):
        self.sampler, self.tok = sampler, tok
        self.log: list[tuple[list[int], Completion]] = []

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    async def generate_async(self, request):
        prompt = list(request.prompt_token_ids)
        turn = self.tok.decode(prompt).count("<|im_start|>assistant") - 1
        expression = question_of(self.tok, prompt)
        a, b = map(int, expression.split("*"))
        if turn == 0 or request.sampling_params.stream % 2 == 0:
            text = call_text(expression) if turn == 0 else str(a * b)
            ids = enc(self.tok, text + IM_END)
            comp = Completion(request.request_id, 0, prompt, ids, [-0.25] * len(ids), "stop")
        else:
            (comp,) = await self.sampler.generate_async(request)
        self.log.append((prompt, comp))
        return [comp]


TINY_QWEN2 = tiny_qwen2_hf()


def agent_trainer(tmp_path, hf_config: dict, agent: dict, *overrides) -> RLTrainer:
    """An RLTrainer with `agent:` rollouts (calculator tool, char tokenizer) on a tiny model:
    2 prompts x 4 episodes per step (8 rows, one per virtual device)."""
    raw = {"model": {"tokenizer": "char", "hf_config": hf_config},
           "agent": {"tool_config_path": "configs/tools/calculator.yaml", **agent}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(RLConfig, str(path), [
        f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.async_save=false",
        'data.train_files=["synthetic:tool_arithmetic/rl?n=64&seed=0"]',
        'data.val_files=["synthetic:tool_arithmetic/rl?n=2&seed=1"]', "data.train_batch_size=2",
        "data.max_prompt_length=240", "data.bucket_size=16", "rollout.n=4", "rollout.response_length=128",
        "rollout.max_num_seqs=16", "rollout.num_pages=128", "rollout.page_size=16", "actor.ppo_mini_batch_size=2",
        "actor.optim.lr=1e-2", "reward.mode=inline", "trainer.save_freq=0", "trainer.total_steps=1", *overrides])
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the tool config resolves from the source tree
    try:
        return RLTrainer(cfg)
    finally:
        os.chdir(cwd)


@pytest.mark.slow
@pytest.mark.filterwarnings("error:an RL data row")
def test_one_agent_rl_step_on_tiny_model(tmp_path, tok):
    trainer = agent_trainer(tmp_path, TINY_QWEN2, {"max_turns": 3, "max_tokens_per_turn": 96, "min_turn_tokens": 8})
    trainer.generation.sampler = FirstTurnScripted(trainer.generation.sampler, tok)
    captured = capture_batches(trainer)
    before = jax.device_get(trainer.actor.state.params)
    try:
        metrics = trainer.step()
        val = trainer.validate()
    finally:
        trainer.close()
    batch, samples = captured["batch"], captured["rollout"].samples
    assert len(samples) == 8 and batch.input_ids.shape[0] == 8  # 8 rows: one per virtual device
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert list(batch.input_ids[b, :p + r]) == s.prompt_ids + s.response_ids
        assert batch.attention_mask[b].sum() == p + r
        assert check_sample(tok, s, trainer.generation.sampler.log, batch.response_mask[b], batch.rollout_log_probs[b]) >= 2
        obs = (batch.response_mask[b] == 0) & (batch.attention_mask[b] == 1)
        obs[:p] = False
        assert obs.sum() > 10 and not batch.advantages[b][obs].any()  # observations carry no loss
    assert sum(s.score == 1.0 for s in samples) >= 4  # the scripted right answers (2 per group)
    assert np.abs(batch.advantages).sum() > 0
    assert metrics["agent/tool_use_rate"] == 1.0 and metrics["critic/score/mean"] >= 0.5
    assert np.isfinite(metrics["actor/pg_loss"])
    after = jax.device_get(trainer.actor.state.params)
    assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    assert val["val-aux/synthetic/tool_arithmetic/tool_use/mean@1"] == 1.0
    assert "val-core/synthetic/tool_arithmetic/acc/mean@1" in val


# ---- routing replay (`actor.router_replay`) with agent rollouts on a tiny MoE -----------------

class ScriptedCallWithRouting:
    """The first turn of every episode is a scripted calculator call whose routing record is
    the real model's (a prefill of prompt + call through the real sampler, its one sampled
    token dropped); the second turn is the real sampler's. The second turn's record of the
    positions the first already computed is overwritten with other experts: stitching must
    take the earliest turn's record there, or the replayed log-probs stop matching."""

    def __init__(self, sampler, tok, num_experts: int):
        self.sampler, self.tok, self.num_experts = sampler, tok, num_experts
        self.real: list[Completion] = []  # the real (model-sampled) turns, as the sampler returned them
        self.probed: dict[int, int] = {}  # episode (its random stream) -> positions its first turn recorded

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    async def generate_async(self, request):
        prompt = list(request.prompt_token_ids)
        turn = self.tok.decode(prompt).count("<|im_start|>assistant") - 1
        if turn == 0:
            ids = enc(self.tok, call_text(question_of(self.tok, prompt)) + IM_END)
            prefill = dataclasses.replace(request, prompt_token_ids=prompt + ids,
                                          sampling_params=dataclasses.replace(request.sampling_params, max_tokens=1))
            (probe,) = await self.sampler.generate_async(prefill)
            self.probed[request.sampling_params.stream] = len(prompt) + len(ids)
            return [Completion(request.request_id, 0, prompt, ids, [-0.25] * len(ids), "stop",
                               probe.expert_ids[: len(prompt) + len(ids)])]
        (comp,) = await self.sampler.generate_async(request)
        self.real.append(comp)
        record = comp.expert_ids.copy()
        seen = self.probed[request.sampling_params.stream]
        record[:seen] = (record[:seen] + 1) % self.num_experts  # recomputed positions: other experts
        return [dataclasses.replace(comp, expert_ids=record)]


@pytest.mark.slow
def test_agent_routing_replay_on_tiny_moe(tmp_path, tok):
    """One GRPO step, a qwen3_moe policy in float32, `actor.router_replay=true`, a calculator
    call per episode: every position the model computed carries a record in the batch, and
    the trainer's old log-probs, replaying it, are the sampler's on the real turns."""
    from tests.rl.test_moe_rl import MOE

    trainer = agent_trainer(tmp_path, MOE, {"max_turns": 2, "max_tokens_per_turn": 96, "min_turn_tokens": 8},
                            "actor.router_replay=true")
    scripted = ScriptedCallWithRouting(trainer.generation.sampler, tok, MOE["num_experts"])
    trainer.generation.sampler = scripted
    captured = capture_batches(trainer)
    before = jax.tree.map(np.asarray, trainer.actor.params)
    try:
        metrics = trainer.step()
    finally:
        trainer.close()
    batch, samples = captured["batch"], captured["rollout"].samples
    assert trainer.forwards.router_replay and np.isfinite(metrics["actor/pg_loss"])
    experts, mask = batch.expert_ids, batch.attention_mask
    assert experts.shape == (*batch.input_ids.shape, MOE["num_hidden_layers"], MOE["num_experts_per_tok"])
    real = np.zeros(mask.shape, bool)  # tokens the real sampler chose (their log-probs are the model's)
    for b, s in enumerate(samples):
        n = len(s.prompt_ids) + len(s.response_ids)
        assert mask[b].sum() == n and s.response_mask.count(1) > 0
        # every position fed to the model has a record; the last token (never fed) and padding none
        assert (experts[b, : n - 1] >= 0).all() and (experts[b, n - 1:] == -1).all()
        ids = s.prompt_ids + s.response_ids
        comp = next(c for c in scripted.real if ids[: len(c.prompt_token_ids) + len(c.token_ids)]
                    == list(c.prompt_token_ids) + list(c.token_ids))
        p, r = len(comp.prompt_token_ids), len(comp.token_ids)
        assert p + r == n  # the real turn ends the episode (max_turns=2)
        real[b, p: p + r] = True
        # its tokens replay its own decode-time record
        np.testing.assert_array_equal(experts[b, p: n - 1], comp.expert_ids[p: n - 1])
    assert (batch.response_mask[real] > 0).all()
    diff = np.abs(batch.old_log_probs - batch.rollout_log_probs)[real]
    assert diff.max() < 1e-5, diff.max()
    # the forwards read the record: other experts give other log-probs
    params = jax.tree.map(jnp.asarray, before)
    shifted = np.where(experts >= 0, (experts + 1) % MOE["num_experts"], -1)
    moved = np.asarray(trainer.forwards.log_probs(params, batch.input_ids, mask, shifted))
    assert np.abs(moved - batch.old_log_probs)[real].max() > 1e-2
