"""The RL step's jitted forward passes, outside the optimizer: old / reference token
log-probs, the exact KL to the reference, the critic's values.

Each is a function of (params, input_ids, attention_mask) arrays, jitted once per graph,
so the trainer, validation perplexity and `rljax eval` share the compiled program. Every
per-token result is `[B, T]` and aligned with `input_ids` (`rljax.algos.log_probs`).
`BatchForwards` runs the ones a config needs on a step's batch (`StepBatch` -> a new
`StepBatch` with their fields, `rljax.rl.batch.BatchFields`).

Routing replay (`actor.router_replay`, MoE): the policy's forwards here (old log-probs,
the policy side of the exact KL) take the batch's recorded `expert_ids` `[B, T, L, k]`;
the reference's and the critic's do not (they are other policies, routed their own way),
so a KL term reads token log-probs only and never router logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import jax
from flax import nnx

from rljax.algos.kl import kl_from_hidden
from rljax.hostsync import fetch, shard_global_batch
from rljax.rl.batch import BatchFields, StepBatch
from rljax.rl.config import RLConfig
from rljax.rl.actor_critic import aligned_values
from rljax.rl.step_metrics import Timer

# (params, input_ids, attention_mask[, expert_ids]) -> [B, T] log-probs
LogProbFn = Callable[..., Any]


def make_log_prob_fn(graphdef: nnx.GraphDef, temperature: float, adapters: bool = True) -> LogProbFn:
    """Jitted aligned token log-probs of `input_ids` under the given params
    (`Decoder.token_log_probs`, chunked); `adapters=False`: with LoRA adapters off;
    `expert_ids` `[B, T, L, k]` (MoE): routing replay."""

    @jax.jit
    def log_probs(params, input_ids, attention_mask, expert_ids=None):
        return nnx.merge(graphdef, params).token_log_probs(input_ids, attention_mask, temperature=temperature,
                                                           adapters=adapters, expert_ids=expert_ids)

    return log_probs


def make_full_kl_fn(graphdef: nnx.GraphDef, temperature: float):
    """Jitted aligned exact KL(pi || pi_ref) over the vocabulary per position, `(params,
    reference params, input_ids, attention_mask) -> [B, T]`; chunked over positions
    (`rljax.algos.kl.kl_from_hidden`), never [B, T, vocab]. The reference runs with LoRA
    adapters off (with LoRA its params are the policy's own). `expert_ids`: the policy's
    routing replay (the reference routes its own way)."""

    @jax.jit
    def full_kl(params, reference, input_ids, attention_mask, expert_ids=None):
        model, ref = nnx.merge(graphdef, params), nnx.merge(graphdef, reference)
        hidden = model.hidden_states(input_ids, attention_mask=attention_mask, expert_ids=expert_ids)  # [B, T, E]
        ref_hidden = ref.hidden_states(input_ids, attention_mask=attention_mask, adapters=False)  # [B, T, E]
        return kl_from_hidden(hidden, model.unembedding(), ref_hidden, ref.unembedding(), temperature=temperature)

    return full_kl


def make_value_fn(graphdef: nnx.GraphDef):
    """Jitted critic values `(params, input_ids, attention_mask) -> [B, T]`, aligned: the
    value of token t is read from the hidden state that predicts it."""

    @jax.jit
    def values(params, input_ids, attention_mask):
        return aligned_values(nnx.merge(graphdef, params), input_ids, attention_mask)

    return values


@dataclass
class BatchForwards:
    """The forwards one RL step runs on its batch, as the config asks, each jitted once."""

    log_probs: LogProbFn  # the policy's, at the rollout temperature
    reuse_rollout_log_probs: bool  # old log-probs are the sampler's (actor.use_rollout_log_probs, bypass mode)
    ref_log_probs: bool  # a per-token KL estimator (loss or reward) reads the reference's log-probs
    full_kl: Callable | None  # KL-in-reward "full": exact KL(pi_old || pi_ref) per position
    values: Callable | None  # the critic's (GAE)
    reference_log_probs: LogProbFn | None = None  # the reference's (LoRA: adapters off); None: `log_probs`
    router_replay: bool = False  # the policy's forwards replay the batch's expert_ids (actor.router_replay)
    old_from_update: bool = False  # old log-probs come from the update's own forward (no forward here)

    @classmethod
    def of(cls, cfg: RLConfig, actor: nnx.GraphDef, critic: nnx.GraphDef | None = None) -> BatchForwards:
        a, alg, temperature = cfg.actor, cfg.algorithm, cfg.rollout.temperature
        fields = BatchFields.of(cfg)
        return cls(
            reference_log_probs=make_log_prob_fn(actor, temperature, adapters=False) if cfg.model.lora.enabled else None,
            log_probs=make_log_prob_fn(actor, temperature),
            reuse_rollout_log_probs=a.use_rollout_log_probs or alg.rollout_correction.bypass_mode,
            old_from_update=fields.old_log_probs_from_update,
            ref_log_probs=fields.ref_log_probs,
            full_kl=make_full_kl_fn(actor, temperature) if fields.full_kl else None,
            values=None if critic is None else make_value_fn(critic), router_replay=fields.expert_ids)

    def run(self, batch: StepBatch, mesh, timer: Timer, actor_params, reference=None,
            critic_params=None) -> StepBatch:
        """`batch` with `old_log_probs` (unless the update computes them: `old_from_update`,
        and no `timing_s/old_log_prob`) and, as configured, `ref_log_probs`, `full_kl` and
        `values` (`[B, T]` each, on the host). `reference` None: the reference is the policy
        with its LoRA adapters off (its params are `actor_params`)."""
        reference = actor_params if reference is None else reference
        ref_log_probs = self.reference_log_probs or self.log_probs
        # every process holds the whole batch, and gets every result whole
        ids, mask = shard_global_batch({"i": batch.input_ids, "m": batch.attention_mask}, mesh).values()
        experts = None  # [B, T, L, k] the sampler's routing, replayed in the policy's forwards
        if self.router_replay:
            if batch.expert_ids is None:
                raise ValueError("actor.router_replay: the rollout recorded no routing (expert_ids)")
            experts = shard_global_batch({"e": batch.expert_ids}, mesh)["e"]
        filled = {}
        if self.reuse_rollout_log_probs:
            filled["old_log_probs"] = batch.rollout_log_probs.copy()
        elif not self.old_from_update:
            with timer("old_log_prob"):
                filled["old_log_probs"] = fetch(self.log_probs(actor_params, ids, mask, experts))
        if self.ref_log_probs:
            with timer("ref"):
                filled["ref_log_probs"] = fetch(ref_log_probs(reference, ids, mask))
        if self.full_kl is not None:
            with timer("ref"):
                filled["full_kl"] = fetch(self.full_kl(actor_params, reference, ids, mask, experts))
        if self.values is not None:
            with timer("values"):
                filled["values"] = fetch(self.values(critic_params, ids, mask)) * batch.response_mask
        return dataclasses.replace(batch, **filled)
