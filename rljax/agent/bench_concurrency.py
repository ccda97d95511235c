"""Episode throughput of the agent loop, concurrent vs sequential, on CPU with fake latency.

    python -m rljax.agent.bench_concurrency [--episodes 64] [--turns 3]
        [--sampler-latency 0.05] [--tool-latency 0.05] [--tokenizer PATH]

A scripted fake sampler sleeps ``sampler_latency`` per request (as a continuously batched
engine would: concurrent requests overlap) and a sleep tool waits ``tool_latency`` per call.
Every episode makes ``turns - 1`` tool calls and then answers. The same episodes run once with
all of them in flight (``asyncio.gather``) and once with ``max_concurrency=1``; the figure is
episodes per second for each and their ratio. The token work (rendering observation deltas,
decoding for parsing) is real, with a tiny self-built tokenizer unless ``--tokenizer`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rljax.agent.config import AgentConfig
from rljax.agent.loop import AgentLoop, Episode
from rljax.agent.testing import ScriptedSampler, build_tiny_chat_tokenizer
from rljax.agent.tools.base import Tool, ToolResult


class _SleepTool(Tool):
    default_schema = {
        "type": "function",
        "function": {"name": "sleep", "description": "Wait.",
                     "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}},
                                    "required": ["seconds"]}},
    }

    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult:
        await asyncio.sleep(float(arguments["seconds"]))
        return ToolResult("ok")


def run_benchmark(num_episodes: int = 64, turns: int = 3, sampler_latency_s: float = 0.05,
                  tool_latency_s: float = 0.05, tokenizer: Any = None) -> dict[str, float]:
    """Run the benchmark and return throughput figures (episodes/s) and the speedup."""
    tok = tokenizer if tokenizer is not None else build_tiny_chat_tokenizer("hermes")
    call = ('<tool_call>\n{"name": "sleep", "arguments": {"seconds": ' + repr(tool_latency_s)
            + '}}\n</tool_call><|im_end|>')
    script = [tok.encode(call, add_special_tokens=False)] * (turns - 1)
    script.append(tok.encode("The answer is 42.<|im_end|>", add_special_tokens=False))
    cfg = AgentConfig(max_turns=turns, max_response_tokens=8192)
    episodes = [Episode(messages=[{"role": "user", "content": f"Task number {i}."}])
                for i in range(num_episodes)]

    def once(max_concurrency: int | None) -> tuple[float, ScriptedSampler]:
        sampler = ScriptedSampler(script, latency_s=sampler_latency_s)
        loop = AgentLoop(sampler, tok, cfg, tools=[_SleepTool()])
        t0 = time.perf_counter()
        trajs = asyncio.run(loop.run(episodes, max_concurrency=max_concurrency))
        elapsed = time.perf_counter() - t0
        assert all(t.num_turns == turns and t.termination == "stop" for t in trajs)
        return elapsed, sampler

    concurrent_s, sampler = once(None)
    sequential_s, _ = once(1)
    return {
        "num_episodes": num_episodes,
        "turns": turns,
        "sampler_latency_s": sampler_latency_s,
        "tool_latency_s": tool_latency_s,
        "concurrent_s": concurrent_s,
        "sequential_s": sequential_s,
        "concurrent_episodes_per_s": num_episodes / concurrent_s,
        "sequential_episodes_per_s": num_episodes / sequential_s,
        "speedup": sequential_s / concurrent_s,
        "max_requests_in_flight": sampler.max_in_flight,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--sampler-latency", type=float, default=0.05)
    ap.add_argument("--tool-latency", type=float, default=0.05)
    ap.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizer folder (default: tiny)")
    args = ap.parse_args(argv)
    tok = None
    if args.tokenizer:
        from rljax.data.tokenizer import load_hf_tokenizer

        tok = load_hf_tokenizer(args.tokenizer)
    result = run_benchmark(args.episodes, args.turns, args.sampler_latency, args.tool_latency, tok)
    print(json.dumps(result, indent=2))
    print(f"concurrent: {result['concurrent_episodes_per_s']:.1f} episodes/s, "
          f"sequential: {result['sequential_episodes_per_s']:.1f} episodes/s, "
          f"speedup x{result['speedup']:.1f}")
    return result


if __name__ == "__main__":
    main()
