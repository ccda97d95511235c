"""Token-in-token-out: trajectories are exactly the sampled tokens plus observation deltas.

With the real Qwen2.5 / Qwen3 tokenizers when RLJAX_TEST_TOKENIZERS is set, otherwise with the
tiny self-built ones (same template structure).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from rljax.agent import AgentConfig, Environment, EnvStep, Episode, pack_trajectories, run_episodes
from rljax.agent.chat_deltas import TRUNCATION_NOTE, ChatFormatter, ChatTemplateError
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.agent.tools import CalculatorTool
from rljax.agent.trajectory import OBSERVATION, SAMPLED

from .helpers import EchoTool, enc, hermes_call, run

IM_END = "<|im_end|>"
GEN_PROMPT = "<|im_start|>assistant\n"


def check_token_in_token_out(traj, sampler: ScriptedSampler) -> None:
    """The buffer is sampled tokens (mask 1, their log_probs) and observations (mask 0, 0.0)."""
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_log_probs)
    pos = 0
    for seg in traj.segments:  # contiguous cover of the response
        assert seg.start == pos and seg.end > seg.start
        pos = seg.end
    assert pos == len(traj.response_ids)
    sampled = [s for s in traj.segments if s.kind == SAMPLED]
    assert len(sampled) == len(sampler.completions) == traj.num_turns
    for seg, comp, req in zip(sampled, sampler.completions, sampler.requests):
        assert traj.response_ids[seg.start:seg.end] == comp.token_ids
        assert traj.response_mask[seg.start:seg.end] == [1] * len(comp.token_ids)
        assert traj.rollout_log_probs[seg.start:seg.end] == comp.log_probs
        # the sampler was asked to continue exactly the buffer so far
        assert list(req.prompt_token_ids) == traj.prompt_ids + traj.response_ids[:seg.start]
    for seg in traj.segments:
        if seg.kind == OBSERVATION:
            assert traj.response_mask[seg.start:seg.end] == [0] * (seg.end - seg.start)
            assert traj.rollout_log_probs[seg.start:seg.end] == [0.0] * (seg.end - seg.start)


def obs_segments(traj):
    return [traj.response_ids[s.start:s.end] for s in traj.segments if s.kind == OBSERVATION]


def test_tool_episode_matches_full_rendering(hermes_tok):
    """Qwen2.5: sampled + deltas == tokenization of the fully rendered conversation."""
    tok = hermes_tok
    calc = CalculatorTool()
    t1 = hermes_call("calculator", {"expression": "2+3"}) + IM_END
    t2 = "The answer is 5." + IM_END
    sampler = ScriptedSampler([enc(tok, t1), enc(tok, t2)])
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 2+3?"}]
    (traj,) = run(run_episodes(sampler, [Episode(messages=messages)], tok, tools=[calc]))

    assert traj.termination == "stop" and traj.num_turns == 2 and traj.tool_calls == 1
    assert traj.states == ["pending", "generating", "calling_tools", "generating", "done"]
    check_token_in_token_out(traj, sampler)

    # Every boundary, token by token.
    im_end = enc(tok, IM_END)[0]
    s1, obs, s2 = traj.segments
    assert traj.prompt_ids[-len(enc(tok, GEN_PROMPT)):] == enc(tok, GEN_PROMPT)
    assert traj.response_ids[s1.end - 1] == im_end and traj.response_mask[s1.end - 1] == 1
    assert traj.response_ids[obs.start] == enc(tok, "\n")[0] and traj.response_mask[obs.start] == 0
    obs_ids = traj.response_ids[obs.start:obs.end]
    assert tok.decode(obs_ids) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" + GEN_PROMPT
    )
    assert obs_ids[-len(enc(tok, GEN_PROMPT)):] == enc(tok, GEN_PROMPT)
    assert traj.response_ids[-1] == im_end and traj.response_mask[-1] == 1

    # The prefix-stable template renders the same conversation to the same tokens.
    conversation = messages + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The answer is 5."},
    ]
    rendered = enc(tok, tok.apply_chat_template(conversation, tools=[calc.schema], tokenize=False))
    assert rendered == traj.prompt_ids + traj.response_ids + enc(tok, "\n")


def test_parallel_calls_group_into_one_turn_and_match_rendering(hermes_tok):
    tok = hermes_tok
    calc = CalculatorTool()
    t1 = (hermes_call("calculator", {"expression": "2*3"}) + "\n"
          + hermes_call("calculator", {"expression": "7-1"}) + IM_END)
    t2 = "Both are 6." + IM_END
    sampler = ScriptedSampler([enc(tok, t1), enc(tok, t2)])
    messages = [{"role": "user", "content": "Compute 2*3 and 7-1."}]
    (traj,) = run(run_episodes(sampler, [Episode(messages=messages)], tok, tools=[calc]))
    check_token_in_token_out(traj, sampler)
    assert traj.tool_calls == 2 and traj.tool_call_counts == {"calculator": 2}
    (obs,) = obs_segments(traj)
    assert tok.decode(obs) == ("\n<|im_start|>user\n<tool_response>\n6\n</tool_response>\n"
                               "<tool_response>\n6\n</tool_response><|im_end|>\n" + GEN_PROMPT)
    calls = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}}
             for e in ("2*3", "7-1")]
    conversation = messages + [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "6"}, {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "Both are 6."},
    ]
    rendered = enc(tok, tok.apply_chat_template(conversation, tools=[calc.schema], tokenize=False))
    assert rendered == traj.prompt_ids + traj.response_ids + enc(tok, "\n")


class GuessEnv(Environment):
    """A user simulator: says 'Too low' once, then accepts."""

    def __init__(self, target: int = 75):
        self.target = target
        self.closed = False
        self.seen: list[str] = []

    async def reset(self):
        return [{"role": "user", "content": "Guess my number between 1 and 100."}]

    async def step(self, assistant_text: str):
        self.seen.append(assistant_text)
        guess = int(assistant_text.split()[-1])
        if guess == self.target:
            return EnvStep([], 1.0, True)
        return EnvStep([{"role": "user", "content": "Too low. Try again."}], -0.1, False)

    async def close(self):
        self.closed = True


def test_think_template_rerender_differs_but_trajectory_is_untouched(think_tok):
    """Qwen3 drops earlier <think> blocks when re-rendering; the trajectory keeps them."""
    tok = think_tok
    s1 = "<think>\nLet me start in the middle.\n</think>\n\n50" + IM_END
    s2 = "<think>\nHigher then.\n</think>\n\n75" + IM_END
    sampler = ScriptedSampler([enc(tok, s1), enc(tok, s2)])
    env = GuessEnv()
    (traj,) = run(run_episodes(sampler, [Episode(environment=env)], tok))

    assert traj.termination == "env_done" and traj.num_turns == 2
    assert traj.reward == pytest.approx(0.9) and traj.reward_info == {"env": pytest.approx(0.9)}
    assert env.closed and env.seen == ["<think>\nLet me start in the middle.\n</think>\n\n50",
                                       "<think>\nHigher then.\n</think>\n\n75"]
    assert traj.states == ["pending", "generating", "interacting", "generating", "interacting", "done"]
    check_token_in_token_out(traj, sampler)

    fmt = ChatFormatter(tok)
    first = [{"role": "user", "content": "Guess my number between 1 and 100."}]
    feedback = [{"role": "user", "content": "Too low. Try again."}]
    expected = fmt.prompt_ids(first) + enc(tok, s1) + fmt.observation_ids(feedback) + enc(tok, s2)
    assert traj.prompt_ids + traj.response_ids == expected
    (obs,) = obs_segments(traj)
    assert tok.decode(obs) == "\n<|im_start|>user\nToo low. Try again.<|im_end|>\n" + GEN_PROMPT

    conversation = first + [
        {"role": "assistant", "content": s1[: -len(IM_END)]}, *feedback,
        {"role": "assistant", "content": s2[: -len(IM_END)]},
    ]
    rerendered = enc(tok, tok.apply_chat_template(conversation, tokenize=False))
    assert rerendered != traj.prompt_ids + traj.response_ids + enc(tok, "\n")
    assert "Let me start in the middle." not in tok.decode(rerendered)
    assert "Let me start in the middle." in tok.decode(traj.response_ids)


def test_turn_without_end_of_turn_is_closed_by_the_loop(any_tok):
    """A turn that stopped without <|im_end|> gets it appended with mask 0, then the delta."""
    tok = any_tok
    t1 = hermes_call("echo", {"text": "hi"})  # no <|im_end|>; the fake says finish "stop"
    t2 = "done" + IM_END
    sampler = ScriptedSampler([enc(tok, t1), enc(tok, t2)])
    msgs = [{"role": "user", "content": "say hi"}]
    (traj,) = run(run_episodes(sampler, [Episode(messages=msgs)], tok, tools=[EchoTool()]))
    check_token_in_token_out(traj, sampler)
    (obs,) = obs_segments(traj)
    fmt = ChatFormatter(tok, tools=[EchoTool().schema])
    assert obs == enc(tok, IM_END) + fmt.observation_ids([{"role": "tool", "content": "hi", "name": "echo"}])
    assert traj.metrics["turns_closed_by_loop"] == 1


def test_other_stop_token_is_stripped_for_parsing_and_turn_closed(hermes_tok):
    tok = hermes_tok
    eos2 = enc(tok, "<|endoftext|>")
    t1 = enc(tok, hermes_call("echo", {"text": "x"})) + eos2
    sampler = ScriptedSampler([t1, enc(tok, "ok" + IM_END)])
    params = {"temperature": 1.0, "stop_token_ids": eos2}
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "go"}])], tok,
                               tools=[EchoTool()], sampling_params=params))
    assert traj.tool_calls == 1 and traj.tool_errors["malformed"] == 0
    (obs,) = obs_segments(traj)
    assert obs[0] == enc(tok, IM_END)[0]
    assert params == {"temperature": 1.0, "stop_token_ids": eos2}  # not mutated


def test_per_turn_cap_and_budget_drive_max_tokens(any_tok):
    tok = any_tok
    long_turn = enc(tok, "word " * 40 + IM_END)
    # per-turn cap: the turn is cut and the episode ends
    sampler = ScriptedSampler([long_turn])
    cfg = AgentConfig(max_tokens_per_turn=5, max_response_tokens=100)
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "hi"}])], tok, cfg))
    assert traj.termination == "max_tokens_per_turn" and len(traj.response_ids) == 5
    assert sampler.requests[0].sampling_params["max_tokens"] == 5

    # total budget: the second turn gets exactly the remaining budget
    t1 = enc(tok, hermes_call("echo", {"text": "a"}) + IM_END)
    fmt = ChatFormatter(tok, tools=[EchoTool().schema])
    delta = fmt.observation_ids([{"role": "tool", "content": "a", "name": "echo"}])
    budget = len(t1) + len(delta) + 20
    sampler = ScriptedSampler([t1, long_turn])
    cfg = AgentConfig(max_response_tokens=budget, min_turn_tokens=4)
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "hi"}])], tok, cfg,
                               tools=[EchoTool()]))
    assert [r.sampling_params["max_tokens"] for r in sampler.requests] == [budget, 20]
    assert traj.termination == "max_response_tokens" and len(traj.response_ids) == budget
    check_token_in_token_out(traj, sampler)


def test_max_turns(any_tok):
    tok = any_tok
    turn = enc(tok, hermes_call("echo", {"text": "again"}) + IM_END)
    sampler = ScriptedSampler(lambda k, req: turn)
    cfg = AgentConfig(max_turns=3)
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "loop"}])], tok, cfg,
                               tools=[EchoTool()]))
    assert traj.termination == "max_turns" and traj.num_turns == 3 and traj.tool_calls == 2
    assert traj.response_ids[-1] == enc(tok, IM_END)[0]  # ends on the last sampled token
    check_token_in_token_out(traj, sampler)


@pytest.mark.parametrize("policy", ["end", "truncate"])
def test_observation_overflow(any_tok, policy):
    tok = any_tok
    t1 = enc(tok, hermes_call("echo", {"text": "x"}) + IM_END)
    t2 = enc(tok, "ok" + IM_END)
    long_reply = " ".join(f"line{i}" for i in range(300))
    tool = EchoTool(reply=long_reply)
    budget, reserve = len(t1) + 60, 8
    sampler = ScriptedSampler([t1, t2])
    cfg = AgentConfig(max_response_tokens=budget, min_turn_tokens=reserve, overflow=policy)
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "go"}])], tok, cfg,
                               tools=[tool]))
    check_token_in_token_out(traj, sampler)
    if policy == "end":
        assert traj.termination == "overflow" and traj.response_ids == t1 and traj.num_turns == 1
    else:
        assert traj.termination == "stop" and traj.metrics["observation_truncated"] == 1
        (obs,) = obs_segments(traj)
        assert len(t1) + len(obs) <= budget - reserve
        text = tok.decode(obs)
        assert TRUNCATION_NOTE.strip() in text and text.endswith(GEN_PROMPT)
        assert text.startswith("\n<|im_start|>user\n<tool_response>\nline0 line1")
        assert sampler.requests[1].sampling_params["max_tokens"] == budget - len(t1) - len(obs)


@dataclasses.dataclass(frozen=True)
class FrozenParams:
    temperature: float = 1.0
    max_tokens: int = 1000


class AttrParams:
    def __init__(self):
        self.max_tokens = 3
        self.stop_token_ids = []


@pytest.mark.parametrize("params,cap", [({"max_tokens": 7}, 50), (FrozenParams(), 50), (AttrParams(), 50),
                                        (None, 50), ({"temperature": 0.5}, 50)])
def test_sampling_param_kinds(hermes_tok, params, cap):
    tok = hermes_tok
    sampler = ScriptedSampler([enc(tok, "hello there" + IM_END)])
    before = copy.deepcopy(params)
    cfg = AgentConfig(max_response_tokens=50)
    run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "hi"}])], tok, cfg,
                     sampling_params=params))
    from rljax.agent.protocol import get_param

    assert get_param(sampler.requests[0].sampling_params, "max_tokens") == cap
    if isinstance(params, (dict, FrozenParams)):
        assert params == before
    if isinstance(params, AttrParams):
        assert params.max_tokens == 3


def test_sampler_protocol_violations_raise(hermes_tok):
    tok = hermes_tok

    class TooLong(ScriptedSampler):
        async def generate_async(self, request):
            c = await super().generate_async(request)
            c.token_ids = c.token_ids + c.token_ids
            c.log_probs = c.log_probs + c.log_probs
            return c

    class BadLogprobs(ScriptedSampler):
        async def generate_async(self, request):
            c = await super().generate_async(request)
            c.log_probs = c.log_probs[:-1]
            return c

    ep = [Episode(messages=[{"role": "user", "content": "hi"}])]
    with pytest.raises(ValueError, match="max_tokens"):
        run(run_episodes(TooLong([enc(tok, "a")]), ep, tok, AgentConfig(max_tokens_per_turn=1)))
    with pytest.raises(ValueError, match="log_probs"):
        run(run_episodes(BadLogprobs([enc(tok, "abc")]), ep, tok))


def test_pack_trajectories_follows_data_contract(hermes_tok):
    tok = hermes_tok
    t1 = enc(tok, hermes_call("echo", {"text": "a"}) + IM_END)
    t2 = enc(tok, "fin" + IM_END)
    episodes = [Episode(messages=[{"role": "user", "content": "short"}], group_id=3),
                Episode(messages=[{"role": "user", "content": "a much longer prompt " * 3}])]
    sampler = ScriptedSampler([t1, t2])
    trajs = run(run_episodes(sampler, episodes, tok, tools=[EchoTool()],
                             reward_fn=lambda t: float(len(t.response_ids))))
    batch = pack_trajectories(trajs, pad_token_id=tok.pad_token_id, pad_to_multiple_of=64)
    B, T = batch["input_ids"].shape
    assert B == 2 and T % 64 == 0 and T >= max(len(t.input_ids) for t in trajs)
    assert batch["input_ids"].dtype == np.int32 and batch["rollout_log_probs"].dtype == np.float32
    for b, t in enumerate(trajs):
        n, p = len(t.input_ids), len(t.prompt_ids)
        assert batch["input_ids"][b, :n].tolist() == t.input_ids
        assert (batch["input_ids"][b, n:] == tok.pad_token_id).all()
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (T - n)
        assert batch["positions"][b, :n].tolist() == list(range(n))
        assert batch["response_mask"][b].tolist() == [0] * p + t.response_mask + [0] * (T - n)
        # entry t is the log_prob of input_ids[t]
        for seg in t.segments:
            if seg.kind == SAMPLED:
                np.testing.assert_allclose(batch["rollout_log_probs"][b, p + seg.start:p + seg.end],
                                           t.rollout_log_probs[seg.start:seg.end], rtol=1e-6)
        assert (batch["rollout_log_probs"][b][batch["response_mask"][b] == 0] == 0).all()
        last_sampled = p + max(i for i, m in enumerate(t.response_mask) if m)
        assert batch["token_level_rewards"][b, last_sampled] == pytest.approx(t.reward)
        assert batch["token_level_rewards"][b].sum() == pytest.approx(t.reward)
        assert batch["prompt_lengths"][b] == p and batch["response_lengths"][b] == n - p
    assert batch["group_ids"].tolist() == [3, 1]
    assert batch["scores"].tolist() == [t.reward for t in trajs]
    with pytest.raises(ValueError, match="max_length"):
        pack_trajectories(trajs, pad_token_id=0, max_length=10)


def test_chat_formatter_rejects_templates_that_break_the_convention(hermes_tok):
    bad_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}!<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = ChatFormatter(hermes_tok, chat_template=bad_template)
    with pytest.raises(ChatTemplateError, match="between assistant content"):
        fmt.observation_ids([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="single token"):
        ChatFormatter(hermes_tok, end_of_turn_token="hello world")


def test_rollout_sampler_adapter(hermes_tok):
    import rljax.rollout.params as params_mod
    from rljax.agent.rollout_adapter import RolloutSamplerAdapter

    class FakeRolloutSampler:
        """Mimics rljax.rollout.Sampler.generate_async: GenerationRequest in, list out."""

        def __init__(self):
            self.seen = []

        async def generate_async(self, request):
            assert isinstance(request, params_mod.GenerationRequest)
            self.seen.append(request)
            ids = [5, 6, 7][: request.sampling_params.max_tokens]
            return [params_mod.Completion(request_index=0, sample_index=0,
                                          prompt_token_ids=list(request.prompt_token_ids),
                                          token_ids=ids, log_probs=[-0.5] * len(ids), finish_reason="length")]

    fake = FakeRolloutSampler()
    cfg = AgentConfig(max_response_tokens=2)
    (traj,) = run(run_episodes(RolloutSamplerAdapter(fake), [Episode(messages=[{"role": "user", "content": "x"}])],
                               hermes_tok, cfg, sampling_params={"temperature": 0.0}))
    assert traj.response_ids == [5, 6] and traj.rollout_log_probs == [-0.5, -0.5]
    assert fake.seen[0].sampling_params.max_tokens == 2 and fake.seen[0].sampling_params.temperature == 0.0
    assert traj.termination == "max_response_tokens"


def test_end_of_turn_token_is_detected_from_the_template():
    from rljax.bench.scripted_agent import build_tiny_chat_tokenizer

    tok = build_tiny_chat_tokenizer("hermes")
    tok.eos_token = "<|endoftext|>"  # like Qwen base tokenizers
    fmt = ChatFormatter(tok)
    assert fmt.end_of_turn_token == IM_END and fmt.end_of_turn_id == enc(tok, IM_END)[0]
    assert ChatFormatter(tok, end_of_turn_token="<|endoftext|>").end_of_turn_token == "<|endoftext|>"


def test_llama3_json_parser_in_the_loop(hermes_tok):
    tok = hermes_tok
    t1 = enc(tok, '{"name": "calculator", "parameters": {"expression": "6*7"}}' + IM_END)
    sampler = ScriptedSampler([t1, enc(tok, "42" + IM_END)])
    cfg = AgentConfig(tool_parser="llama3_json")
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "6*7?"}])], tok, cfg,
                               tools=[CalculatorTool()]))
    assert traj.tool_call_counts == {"calculator": 1} and traj.termination == "stop"
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(traj.response_ids)


def test_agent_loop_is_reusable_across_event_loops(hermes_tok):
    """A trainer may call asyncio.run once per step with the same AgentLoop and tools."""
    from rljax.agent import AgentLoop

    from .helpers import SleepTool

    tok = hermes_tok
    script = [enc(tok, hermes_call("sleep", {"seconds": 0.01}) + IM_END), enc(tok, "ok" + IM_END)]
    tool = SleepTool()
    loop = AgentLoop(ScriptedSampler(script), tok, AgentConfig(max_concurrent_tool_calls=1), tools=[tool])
    eps = [Episode(messages=[{"role": "user", "content": f"t{i}"}]) for i in range(3)]
    for _ in range(2):
        loop.sampler = ScriptedSampler(script)
        trajs = run(loop.run(eps))
        assert [t.termination for t in trajs] == ["stop"] * 3
    assert tool.max_in_flight == 1
