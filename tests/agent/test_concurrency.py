"""Concurrency: episodes overlap (checked by event order, not wall-clock), limits hold."""

from __future__ import annotations

import asyncio

import pytest

from rljax.agent import AgentConfig, AgentLoop, Episode, run_episodes
from rljax.bench.scripted_agent import run_benchmark
from rljax.bench.scripted_agent import ScriptedSampler

from .helpers import SleepTool, enc, hermes_call, run

IM_END = "<|im_end|>"


def sleep_script(tok, seconds: float = 0.3, tag: str = "x", calls: int = 1):
    call = "\n".join(hermes_call("sleep", {"seconds": seconds, "tag": f"{tag}{i}"}) for i in range(calls))
    return [enc(tok, call + IM_END), enc(tok, "done" + IM_END)]


def episodes(n: int):
    return [Episode(messages=[{"role": "user", "content": f"task {i}"}], group_id=i) for i in range(n)]


@pytest.mark.slow
def test_episodes_overlap_on_tool_latency(hermes_tok):
    """N episodes with a sleeping tool: every tool call starts before any ends."""
    n = 8
    tool = SleepTool()
    sampler = ScriptedSampler(sleep_script(hermes_tok), latency_s=0.01)
    trajs = run(run_episodes(sampler, episodes(n), hermes_tok, tools=[tool]))
    assert [t.group_id for t in trajs] == list(range(n))  # results in input order
    kinds = [e[0] for e in tool.events]
    assert kinds == ["start"] * n + ["end"] * n
    assert tool.max_in_flight == n
    # the sampler saw all first-turn requests before answering any: shared batching
    first_ends = [i for i, (k, _) in enumerate(sampler.events) if k == "end"]
    first_starts = [i for i, (k, _) in enumerate(sampler.events) if k == "start"]
    assert max(first_starts[:n]) < min(first_ends)
    assert sampler.max_in_flight == n


def test_episode_concurrency_limit(hermes_tok):
    tool = SleepTool()
    sampler = ScriptedSampler(sleep_script(hermes_tok, seconds=0.05), latency_s=0.01)
    trajs = run(run_episodes(sampler, episodes(6), hermes_tok, tools=[tool], max_concurrency=2))
    assert len(trajs) == 6 and all(t.termination == "stop" for t in trajs)
    assert sampler.max_in_flight <= 2 and tool.max_in_flight <= 2
    assert tool.max_in_flight == 2  # but they do overlap

    sampler = ScriptedSampler(sleep_script(hermes_tok, seconds=0.05), latency_s=0.01)
    tool = SleepTool()
    run(run_episodes(sampler, episodes(3), hermes_tok, tools=[tool], max_concurrency=1))
    assert [e[0] for e in tool.events] == ["start", "end"] * 3  # strictly sequential


def test_parallel_tool_calls_in_one_turn_are_limited(hermes_tok):
    tool = SleepTool()
    sampler = ScriptedSampler(sleep_script(hermes_tok, seconds=0.05, calls=5))
    cfg = AgentConfig(max_parallel_tool_calls=2)
    (traj,) = run(run_episodes(sampler, episodes(1), hermes_tok, cfg, tools=[tool]))
    assert tool.max_in_flight == 2 and traj.tool_calls == 5
    text = hermes_tok.decode(traj.response_ids)
    assert text.count("slept 0.05") == 5


def test_global_tool_call_limit(hermes_tok):
    tool = SleepTool()
    sampler = ScriptedSampler(sleep_script(hermes_tok, seconds=0.05, calls=3))
    cfg = AgentConfig(max_parallel_tool_calls=3, max_concurrent_tool_calls=4)
    run(run_episodes(sampler, episodes(4), hermes_tok, cfg, tools=[tool]))
    assert tool.max_in_flight == 4


def test_sampler_failure_cancels_the_other_episodes(hermes_tok):
    """Episode 3 fails at its second turn while episodes 0-2 sit in a long tool call."""
    tok = hermes_tok

    def script(turn, request):
        if turn == 0:
            seconds = 0.01 if "task 3" in tok.decode(request.prompt_token_ids) else 30.0
            return enc(tok, hermes_call("sleep", {"seconds": seconds}) + IM_END)
        return enc(tok, "done" + IM_END)

    class Failing(ScriptedSampler):
        async def generate_async(self, request):
            if self.turn_index(request.prompt_token_ids) == 1:
                raise RuntimeError("sampler died")
            return await super().generate_async(request)

    tool = SleepTool()
    loop = AgentLoop(Failing(script), tok, tools=[tool])

    async def main():
        with pytest.raises(RuntimeError, match="sampler died"):
            await loop.run(episodes(4))
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert run(main()) == []  # nothing left running
    assert tool.cancelled == 3  # the three long tool calls were cancelled, not awaited


def test_benchmark_function_reports_speedup():
    result = run_benchmark(num_episodes=8, turns=2, sampler_latency_s=0.01, tool_latency_s=0.01)
    assert result["num_episodes"] == 8 and result["max_requests_in_flight"] == 8
    assert result["concurrent_episodes_per_s"] > 0 and result["sequential_episodes_per_s"] > 0
    assert result["speedup"] == pytest.approx(
        result["concurrent_episodes_per_s"] / result["sequential_episodes_per_s"])
