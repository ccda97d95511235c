"""RL-shaped and agent-shaped generation workloads, run on the rljax engine with split
steps (a prefill call stops every decode), with mixed steps (`SamplerConfig.mixed_steps`:
decodes ride along with prefill chunks) and on `transformers` `generate`; used by
`rljax bench sampler`. Where the configured paged attention is not the reference (on a
CPU, `auto` is `blocked`), a third engine runs split steps on the reference attention
(`dense`: every decode step gathers each row's whole padded page table), so the table
separates what the attention gives from what mixing gives.

- RL-shaped: prompts of mixed lengths (uniform in [prompt_len / 2, 3 * prompt_len / 2]),
  n samples each at temperature 1, every response ending at a stop token or the cap (a
  stop set of `vocab / mean_len` ids: a random model's next token is close to uniform, so
  lengths are roughly geometric with that mean). rljax takes every request at once with
  `concurrency` sequences in flight; transformers runs `concurrency / n` prompts per
  `generate` call (left-padded), each call running until its longest row stops.
- Agent-shaped: episodes of `turns` turns. A turn samples a response (as above), then a
  tool output of random tokens (length uniform in `tool_tokens`) is appended, and the next
  turn continues from the whole conversation. rljax runs every episode as its own chain
  of requests (a finished turn's next request enters while the others decode; prefix
  caching on, cleared before each run), transformers runs the episodes' turns in
  lockstep batches.

The rljax engines draw the same tokens (a seeded request's keys do not depend on the
batch around it), so they do the same work. Reported per engine: sampled tokens/s and
`decode_wait_s`, the wall time of calls that left decode-ready sequences waiting.
Which shapes meet depends on timing, so a run may still meet a new one after warm-up:
the time JAX reports spending on tracing, lowering and compiling during a run
(`jax.monitoring` compile events) is subtracted from it and reported (`*_compile_s`;
the decode wait is as measured).
Each system is warmed up twice, then timed `repeats` times, interleaved (the fastest
run is kept).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

ENGINES = {"dense": (False, "reference"), "split": (False, None), "mixed": (True, None)}
# name -> (SamplerConfig.mixed_steps, attention; None: the configured one)
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


class CompileClock:
    """Seconds JAX reports spending on tracing, lowering and compiling while installed."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, event: str, duration: float, **_):
        if event in COMPILE_EVENTS:
            self.seconds += duration

    def __enter__(self):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self)


@dataclass(frozen=True)
class Workload:
    kind: str  # "rl" | "agent"
    prompts: list[list[int]]
    n: int  # samples per prompt (rl); 1 for agent episodes
    turns: int  # 1 for rl
    max_tokens: int  # response cap per turn
    stop_ids: list[int]
    concurrency: int  # sequences in flight
    tool_outputs: list[list[list[int]]]  # [episode][turn] random tokens appended after a turn (agent)


