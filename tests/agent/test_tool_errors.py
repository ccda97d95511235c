"""Every tool failure becomes an observation the model sees (never an exception), counted."""

from __future__ import annotations

import asyncio

import pytest

from rljax.agent import AgentConfig, Episode, collect_metrics, run_episodes
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.agent.tools import CalculatorTool, Tool, ToolResult
from rljax.agent.trajectory import OBSERVATION

from .helpers import EchoTool, RaisingTool, SleepTool, enc, fn_schema, hermes_call, run

IM_END = "<|im_end|>"
FINAL = "All done." + IM_END


class HangingTool(Tool):
    def __init__(self):
        super().__init__(fn_schema("hang"))
        self.cancelled = False

    async def call(self, arguments, state):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "never"


class WrongReturnTool(Tool):
    def __init__(self):
        super().__init__(fn_schema("wrong"))

    async def call(self, arguments, state):
        return 42


class BrokenStateTool(Tool):
    def __init__(self):
        super().__init__(fn_schema("broken_state"))

    def create_state(self):
        raise OSError("no resources")

    async def call(self, arguments, state):
        return "unreachable"


def tools():
    return [CalculatorTool(), EchoTool(), RaisingTool(), HangingTool(), WrongReturnTool(), BrokenStateTool(),
            EchoTool(fn_schema("typed", {"n": {"type": "integer"}, "mode": {"enum": ["a", "b"]}}, ["n"]), reply="ok")]


CASES = {
    "malformed_json": ('<tool_call>\n{"name": "echo", "arguments": {"text": }\n</tool_call>', "malformed",
                       "Error: malformed tool call: invalid JSON"),
    "unterminated": ('<tool_call>\n{"name": "echo"', "malformed", "unterminated"),
    "unknown_tool": (hermes_call("search_web", {"q": "x"}), "unknown_tool",
                     "Error: unknown tool 'search_web'. Available tools:"),
    "missing_required": (hermes_call("echo", {}), "bad_arguments", "missing required argument arguments.text"),
    "wrong_type": (hermes_call("typed", {"n": "three"}), "bad_arguments", "arguments.n must be of type integer"),
    "bool_is_not_int": (hermes_call("typed", {"n": True}), "bad_arguments", "must be of type integer"),
    "bad_enum": (hermes_call("typed", {"n": 1, "mode": "c"}), "bad_arguments", "must be one of"),
    "tool_reported": (hermes_call("calculator", {"expression": "9**9**9"}), "bad_arguments", "exceeds the limit"),
    "exception": (hermes_call("boom", {}), "exception", "Error: tool boom raised RuntimeError: kaboom"),
    "state_exception": (hermes_call("broken_state", {}), "exception", "raised OSError: no resources"),
    "wrong_return": (hermes_call("wrong", {}), "exception", "returned int, not text"),
    "timeout": (hermes_call("hang", {}), "timeout", "Error: tool hang timed out after 0.2 s"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_becomes_observation_and_episode_goes_on(hermes_tok, case):
    tok = hermes_tok
    text, kind, message = CASES[case]
    sampler = ScriptedSampler([enc(tok, text + IM_END), enc(tok, FINAL)])
    cfg = AgentConfig(tool_timeout_s=0.2)
    (traj,) = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "go"}])], tok, cfg,
                               tools=tools()))
    assert traj.termination == "stop" and traj.num_turns == 2  # the episode went on
    assert traj.tool_calls == 1
    assert traj.tool_errors[kind] == 1 and sum(traj.tool_errors.values()) == 1
    (obs,) = [traj.response_ids[s.start:s.end] for s in traj.segments if s.kind == OBSERVATION]
    assert message in tok.decode(obs)
    assert collect_metrics([traj])[f"agent/tool_errors/{kind}"] == 1.0


def test_all_errors_in_one_turn_with_a_good_call(hermes_tok):
    tok = hermes_tok
    keys = ["malformed_json", "unknown_tool", "missing_required", "exception", "timeout"]
    text = "\n".join(CASES[k][0] for k in keys[:1]) + "\n" + hermes_call("calculator", {"expression": "6*7"})
    text += "\n" + "\n".join(CASES[k][0] for k in keys[1:])
    sampler = ScriptedSampler([enc(tok, text + IM_END), enc(tok, FINAL)])
    cfg = AgentConfig(tool_timeout_s=0.2, max_parallel_tool_calls=8)
    trajs = run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "go"}])] * 2, tok, cfg,
                             tools=tools()))
    for traj in trajs:
        assert traj.termination == "stop" and traj.tool_calls == 6
        assert traj.tool_errors == {"malformed": 1, "unknown_tool": 1, "bad_arguments": 1, "exception": 1,
                                    "timeout": 1}
        (obs,) = [traj.response_ids[s.start:s.end] for s in traj.segments if s.kind == OBSERVATION]
        text = tok.decode(obs)
        # observations come back in call order, one tool_response each
        assert text.count("<tool_response>") == 6
        order = [text.index(m) for m in ("malformed tool call", "\n42\n", "unknown tool", "missing required",
                                         "kaboom", "timed out")]
        assert order == sorted(order)
    m = collect_metrics(trajs)
    assert m["agent/tool_errors/total"] == 10.0 and m["agent/tool_errors/timeout"] == 2.0
    assert m["agent/tool_calls_by_name/calculator"] == 2.0


def test_timeout_cancels_the_tool(hermes_tok):
    tok = hermes_tok
    hang = HangingTool()
    sampler = ScriptedSampler([enc(tok, hermes_call("hang", {}) + IM_END), enc(tok, FINAL)])
    run(run_episodes(sampler, [Episode(messages=[{"role": "user", "content": "go"}])], tok,
                     AgentConfig(tool_timeout_s=0.1), tools=[hang]))
    assert hang.cancelled


def test_tool_state_lifecycle_and_reward(hermes_tok):
    tok = hermes_tok
    echo = EchoTool(reward_value=0.5)
    turn = enc(tok, hermes_call("echo", {"text": "a"}) + "\n" + hermes_call("echo", {"text": "b"}) + IM_END)
    sampler = ScriptedSampler([turn, turn, enc(tok, FINAL)])
    episodes = [Episode(messages=[{"role": "user", "content": f"go {i}"}]) for i in range(3)]
    trajs = run(run_episodes(sampler, episodes, tok, tools=[echo, SleepTool()]))
    assert echo.created == 3  # one state per episode, created lazily once
    assert sorted(s["calls"] for s in echo.released) == [4, 4, 4]
    for t in trajs:
        assert t.tool_call_counts == {"echo": 4}
        assert t.reward == pytest.approx(2.0) and t.reward_info == {"tool/echo": pytest.approx(2.0)}


def test_tool_result_rejects_unknown_error_kind():
    with pytest.raises(ValueError, match="error must be one of"):
        ToolResult("x", error="weird")
