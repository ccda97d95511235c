"""`rljax bench agent`: agent-loop episode throughput, all episodes in flight vs one at a time.

Two modes, the same comparison:

- default (no model): a scripted sampler that answers each request after
  `--sampler-latency` seconds (overlapping requests overlap, as in a continuously batched
  engine) and a tool that sleeps `--tool-latency` seconds; every episode makes
  `--turns - 1` tool calls, then answers. The token work (rendering observation deltas,
  parsing calls) is real. This isolates the loop's scheduling from model speed.
- `--model HF_DIR --agent-config YAML`: the real thing. The rljax sampler on a trained
  policy (e.g. `rljax export runs/agent_quickstart --out aq_hf`), the agent section of a
  config (tools, parser, chat template, turn limits: e.g. configs/agent_quickstart.yaml),
  and prompts of the synthetic tool-arithmetic task. Reports episodes/s and sampled
  tokens/s, the tool-use rate, and how many requests the sampler batched at once.

Concurrent: `AgentLoop.run(episodes)` (all in flight, the sampler batches their
requests). Sequential: `max_concurrency=1` (one episode at a time, as a loop that awaits
each episode would). Real mode also runs the concurrent case with the sampler's prefix
caching off (each turn then recomputes the whole conversation). Each mode first runs
untimed until a run compiles no new shape (the shapes depend on how requests happen to
meet), then `--repeats` timed runs (the fastest is kept).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

HELP = "Agent-loop episode throughput: concurrent vs sequential (scripted latency or a real model)."


def add_arguments(p) -> None:
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=3, help="scripted mode: turns per episode")
    p.add_argument("--sampler-latency", type=float, default=0.05, help="scripted mode: seconds per request")
    p.add_argument("--tool-latency", type=float, default=0.05, help="scripted mode: seconds per tool call")
    p.add_argument("--model", default=None, help="a Hugging Face folder with a trained policy and its tokenizer")
    p.add_argument("--agent-config", default="configs/agent_quickstart.yaml",
                   help="YAML whose `agent:` section configures the loop (real mode)")
    p.add_argument("--temperature", type=float, default=0.7, help="real mode: sampling temperature")
    p.add_argument("--max-tokens", type=int, default=128, help="real mode: response tokens per episode")
    p.add_argument("--repeats", type=int, default=3, help="real mode: timed runs per mode (best is kept)")
    p.add_argument("--out", default="bench_results/agent.json")


def _scripted(args) -> dict:
    from rljax.bench.scripted_agent import run_benchmark

    result = run_benchmark(args.episodes, args.turns, args.sampler_latency, args.tool_latency)
    return {"mode": "scripted", **result}


def _real(args) -> dict:
    import numpy as np
    import yaml
    from rljax.agent import AgentLoop, Episode, RolloutSamplerAdapter
    from rljax.agent.tools.registry import load_tools
    from rljax.data.synthetic_tools import make_rows
    from rljax.data.tokenizer import load_hf_tokenizer
    from rljax.models import load_hf
    from rljax.rl.agent_rollout import agent_config
    from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig, SamplingParams

    with open(args.agent_config) as fh:
        raw = (yaml.safe_load(fh) or {}).get("agent")
    if not raw:
        raise SystemExit(f"{args.agent_config}: no `agent:` section")
    config = agent_config(raw)
    config = dataclasses.replace(config, max_response_tokens=min(config.max_response_tokens, args.max_tokens))
    tools = load_tools(config.tool_config_path) if config.tool_config_path else None
    tokenizer = load_hf_tokenizer(args.model)
    model = load_hf(args.model, dtype="float32")
    sampler = Sampler(model, SamplerConfig(max_num_seqs=max(args.episodes, 1), max_num_batched_tokens=4096,
                                           max_model_len=256 + args.max_tokens, kv_cache=KVCacheConfig(page_size=16)))
    rows = make_rows("rl", args.episodes, seed=3, min_digits=3, max_digits=3, tools=False)
    loop = AgentLoop(RolloutSamplerAdapter(sampler), tokenizer, config, tools=tools)
    stop = tuple(sorted(loop.tool_formatter.turn_end_ids))

    def episodes():
        return [Episode(messages=list(r["prompt"]), group_id=i,
                        sampling_params=SamplingParams(temperature=args.temperature, seed=i, stop_token_ids=stop))
                for i, r in enumerate(rows)]

    def once(limit: int | None, prefix_caching: bool):
        engine = sampler.engine
        engine.set_prefix_caching(prefix_caching)
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()  # forget earlier runs: only this run's turns may hit
        t0 = time.perf_counter()
        trajectories = asyncio.run(loop.run(episodes(), max_concurrency=limit))
        return time.perf_counter() - t0, trajectories

    out = {"mode": "model", "model": args.model, "num_episodes": args.episodes, "repeats": args.repeats}
    modes = (("concurrent", None, True), ("sequential", 1, True), ("concurrent_no_prefix_cache", None, False))
    for name, limit, caching in modes:
        for _ in range(6):  # warm up until a run compiles nothing new (timing decides the shapes)
            before = sampler.stats()["num_compiled_programs"]
            once(limit, caching)
            if sampler.stats()["num_compiled_programs"] == before:
                break
        seconds, trajectories = min((once(limit, caching) for _ in range(args.repeats)), key=lambda r: r[0])
        tokens = sum(int(np.sum(t.response_mask)) for t in trajectories)
        out[f"{name}_s"] = seconds
        out[f"{name}_episodes_per_s"] = args.episodes / seconds
        out[f"{name}_sampled_tokens_per_s"] = tokens / seconds
        out[f"{name}_tool_use_rate"] = float(np.mean([t.tool_calls > 0 for t in trajectories]))
        out[f"{name}_mean_turns"] = float(np.mean([t.num_turns for t in trajectories]))
    out["speedup"] = out["sequential_s"] / out["concurrent_s"]
    out["prefix_cache_speedup"] = out["concurrent_no_prefix_cache_s"] / out["concurrent_s"]
    out["compiled_programs"] = sampler.stats()["num_compiled_programs"]
    sampler.close()
    return out


def main(args) -> int:
    from rljax.bench.report import print_table, write_json

    load_before = os.getloadavg()[0]
    result = _real(args) if args.model else _scripted(args)
    result["load_avg"] = (load_before, os.getloadavg()[0])
    table = [{"episodes": result["num_episodes"],
              "concurrent_ep_s": result["concurrent_episodes_per_s"],
              "sequential_ep_s": result["sequential_episodes_per_s"],
              "speedup": result["speedup"]}]
    print(f"mode={result['mode']} cpus={os.cpu_count()} load_avg(start, end)=({result['load_avg'][0]:.1f}, "
          f"{result['load_avg'][1]:.1f})")
    print_table(table, list(table[0]))
    if result["mode"] == "model":
        print(f"sampled tokens/s: concurrent {result['concurrent_sampled_tokens_per_s']:.0f}, sequential "
              f"{result['sequential_sampled_tokens_per_s']:.0f}; tool-use rate {result['concurrent_tool_use_rate']:.2f}; "
              f"compiled programs {result['compiled_programs']}")
        print(f"concurrent without prefix caching: {result['concurrent_no_prefix_cache_episodes_per_s']:.1f} "
              f"episodes/s (prefix caching x{result['prefix_cache_speedup']:.2f})")
    write_json(args.out, "agent", table, result)
    return 0
