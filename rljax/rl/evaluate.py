"""Evaluating a policy on the validation prompts: what `rljax eval CONFIG` reports and what
the RL trainer logs every `trainer.test_freq` steps.

- Sampled metrics: `rollout.val_kwargs.n` responses per prompt at `val_kwargs.temperature`,
  scored by the run's rewards, summarised by `rljax.evaluation.validation_metrics`:
  ``val-core/{data_source}/acc/mean@n``, ``pass@k`` (unbiased estimator), ``maj@k/mean``,
  ``best@k/mean`` and the ``val-aux/...`` rest.
- Reference-answer perplexity (single-turn configs): each prompt's reference answer,
  ``extra_info["answer"]`` when the row has one (verl's GSM8K preprocessing keeps the
  worked solution there), else the ground truth, is tokenized, ended with EOS, cut to
  `rollout.response_length` tokens and scored as the response to the prompt at
  temperature 1: ``exp(sum NLL / sum tokens)`` over a data source's answers (a token mean,
  `rljax.evaluation.perplexity_from_sums`), reported as
  ``val-aux/{data_source}/reference/ppl`` (with ``.../reference/nll`` per token).
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from rljax.data import make_dataset
from rljax.hostsync import fetch, shard_global_batch
from rljax.evaluation import validation_metrics
from rljax.rl.batch import Sample, build_batch
from rljax.rl.config import RLConfig
from rljax.rl.forwards import LogProbFn, make_log_prob_fn
from rljax.rl.generation import RolloutFn


def reference_text(ground_truth: Any, extra_info: Any) -> str:
    if isinstance(extra_info, dict) and extra_info.get("answer") not in (None, ""):
        return str(extra_info["answer"])
    return str(ground_truth)


def reference_samples(prompts: dict[str, list], tokenizer, max_tokens: int) -> list[Sample]:
    """One `Sample` per prompt whose response is its reference answer (+ EOS), all scored."""
    eos = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    samples = []
    for i, prompt_ids in enumerate(prompts["prompt_ids"]):
        text = reference_text(prompts["ground_truth"][i], prompts["extra_info"][i])
        ids = (list(tokenizer.encode(text, add_special_tokens=False)) + eos)[:max_tokens]
        samples.append(Sample(prompt_ids=list(prompt_ids), response_ids=ids, response_mask=[1] * len(ids),
                              response_log_probs=[0.0] * len(ids), group_id=i))
    return samples


def reference_nll(log_probs: LogProbFn, params, samples: list[Sample], cfg: RLConfig, rows_multiple: int,
                  shard=lambda batch: batch) -> tuple[np.ndarray, np.ndarray]:
    """Summed NLL and token count of each sample's response (float64 `[N]` each)."""
    padded = samples + [samples[0]] * (-len(samples) % rows_multiple)  # rows divide the mesh
    batch = build_batch(padded, cfg.row_bucket, cfg.row_length)
    ids, mask = shard({"i": batch.input_ids, "m": batch.attention_mask}).values()
    lp = np.asarray(fetch(log_probs(params, ids, mask)), np.float64)[: len(samples)]
    scored = batch.response_mask[: len(samples)].astype(np.float64)
    return -(lp * scored).sum(-1), scored.sum(-1)


def validate(cfg: RLConfig, tokenizer, rollout_fn: RolloutFn, log_probs: LogProbFn | None = None, params=None,
             mesh=None, batches: Iterable[dict[str, list]] | None = None) -> dict[str, float]:
    """Validation metrics (module docstring) over `batches` (default: `data.val_files`).
    Without `log_probs`, no perplexity; with a `mesh`, its batches are sharded over it.
    Every process reads every prompt (`rollout_fn` spreads them over rollout replicas)."""
    from rljax.parallel import data_parallel_size

    rows_multiple = 1 if mesh is None else data_parallel_size(mesh)
    shard = (lambda batch: batch) if mesh is None else (lambda batch: shard_global_batch(batch, mesh))
    if batches is None:
        if not cfg.data.val_files:
            return {}
        batches = make_dataset(dataclasses.replace(cfg.data, shuffle=False), tokenizer, "val",
                               process_index=0, process_count=1)
    params_sampling = cfg.sampling_params(validation=True)
    records: list[dict] = []
    nll: dict[str, float] = defaultdict(float)
    tokens: dict[str, float] = defaultdict(float)
    offset = 0
    for prompts in batches:
        if not prompts["prompt_ids"]:
            continue
        records += rollout_fn(prompts, params_sampling, offset).records
        offset += len(prompts["prompt_ids"])
        if log_probs is not None:
            samples = reference_samples(prompts, tokenizer, cfg.rollout.response_length)
            sums, counts = reference_nll(log_probs, params, samples, cfg, rows_multiple, shard)
            for source, s, c in zip(prompts["data_source"], sums, counts):
                nll[source] += float(s)
                tokens[source] += float(c)
    metrics = validation_metrics(records)
    for source in nll:
        per_token = nll[source] / max(tokens[source], 1.0)
        metrics[f"val-aux/{source}/reference/nll"] = per_token
        metrics[f"val-aux/{source}/reference/ppl"] = float(np.exp(per_token))
    return metrics


def evaluate(cfg: RLConfig, checkpoint: str | None = None, work_dir: str = "runs/eval") -> dict[str, float]:
    """`rljax eval`: validation metrics of the configured model (`model.path`, or random
    weights), or of an RL run's checkpoint (`checkpoint`: a run directory, its
    checkpoints/ or one step; the actor's parameters are read alone)."""
    from flax import nnx

    from rljax.data.synthetic_spec import materialize
    from rljax.parallel import make_mesh
    from rljax.rl.agent_rollout import agent_config
    from rljax.rl.generation import Generation
    from rljax.rl.policy_checkpoint import load_policy
    from rljax.train.setup import build_decoder, load_tokenizer

    if not cfg.data.val_files:
        raise ValueError("data.val_files: nothing to evaluate on")
    os.makedirs(work_dir, exist_ok=True)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, format="rl", val_files=materialize(cfg.data.val_files, os.path.join(work_dir, "data"), "val")))
    mesh = make_mesh(cfg.mesh)
    if checkpoint is None:
        tokenizer = load_tokenizer(cfg.model)
        decoder = build_decoder(cfg.model, tokenizer, mesh=mesh)
    else:
        decoder, tokenizer, _ = load_policy(cfg, checkpoint, mesh)
    graphdef, params = nnx.split(decoder)
    agent = agent_config(cfg.agent) if cfg.agent else None
    generation = Generation(cfg, decoder, tokenizer, agent, lambda: params, mesh)
    try:
        log_probs = None if agent is not None else make_log_prob_fn(graphdef, 1.0)
        return validate(cfg, tokenizer, generation.rollout, log_probs, params, mesh)
    finally:
        generation.close()