def make_workload(kind: str, rng, vocab: int, num_prompts: int, prompt_len: int, n: int, turns: int,
                  max_tokens: int, mean_len: int, concurrency: int, tool_tokens: tuple[int, int] = (16, 64)) -> Workload:
    stop_ids = sorted(int(t) for t in rng.permutation(np.arange(1, vocab))[: max(1, vocab // mean_len)])
    lengths = rng.integers(max(1, prompt_len // 2), prompt_len * 3 // 2 + 1, size=num_prompts)
    prompts = [rng.integers(0, vocab, size=int(m)).tolist() for m in lengths]
    lo, hi = tool_tokens
    tools = [[rng.integers(0, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(turns)]
             for _ in range(num_prompts)]
    if kind == "rl":
        return Workload("rl", prompts, n, 1, max_tokens, stop_ids, concurrency, tools)
    return Workload("agent", prompts, 1, turns, max_tokens, stop_ids, concurrency, tools)


def max_context(w: Workload) -> int:
    """The longest conversation the workload can build, in tokens."""
    longest_tool = max((len(t) for ep in w.tool_outputs for t in ep[:-1]), default=0)
    return max(len(p) for p in w.prompts) + w.turns * w.max_tokens + (w.turns - 1) * longest_tool


def _params(w: Workload, episode: int, turn: int):
    from rljax.rollout import SamplingParams

    return SamplingParams(n=w.n, temperature=1.0, max_tokens=w.max_tokens, stop_token_ids=w.stop_ids,
                          ignore_eos=True, seed=1000 * turn + episode)


def run_rljax(sampler, w: Workload) -> int:
    """Run the workload once; returns the sampled tokens."""
    if w.kind == "rl":
        return sum(len(c.token_ids) for c in sampler.generate(w.prompts, _params(w, 0, 0)))

    async def episode(i: int) -> int:
        context, sampled = list(w.prompts[i]), 0
        for turn in range(w.turns):
            (c,) = await sampler.generate_async(context, _params(w, i, turn))
            sampled += len(c.token_ids)
            context += c.token_ids + (w.tool_outputs[i][turn] if turn < w.turns - 1 else [])
        return sampled

    async def run_all() -> int:
        return sum(await asyncio.gather(*(episode(i) for i in range(len(w.prompts)))))

    return asyncio.run(run_all())


def run_hf(hf, w: Workload, device: str) -> int:
    """The same workload on transformers `generate` (left-padded batches of
    `concurrency / n` prompts; an agent's turns in lockstep); returns the sampled tokens."""
    import torch

    stop = torch.tensor(w.stop_ids, device=device)
    per_call = max(1, w.concurrency // w.n)
    total = 0
    for start in range(0, len(w.prompts), per_call):
        contexts = [list(p) for p in w.prompts[start:start + per_call]]
        for turn in range(w.turns):
            width = max(len(c) for c in contexts)
            ids = torch.zeros((len(contexts), width), dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for i, c in enumerate(contexts):
                ids[i, width - len(c):] = torch.tensor(c, device=device)
                mask[i, width - len(c):] = 1
            with torch.no_grad():
                out = hf.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  num_return_sequences=w.n, max_new_tokens=w.max_tokens, eos_token_id=w.stop_ids,
                                  pad_token_id=0)
            new = out[:, width:]
            is_stop = torch.isin(new, stop)
            lengths = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1,
                                  torch.full_like(new[:, 0], new.shape[1])).tolist()
            total += sum(lengths)
            if turn < w.turns - 1:
                contexts = [c + new[i, :n].tolist() + w.tool_outputs[start + i][turn]
                            for i, (c, n) in enumerate(zip(contexts, lengths))]
    return total


def compare(model, w: Workload, sampler_config: dict, hf=None, device: str | None = None,
            repeats: int = 3) -> dict:
    """One table row: tokens/s and decode wait of each engine, transformers' tokens/s,
    and the ratios (mixed / split, mixed / dense, mixed / transformers)."""
    from rljax.rollout import Sampler, SamplerConfig
    from rljax.rollout.attention import resolve_paged_attention

    configured = sampler_config.get("attention", "auto")
    engines = {name: (mixed, attention or configured) for name, (mixed, attention) in ENGINES.items()
               if name != "dense" or resolve_paged_attention(configured) != "reference"}
    samplers = {name: Sampler(model, SamplerConfig(**{**sampler_config, "attention": attention}, mixed_steps=mixed))
                for name, (mixed, attention) in engines.items()}

    def once(name: str) -> tuple[float, int, float, float]:
        """(seconds without compilation, tokens, decode wait, compile seconds) of a run."""
        sampler = samplers[name]
        if sampler.engine.prefix_cache is not None:
            sampler.engine.prefix_cache.clear()  # only this run's own turns may hit
        stats = sampler.stats()
        with CompileClock() as clock:
            t0 = time.perf_counter()
            tokens = run_rljax(sampler, w)
            seconds = time.perf_counter() - t0
        wait = sampler.stats()["decode_wait_s"] - stats["decode_wait_s"]
        return seconds - clock.seconds, tokens, wait, clock.seconds

    for name in samplers:
        once(name)  # warm-up
        once(name)
    if hf is not None:
        run_hf(hf, w, device)
    best: dict[str, tuple[float, int, float, float]] = {}
    for _ in range(repeats):
        for name in samplers:
            result = once(name)
            if name not in best or result[0] < best[name][0]:
                best[name] = result
        if hf is not None:
            t0 = time.perf_counter()
            tokens = run_hf(hf, w, device)
            seconds = time.perf_counter() - t0
            if "hf" not in best or seconds < best["hf"][0]:
                best["hf"] = (seconds, tokens, 0.0, 0.0)
    tool = [len(t) for ep in w.tool_outputs for t in ep[:-1]] if w.kind == "agent" else []
    row = {"workload": w.kind, "prompts": len(w.prompts), "n": w.n, "turns": w.turns, "max_tokens": w.max_tokens,
           "concurrency": w.concurrency, "tool_tokens": f"{min(tool)}-{max(tool)}" if tool else "-"}
    for name, sampler in samplers.items():
        seconds, tokens, wait, compile_s = best[name]
        row[f"{name}_tok_s"] = tokens / seconds
        row[f"{name}_s"] = seconds
        row[f"{name}_wait_s"] = wait
        row[f"{name}_compile_s"] = compile_s
        row[f"{name}_tokens"] = tokens
        row[f"{name}_programs"] = sampler.stats()["num_compiled_programs"]
        sampler.close()
    row["mixed_vs_split"] = row["mixed_tok_s"] / row["split_tok_s"]
    if "dense" in samplers:
        row["mixed_vs_dense"] = row["mixed_tok_s"] / row["dense_tok_s"]
        row["split_vs_dense"] = row["split_tok_s"] / row["dense_tok_s"]
    if "hf" in best:
        row["hf_tok_s"] = best["hf"][1] / best["hf"][0]
        row["hf_tokens"] = best["hf"][1]
        row["mixed_vs_hf"] = row["mixed_tok_s"] / row["hf_tok_s"]
    return row


COLUMNS = ["workload", "prompts", "n", "turns", "tool_tokens", "dense_tok_s", "split_tok_s", "mixed_tok_s", "hf_tok_s",
           "mixed_vs_split", "mixed_vs_dense", "split_vs_dense", "mixed_vs_hf", "dense_wait_s", "split_wait_s",
           "mixed_wait_s", "dense_s", "split_s", "mixed_s"]
