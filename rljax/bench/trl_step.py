"""TRL's ``GRPOTrainer`` on the work of `rljax bench step --path ... --trl` (an optional extra).

Runs in its own process (`run` starts it: ``python -m rljax.bench.trl_step ARGS_JSON``) so
its peak resident memory is its own. The work is the same as rljax's in `rljax.bench.step`:

- the model: the same HF folder or ``.gguf`` file (read by transformers, fp32 unless
  ``--dtype bfloat16``), its tokenizer and chat template;
- the prompts: rows of the same generator and knobs (`rljax.bench.real_prompts`),
  as conversational prompts, so TRL applies the same chat template;
- the reward: rljax's ``synthetic/*`` scorer (the last number of the answer), called as a
  TRL reward function;
- a step: ``prompts x n`` completions of at most ``response_length`` tokens at T=1
  (transformers ``generate``, no vLLM), then one optimizer step over them in micro-batches
  of ``micro_batch`` completions (``per_device_train_batch_size``; gradient accumulation
  over the rest), lr 1e-6, KL coefficient ``beta = kl_coef``, gradient checkpointing when
  ``remat`` is not ``none``.

Per step it reports (seconds): ``gen`` (TRL's ``_generate``), ``reward``, ``log_probs``
(what ``_generate_and_score_completions`` spends besides those two: the old-policy and
reference forwards when TRL needs them), ``update`` (the rest of the step: forward,
backward and optimizer over the micro-batches) and ``step``, plus ``peak_GiB`` (the
process's peak resident set, `rljax.memory.resident_peak_bytes`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

RESULT = "trl rows: "  # the child's line with its rows (JSON) after it


def load_model(path: str, dtype: str):
    """A transformers model and tokenizer from an HF folder or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    from rljax.bench.sampler import hf_pretrained
    from rljax.models.gguf import is_gguf, load_gguf_tokenizer

    model = hf_pretrained(path, dtype)
    if is_gguf(path):  # dequantized to `dtype` on load, but still marked quantized, which Trainer refuses
        model.hf_quantizer, model.is_quantized = None, False
    tokenizer = load_gguf_tokenizer(path) if is_gguf(path) else AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _timed(obj: Any, name: str, totals: dict[str, float], key: str) -> None:
    fn = getattr(obj, name)

    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - start

    setattr(obj, name, wrapped)


def train(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Run TRL's GRPO for ``args["steps"]`` steps; one row of timings per step."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rljax.bench.real_prompts import real_model_rows
    from rljax.memory import GiB, resident_peak_bytes
    from rljax.rewards.synthetic import compute_score

    torch.manual_seed(args["seed"])
    model, tokenizer = load_model(args["path"], args["dtype"])
    rows = real_model_rows(args["prompts"] * max(1, args["steps"]))
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"],
                                  "extra_info": r["extra_info"]} for r in rows])

    def reward(completions, ground_truth, extra_info, **_):
        return [compute_score("synthetic/arithmetic", c[0]["content"], g, e)["score"]
                for c, g, e in zip(completions, ground_truth, extra_info)]

    rows_per_step = args["prompts"] * args["n"]
    micro = args["micro_batch"] or rows_per_step
    config = GRPOConfig(
        output_dir=args["out_dir"], per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows_per_step // micro, num_generations=args["n"],
        max_completion_length=args["response_length"], temperature=1.0, beta=args["kl_coef"],
        num_iterations=1, learning_rate=1e-6, max_steps=args["steps"], logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=args["use_cpu"], bf16=args["dtype"] == "bfloat16",
        gradient_checkpointing=args["remat"] != "none", seed=args["seed"], shuffle_dataset=False,
        disable_dropout=True,
    )
    totals: dict[str, float] = {}
    marks: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            totals.clear()
            marks.append({"start": time.perf_counter()})

        def on_step_end(self, *_, **__):
            marks[-1]["end"] = time.perf_counter()
            marks[-1].update(totals)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    _timed(trainer, "_generate", totals, "gen")
    _timed(trainer, "_calculate_rewards", totals, "reward")
    _timed(trainer, "_generate_and_score_completions", totals, "scored")
    trainer.train()
    out = []
    for i, m in enumerate(marks):
        step = m["end"] - m["start"]
        scored = m.get("scored", 0.0)
        out.append({"iter": i, "gen": m.get("gen", 0.0), "reward": m.get("reward", 0.0),
                    "log_probs": scored - m.get("gen", 0.0) - m.get("reward", 0.0),
                    "update": step - scored, "step": step, "peak_GiB": resident_peak_bytes() / GiB})
    return out


def run(args: dict[str, Any], timeout: float | None = None) -> list[dict[str, Any]]:
    """`train` in a fresh process (its own peak memory); the rows it printed."""
    proc = subprocess.run([sys.executable, "-m", "rljax.bench.trl_step", json.dumps(args)], capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"TRL's GRPOTrainer failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(RESULT):])


if __name__ == "__main__":
    print(RESULT + json.dumps(train(json.loads(sys.argv[1]))))
