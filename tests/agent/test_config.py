"""Typed configs, the YAML tool registry, and environment-mode episodes."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import yaml

from rljax.agent import AgentConfig, AgentLoop, EnvironmentConfig, Episode, run_episodes
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.config import ConfigError, load_section
from rljax.agent.tools import TOOL_CLASSES, CalculatorTool, PythonSandboxTool, Tool, load_tools, register_tool

from .helpers import enc, hermes_call, run

IM_END = "<|im_end|>"

USER_MODULE = '''
from rljax.agent import Environment, EnvStep
from rljax.agent.tools import Tool, ToolResult

class Upper(Tool):
    default_schema = {"type": "function", "function": {"name": "upper", "description": "Upper-case.",
                      "parameters": {"type": "object", "properties": {"s": {"type": "string"}},
                                     "required": ["s"]}}}
    def __init__(self, schema=None, suffix=""):
        super().__init__(schema)
        self.suffix = suffix
    async def call(self, arguments, state):
        return ToolResult(arguments["s"].upper() + self.suffix)

class NotATool:
    pass

class Countdown(Environment):
    """Asks for `steps` answers; rewards each answer equal to `expected`."""
    instances = []
    def __init__(self, steps=2, expected="yes", question="Ready?"):
        self.steps, self.expected, self.question = steps, expected, question
        self.closed = False
        Countdown.instances.append(self)
    async def reset(self):
        return [{"role": "user", "content": self.question}]
    async def step(self, text):
        self.steps -= 1
        reward = 1.0 if text == self.expected else 0.0
        return ([{"role": "user", "content": "Again?"}], reward, self.steps <= 0)
    async def close(self):
        self.closed = True
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "rljax_test_user_mod.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import rljax_test_user_mod

    return importlib.reload(rljax_test_user_mod)


# -- AgentConfig ---------------------------------------------------------------------------
def test_agent_config_loads_from_a_mapping():
    cfg = load_section(AgentConfig, yaml.safe_load(textwrap.dedent("""
        tool_parser: llama3_json
        max_turns: 4
        max_response_tokens: 1024
        tool_timeout_s: 5
        overflow: end
        max_tokens_per_turn: null
        extra_turn_end_tokens: ["<|eom_id|>"]
        chat_template_kwargs: {enable_thinking: false}
        environment: {class_name: "pkg.mod:Env", options: {steps: 3}}
    """)), "agent")
    assert cfg.max_turns == 4 and cfg.tool_timeout_s == 5.0 and cfg.overflow == "end"
    assert cfg.extra_turn_end_tokens == ("<|eom_id|>",)
    assert cfg.environment == EnvironmentConfig("pkg.mod:Env", {"steps": 3})
    assert load_section(AgentConfig, {}, "agent") == AgentConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_turns = 9  # type: ignore[misc]


@pytest.mark.parametrize("data,match", [
    ({"max_turn": 3}, r"^unknown config key 'agent\.max_turn'; did you mean 'max_turns'\?"),
    ({"environment": {"class_name": "x", "option": {}}}, r"^unknown config key 'agent\.environment\.option'"),
    ({"max_turns": "3"}, r"^agent\.max_turns: expected an integer, got '3'"),
    ({"max_turns": True}, r"^agent\.max_turns: expected an integer, got True"),
    ({"tool_timeout_s": "fast"}, r"^agent\.tool_timeout_s: expected a number, got 'fast'"),
    ({"tool_timeout_s": 0}, r"^agent\.tool_timeout_s: must be > 0, got 0"),
    ({"tool_timeout_s": float("inf")}, r"^agent\.tool_timeout_s: must be a finite number"),
    ({"overflow": "drop"}, r"^agent\.overflow: expected one of \['truncate', 'end'\], got 'drop'"),
    ({"max_turns": 0}, r"^agent\.max_turns: must be >= 1, got 0"),
    ({"max_concurrent_episodes": 0}, r"^agent\.max_concurrent_episodes: must be >= 1, got 0"),
    ({"environment": "pkg:Env"}, r"^agent\.environment: expected a mapping \(section EnvironmentConfig\)"),
    ({"environment": {"options": {}}}, r"^agent\.environment: .*class_name"),
])
def test_agent_config_errors_name_the_key(data, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_section(AgentConfig, data, "agent")
    assert "\n" not in str(info.value)


def test_agent_config_built_in_code_is_checked():
    """`AgentLoop` users build the config in code: a bad value fails at construction."""
    with pytest.raises(ConfigError, match=r"^max_parallel_tool_calls: must be >= 1, got 0"):
        AgentConfig(max_parallel_tool_calls=0)
    with pytest.raises(ConfigError, match=r"^overflow: expected one of"):
        AgentConfig(overflow="drop")  # type: ignore[arg-type]


# -- tools YAML ----------------------------------------------------------------------------
def test_load_tools_yaml(tmp_path, user_module):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - name: calculator
            options: {max_exponent: 100}
          - name: python
            options: {timeout_s: 2, memory_mb: 128}
          - class: rljax_test_user_mod:Upper
            options: {suffix: "!"}
          - class: rljax.agent.tools.calculator.CalculatorTool
            schema:
              type: function
              function:
                name: calc2
                description: Another calculator.
                parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
    """))
    tools = load_tools(path)
    assert list(tools) == ["calculator", "python", "upper", "calc2"]
    assert isinstance(tools["calculator"], CalculatorTool) and tools["calculator"].max_exponent == 100
    assert isinstance(tools["python"], PythonSandboxTool) and tools["python"].memory_mb == 128
    assert run(tools["upper"].call({"s": "ab"}, None)).text == "AB!"
    assert tools["calc2"].schema["function"]["description"] == "Another calculator."


