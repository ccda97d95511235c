"""The asyncio agent loop: one explicit state machine per episode, many episodes at once.

Each episode runs as its own coroutine through these states::

    PENDING ──► GENERATING ──► CALLING_TOOLS ──► GENERATING ──► ... ──► DONE
                     │   ▲                          (tools mode)
                     │   └──── INTERACTING ◄──┘     (environment mode)
                     └──────────────────────────────► DONE

- PENDING: build the environment (if any), render and tokenize the prompt once.
- GENERATING: one ``await sampler.generate_async(...)`` on the episode's token buffer with a
  per-turn ``max_tokens = min(max_response_tokens - response so far, max_tokens_per_turn)``
  (it replaces any ``max_tokens`` in the sampling params); sampled tokens are
  appended as sampled (mask 1, their log_probs; a routing record, when the sampler returns
  one, is kept for the trajectory's `expert_ids`). Then: a turn cut by ``max_tokens`` ends the
  episode; in environment mode go to INTERACTING; otherwise parse tool calls from the decoded
  turn: none -> DONE (``stop``), ``max_turns`` reached -> DONE, else CALLING_TOOLS.
- CALLING_TOOLS: run the turn's calls concurrently (``max_parallel_tool_calls`` per episode,
  ``max_concurrent_tool_calls`` across episodes), each with ``tool_timeout_s``. Malformed
  calls, unknown tools, schema-invalid arguments, exceptions and timeouts become error
  observations (and ``agent/tool_errors/<kind>`` counts); the episode goes on.
- INTERACTING: ``await environment.step(text)``; add its reward; DONE if it says so or
  ``max_turns`` is reached.
- Observations (tool results or environment messages) are appended as one chat-template
  delta (mask 0; see `rljax.agent.chat_deltas` for the exact boundary convention). If the delta does
  not fit in the budget (keeping ``min_turn_tokens`` for the next turn), it is truncated in
  tokens or the episode ends (``overflow: truncate|end``).

Because every episode awaits its own sampler request, hundreds of episodes at different turns
are in flight together and share the sampler's continuous batching; `run_episodes` gathers
them (with an optional concurrency limit).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rljax.agent.chat_deltas import ChatFormatter
from rljax.agent.config import AgentConfig
from rljax.agent.environment import EnvStep, Environment
from rljax.agent.parser import ToolCall, get_tool_parser
from rljax.agent.protocol import (
    AsyncSampler,
    TurnRequest,
    get_param,
    validate_completion,
    with_max_tokens,
)
from rljax.agent.tools.base import ERROR_KINDS, PerLoopSemaphore, Tool, ToolResult, maybe_await
from rljax.agent.tools.registry import import_object, load_tools
from rljax.agent.trajectory import Trajectory, TrajectoryBuilder

logger = logging.getLogger(__name__)

RewardFn = Callable[[Trajectory], "float | Awaitable[float]"]


class EpisodeState(str, enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    CALLING_TOOLS = "calling_tools"
    INTERACTING = "interacting"
    DONE = "done"


@dataclass
class Episode:
    """One episode to run.

    Attributes:
        messages: the initial chat messages (system/user...). In environment mode the
            environment's `reset()` messages are appended to them.
        environment: a ready per-episode `Environment` (overrides ``config.environment``);
            give every episode its own instance (GRPO samples of one prompt too).
        env_kwargs: keyword arguments for the ``config.environment`` class, per episode.
        sampling_params: per-episode sampling params (default: the loop's).
        group_id: the prompt group (GRPO/RLOO); copied to the trajectory.
        metadata: anything (ground truth, data_source...); copied to the trajectory.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    environment: Environment | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling_params: Any = None
    group_id: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class AgentLoop:
    """Runs episodes against an `AsyncSampler` with tools or an environment.

    Args:
        sampler: anything with ``async generate_async(TurnRequest) -> TurnOutput``.
        tokenizer: a Hugging Face tokenizer with a chat template.
        config: `AgentConfig`.
        tools: tools by function name; default: loaded from ``config.tool_config_path``.
        sampling_params: default sampling params (opaque; ``max_tokens`` is set per turn).
        reward_fn: optional ``fn(trajectory) -> float`` (sync or async) added to the reward.
    """

    def __init__(
        self,
        sampler: AsyncSampler,
        tokenizer: Any,
        config: AgentConfig | None = None,
        tools: Mapping[str, Tool] | Sequence[Tool] | None = None,
        sampling_params: Any = None,
        reward_fn: RewardFn | None = None,
    ):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config or AgentConfig()
        if tools is None and self.config.tool_config_path:
            tools = load_tools(self.config.tool_config_path)
        if isinstance(tools, Sequence):
            tools = {t.name: t for t in tools}
        self.tools: dict[str, Tool] = dict(tools or {})
        self.parser = get_tool_parser(self.config.tool_parser)
        common = dict(
            chat_template_kwargs=self.config.chat_template_kwargs,
            end_of_turn_token=self.config.end_of_turn_token,
            extra_turn_end_tokens=self.config.extra_turn_end_tokens,
            chat_template=self.config.chat_template,
        )
        self.tool_formatter = ChatFormatter(
            tokenizer, tools=[t.schema for t in self.tools.values()] or None, **common
        )
        self.plain_formatter = ChatFormatter(tokenizer, tools=None, **common)
        self.sampling_params = sampling_params if sampling_params is not None else {}
        self.reward_fn = reward_fn
        self.env_class: type | None = None
        if self.config.environment is not None:
            self.env_class = import_object(self.config.environment.class_name)
        n = self.config.max_concurrent_tool_calls
        self._global_tool_sem = PerLoopSemaphore(n) if n else None

    async def run_episode(self, episode: Episode) -> Trajectory:
        """Run one episode to completion."""
        return await _EpisodeRun(self, episode).run()

    async def run(self, episodes: Sequence[Episode], max_concurrency: int | None = None) -> list[Trajectory]:
        """Run episodes concurrently (at most `max_concurrency` in flight); results in order.

        If one episode raises (a sampler error, a broken environment), the others are
        cancelled and the exception propagates. Tool failures never raise.
        """
        limit = max_concurrency or self.config.max_concurrent_episodes
        sem = asyncio.Semaphore(limit) if limit else None

        async def one(ep: Episode) -> Trajectory:
            if sem is None:
                return await self.run_episode(ep)
            async with sem:
                return await self.run_episode(ep)

        tasks = [asyncio.ensure_future(one(ep)) for ep in episodes]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise


async def run_episodes(
    sampler: AsyncSampler,
    episodes: Sequence[Episode],
    tokenizer: Any,
    config: AgentConfig | None = None,
    tools: Mapping[str, Tool] | Sequence[Tool] | None = None,
    sampling_params: Any = None,
    max_concurrency: int | None = None,
    reward_fn: RewardFn | None = None,
) -> list[Trajectory]:
    """Run many episodes concurrently with ``asyncio.gather``; see `AgentLoop`."""
    loop = AgentLoop(sampler, tokenizer, config, tools, sampling_params, reward_fn)
    return await loop.run(episodes, max_concurrency=max_concurrency)


class _EpisodeRun:
    """The state machine of one episode (see module docstring)."""

    def __init__(self, agent: AgentLoop, episode: Episode):
        self.agent = agent
        self.cfg = agent.config
        self.episode = episode
        self.state = EpisodeState.PENDING
        self.states: list[str] = []
        self.env: Environment | None = episode.environment
        self.formatter = agent.tool_formatter
        self.sampling_params = (
            episode.sampling_params if episode.sampling_params is not None else agent.sampling_params
        )
        self.buf: TrajectoryBuilder | None = None
        self.messages: list[dict[str, Any]] = []
        self.turns = 0
        self.last_text = ""
        self.pending_calls: list[ToolCall] = []
        self.tool_calls = 0
        self.tool_call_counts: Counter[str] = Counter()
        self.tool_errors: Counter[str] = Counter({k: 0 for k in ERROR_KINDS})
        self.env_reward = 0.0
        self.termination = ""
        self.metrics: Counter[str] = Counter()
        self.tool_states: dict[str, Any] = {}
        self.tool_state_locks: dict[str, asyncio.Lock] = {}
        self.episode_tool_sem = asyncio.Semaphore(self.cfg.max_parallel_tool_calls)

    # -- driver ---------------------------------------------------------------------------
    async def run(self) -> Trajectory:
        handlers = {
            EpisodeState.PENDING: self._start,
            EpisodeState.GENERATING: self._generate,
            EpisodeState.CALLING_TOOLS: self._call_tools,
            EpisodeState.INTERACTING: self._interact,
        }
        try:
            while self.state is not EpisodeState.DONE:
                self.states.append(self.state.value)
                self.state = await handlers[self.state]()
            self.states.append(EpisodeState.DONE.value)
            return await self._finish()
        finally:
            await self._cleanup()

    def _done(self, reason: str) -> EpisodeState:
        self.termination = reason
        return EpisodeState.DONE

    # -- states ---------------------------------------------------------------------------
    async def _start(self) -> EpisodeState:
        messages = list(self.episode.messages)
        if self.env is None and self.agent.env_class is not None:
            opts = {**self.cfg.environment.options, **self.episode.env_kwargs}  # type: ignore[union-attr]
            self.env = self.agent.env_class(**opts)
        if self.env is not None:
            self.formatter = self.agent.plain_formatter
            messages += list(await self.env.reset())
        if not messages:
            raise ValueError("an episode needs initial messages (or an environment that provides them)")
        self.messages = messages
        self.buf = TrajectoryBuilder(self.formatter.prompt_ids(messages))
        return EpisodeState.GENERATING

    async def _generate(self) -> EpisodeState:
        assert self.buf is not None
        remaining = self.cfg.max_response_tokens - self.buf.response_length
        if remaining <= 0:
            return self._done("max_response_tokens")
        max_tokens = remaining
        if self.cfg.max_tokens_per_turn is not None:
            max_tokens = min(max_tokens, self.cfg.max_tokens_per_turn)
        request = TurnRequest(
            prompt_token_ids=self.buf.token_buffer(),
            sampling_params=with_max_tokens(self.sampling_params, max_tokens),
        )
        t0 = time.perf_counter()
        completion = await self.agent.sampler.generate_async(request)
        self.metrics["timing_s/generate"] += time.perf_counter() - t0
        validate_completion(completion, max_tokens)
        self.buf.append_sampled(completion.token_ids, completion.log_probs)
        if getattr(completion, "expert_ids", None) is not None:  # MoE routing record (routing replay)
            self.buf.record_routing(request.prompt_token_ids, completion.token_ids, completion.expert_ids)
        self.turns += 1
        self.last_text = self._turn_text(completion.token_ids, completion.finish_reason)
        self.messages.append({"role": "assistant", "content": self.last_text})
        if completion.finish_reason == "length":
            if self.buf.response_length >= self.cfg.max_response_tokens:
                return self._done("max_response_tokens")
            if len(completion.token_ids) == self.cfg.max_tokens_per_turn:
                return self._done("max_tokens_per_turn")
            return self._done("length")  # e.g. the sampler's own context limit
        if self.env is not None:
            return EpisodeState.INTERACTING
        parsed = self.agent.parser.parse(self.last_text)
        if not parsed.calls:
            return self._done("stop")
        if self.turns >= self.cfg.max_turns:
            return self._done("max_turns")
        self.pending_calls = parsed.calls
        return EpisodeState.CALLING_TOOLS

    async def _call_tools(self) -> EpisodeState:
        calls, self.pending_calls = self.pending_calls, []
        t0 = time.perf_counter()
        results = await asyncio.gather(*(self._one_call(c) for c in calls))
        self.metrics["timing_s/tool"] += time.perf_counter() - t0
        observation = []
        for call, result in zip(calls, results):
            msg = {"role": "tool", "content": result.text}
            if call.name:
                msg["name"] = call.name
            observation.append(msg)
        return self._observe(observation)

    async def _interact(self) -> EpisodeState:
        assert self.env is not None
        step = await self.env.step(self.last_text)
        messages, reward, done = EnvStep(*step)
        self.env_reward += float(reward)
        if done:
            return self._done("env_done")
        if self.turns >= self.cfg.max_turns:
            return self._done("max_turns")
        if not messages:
            raise ValueError("Environment.step returned no messages with done=False")
        return self._observe(list(messages))

    # -- helpers --------------------------------------------------------------------------
    def _turn_text(self, token_ids: Sequence[int], finish_reason: str) -> str:
        """Decoded turn for parsing/logging, without its final stop token."""
        ids = list(token_ids)
        stops = set(self.formatter.turn_end_ids)
        stops.update(get_param(self.sampling_params, "stop_token_ids", None) or [])
        if finish_reason == "stop" and ids and ids[-1] in stops:
            ids = ids[:-1]
        return self.formatter.decode(ids)

    def _observe(self, messages: list[dict[str, Any]]) -> EpisodeState:
        """Append the observation delta (closing the turn first if needed), or end."""
        assert self.buf is not None
        closing = [] if self.buf.last_token() in self.formatter.turn_end_ids else [self.formatter.end_of_turn_id]
        available = (self.cfg.max_response_tokens - self.buf.response_length - len(closing)
                     - self.cfg.min_turn_tokens)
        if self.cfg.overflow == "end":
            ids = self.formatter.observation_ids(messages)
            if len(ids) > available:
                return self._done("overflow")
        else:
            fitted = self.formatter.fit_observation(messages, max(available, 0))
            if fitted is None:
                return self._done("overflow")
            ids, truncated = fitted
            if truncated:
                self.metrics["observation_truncated"] += 1
        if closing:
            self.metrics["turns_closed_by_loop"] += 1
        self.buf.append_observation(closing + ids)
        self.messages.extend(messages)
        return EpisodeState.GENERATING

    async def _one_call(self, call: ToolCall) -> ToolResult:
        """Execute one call; every failure becomes an error `ToolResult`, never an exception."""
        self.tool_calls += 1
        result = await self._execute(call)
        if call.name:
            self.tool_call_counts[call.name] += 1
        if result.error:
            self.tool_errors[result.error] += 1
        return result

    async def _execute(self, call: ToolCall) -> ToolResult:
        if call.malformed:
            return ToolResult(f"Error: malformed tool call: {call.error}", error="malformed")
        tool = self.agent.tools.get(call.name or "")
        if tool is None:
            names = ", ".join(sorted(self.agent.tools)) or "none"
            return ToolResult(f"Error: unknown tool {call.name!r}. Available tools: {names}.",
                              error="unknown_tool")
        problems = tool.validate_arguments(call.arguments or {})
        if problems:
            return ToolResult(f"Error: invalid arguments for {tool.name}: " + "; ".join(problems),
                              error="bad_arguments")
        async with self.episode_tool_sem:
            if self.agent._global_tool_sem is None:
                return await self._invoke(tool, call.arguments or {})
            async with self.agent._global_tool_sem.get():
                return await self._invoke(tool, call.arguments or {})

    async def _invoke(self, tool: Tool, arguments: dict[str, Any]) -> ToolResult:
        try:
            state = await self._tool_state(tool)
            out = await asyncio.wait_for(tool.call(arguments, state), self.cfg.tool_timeout_s)
        except asyncio.TimeoutError:
            return ToolResult(f"Error: tool {tool.name} timed out after {self.cfg.tool_timeout_s:g} s",
                              error="timeout")
        except Exception as e:  # noqa: BLE001 - every tool failure is an observation
            return ToolResult(f"Error: tool {tool.name} raised {type(e).__name__}: {e}", error="exception")
        if isinstance(out, str):
            return ToolResult(out)
        if not isinstance(out, ToolResult):
            return ToolResult(f"Error: tool {tool.name} returned {type(out).__name__}, not text",
                              error="exception")
        return out

    async def _tool_state(self, tool: Tool) -> Any:
        lock = self.tool_state_locks.setdefault(tool.name, asyncio.Lock())
        async with lock:
            if tool.name not in self.tool_states:
                self.tool_states[tool.name] = await maybe_await(tool.create_state())
        return self.tool_states[tool.name]

    async def _finish(self) -> Trajectory:
        assert self.buf is not None
        reward_info: dict[str, float] = {}
        if self.env is not None:
            reward_info["env"] = self.env_reward
        for name, state in self.tool_states.items():
            r = await maybe_await(self.agent.tools[name].reward(state))
            if r is not None:
                reward_info[f"tool/{name}"] = float(r)
        traj = self.buf.build(
            num_turns=self.turns,
            tool_calls=self.tool_calls,
            tool_call_counts=dict(self.tool_call_counts),
            tool_errors=dict(self.tool_errors),
            termination=self.termination,
            messages=self.messages,
            states=self.states,
            group_id=self.episode.group_id,
            metadata=dict(self.episode.metadata),
        )
        traj.metrics = dict(self.metrics)
        if self.agent.reward_fn is not None:
            reward_info["reward_fn"] = float(await maybe_await(self.agent.reward_fn(traj)))
        traj.reward_info = reward_info
        traj.reward = float(sum(reward_info.values()))
        return traj

    async def _cleanup(self) -> None:
        for name, state in self.tool_states.items():
            try:
                await maybe_await(self.agent.tools[name].release(state))
            except Exception:  # noqa: BLE001
                logger.exception("releasing the state of tool %s failed", name)
        if self.env is not None:
            try:
                await self.env.close()
            except Exception:  # noqa: BLE001
                logger.exception("closing the environment failed")


# why an episode ends (`Trajectory.termination`)
TERMINATIONS = ("stop", "max_turns", "max_response_tokens", "max_tokens_per_turn", "length", "env_done", "overflow")


def collect_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch metrics with verl-style names (``agent/...``); how each combines over rollouts
    and replicas is declared in `rljax.metrics.REDUCTIONS`. Every termination reason is
    reported (a fraction, 0 when no episode ended so), so that combining never leaves a
    part out of a fraction."""
    if not trajectories:
        return {}
    out: dict[str, float] = {}

    def stats(name: str, values: Sequence[float]) -> None:
        arr = np.asarray(values, dtype=np.float64)
        out[f"{name}/mean"] = float(arr.mean())
        out[f"{name}/max"] = float(arr.max())
        out[f"{name}/min"] = float(arr.min())

    stats("agent/num_turns", [t.num_turns for t in trajectories])
    stats("agent/tool_calls", [t.tool_calls for t in trajectories])
    stats("agent/response_length", [len(t.response_ids) for t in trajectories])
    stats("agent/observation_tokens", [t.num_observation_tokens for t in trajectories])
    stats("agent/reward", [t.reward for t in trajectories])
    for kind in ERROR_KINDS:
        out[f"agent/tool_errors/{kind}"] = float(sum(t.tool_errors.get(kind, 0) for t in trajectories))
    out["agent/tool_errors/total"] = float(sum(out[f"agent/tool_errors/{k}"] for k in ERROR_KINDS))
    by_name: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    extra: Counter[str] = Counter()
    for t in trajectories:
        by_name.update(t.tool_call_counts)
        reasons[t.termination] += 1
        extra.update(t.metrics)
    for name, n in by_name.items():
        out[f"agent/tool_calls_by_name/{name}"] = float(n)
    for reason in dict.fromkeys([*TERMINATIONS, *reasons]):  # every known reason, 0 when none ended so
        out[f"agent/termination/{reason}"] = float(reasons[reason]) / len(trajectories)
    for key, v in extra.items():
        out[f"agent/{key}"] = float(v)
    return out