@pytest.mark.parametrize("entry,match", [
    ({"name": "calculator", "option": {}}, r"tools\[0\]: unknown key 'option'"),
    ({"name": "calculator", "options": {"max_exp": 3}}, r"unknown option 'max_exp' for CalculatorTool"),
    ({"name": "calculator", "class": "x:y"}, "exactly one of"),
    ({}, "exactly one of"),
    ({"name": "search"}, "unknown tool 'search'"),
    ({"class": "rljax_test_user_mod:NotATool"}, "is not a Tool subclass"),
    ({"name": "calculator", "schema": {"type": "fn"}}, "tool schema must be"),
    ({"name": "calculator", "schema": {"type": "function", "function": {"description": "x"}}}, "has no name"),
])
def test_tool_entry_errors(entry, match, user_module):
    with pytest.raises(ValueError, match=match):
        load_tools({"tools": [entry]})


def test_duplicate_tool_names_and_top_level_keys():
    with pytest.raises(ValueError, match="duplicate tool name 'calculator'"):
        load_tools([{"name": "calculator"}, {"name": "calculator"}])
    with pytest.raises(ValueError, match="unknown key 'tool'"):
        load_tools({"tool": []})


def test_register_tool_and_loop_reads_tool_config_path(tmp_path, hermes_tok):
    @register_tool("test_reverse")
    class Reverse(Tool):
        default_schema = {"type": "function", "function": {
            "name": "reverse", "description": "Reverse a string.",
            "parameters": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}}

        async def call(self, arguments, state):
            return arguments["s"][::-1]

    try:
        path = tmp_path / "tools.yaml"
        path.write_text("tools:\n  - name: test_reverse\n")
        tok = hermes_tok
        sampler = ScriptedSampler([enc(tok, hermes_call("reverse", {"s": "abc"}) + IM_END), enc(tok, "cba" + IM_END)])
        loop = AgentLoop(sampler, tok, AgentConfig(tool_config_path=str(path)))
        assert list(loop.tools) == ["reverse"]
        (traj,) = run(loop.run([Episode(messages=[{"role": "user", "content": "reverse abc"}])]))
        assert "<tool_response>\ncba\n</tool_response>" in tok.decode(traj.response_ids)
        assert '"name": "reverse"' in tok.decode(traj.prompt_ids)  # the schema reached the prompt
    finally:
        TOOL_CLASSES.pop("test_reverse")


# -- environment mode -----------------------------------------------------------------------
def test_environment_from_config_with_episode_kwargs(hermes_tok, user_module):
    tok = hermes_tok
    cfg = AgentConfig(environment=EnvironmentConfig("rljax_test_user_mod:Countdown", {"steps": 2}))
    sampler = ScriptedSampler([enc(tok, "yes" + IM_END), enc(tok, "no" + IM_END), enc(tok, "yes" + IM_END)])
    eps = [Episode(messages=[{"role": "system", "content": "Be brief."}], env_kwargs={"question": "Q1?"}),
           Episode(env_kwargs={"steps": 3, "question": "Q2?"})]
    t1, t2 = run(run_episodes(sampler, eps, tok, cfg, tools=[CalculatorTool()]))
    assert (t1.num_turns, t1.termination, t1.reward) == (2, "env_done", 1.0)
    assert (t2.num_turns, t2.termination, t2.reward) == (3, "env_done", 2.0)
    assert all(e.closed for e in user_module.Countdown.instances)
    p1 = tok.decode(t1.prompt_ids)
    assert "Be brief." in p1 and "Q1?" in p1 and "calculator" not in p1  # tools are not used
    assert [m["role"] for m in t1.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_environment_max_turns_and_errors(hermes_tok, user_module):
    tok = hermes_tok
    env_cls = user_module.Countdown
    sampler = ScriptedSampler(lambda k, r: enc(tok, "yes" + IM_END))
    (traj,) = run(run_episodes(sampler, [Episode(environment=env_cls(steps=10))], tok, AgentConfig(max_turns=3)))
    assert traj.termination == "max_turns" and traj.num_turns == 3 and traj.reward == 3.0

    class Silent(env_cls):
        async def step(self, text):
            return [], 0.0, False

    env = Silent()
    with pytest.raises(ValueError, match="no messages"):
        run(run_episodes(sampler, [Episode(environment=env)], tok))
    assert env.closed  # closed even when the episode fails
