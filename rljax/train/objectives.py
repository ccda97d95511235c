"""Objectives for the shared train step: `objective(model, batch, frozen, totals, key) -> (AggTerms, metrics)`.

Each reads one micro-batch in the data contract of `rljax.data` and returns its loss as
a (numerator, denominator) pair of sums, so the step normalises once over the whole
mini-batch. `key` is the step's PRNG key (`rljax.train.steps.step_key`); these
objectives are deterministic and ignore it. Token log-probs come from the decoder's one
entry point, `Decoder.token_log_probs` (chunked: the `[B, T, vocab]` logits are never
materialised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.algos.preference import DPO_LOSS_REGISTRY, bradley_terry_loss, dpo_loss, sequence_log_probs
from rljax.algos.sft import sft_loss
from rljax.config import Bounds, FieldError, PositiveFloat, check_name


@dataclass(frozen=True)
class DPOConfig:
    """The DPO family's loss (trainer.algorithm=dpo; `rljax.algos.preference.dpo_loss`)."""

    beta: PositiveFloat = 0.1  # strength of the implicit KL to the reference (the logits' scale)
    loss_type: str = "sigmoid"  # a name in DPO_LOSS_REGISTRY: sigmoid (DPO) | ipo | hinge
    label_smoothing: Annotated[float, Bounds(ge=0, le=0.5)] = 0.0  # assumed fraction of flipped labels (cDPO)
    reference_free: bool = False  # no reference model: its log-probs are taken as 0

    def check(self) -> None:
        """Run by `rljax.config.check_config` (errors are prefixed with this section's key)."""
        problem = check_name(self.loss_type, DPO_LOSS_REGISTRY)
        if problem:
            raise FieldError("loss_type", problem)


@dataclass(frozen=True)
class RMConfig:
    """The reward model's loss (trainer.algorithm=rm; Bradley-Terry on chosen / rejected)."""

    margin: float = 0.0  # subtracted from r_chosen - r_rejected (Llama 2's margin loss)


def sft_objective(loss_agg_mode: str = "token-mean") -> Callable:
    def objective(model, batch, frozen, totals=None, key=None):
        logp = model.token_log_probs(batch["input_ids"], positions=batch["positions"],  # [B, T]
                                     segment_ids=batch["segment_ids"])
        terms, metrics = sft_loss(logp, batch["loss_mask"], loss_agg_mode, return_terms=True)
        return terms, metrics

    return objective


def _pairs(batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Chosen rows then rejected rows as one `[2B, T]` batch (one forward pass)."""
    ids = jnp.concatenate([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    mask = jnp.concatenate([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    loss_mask = jnp.concatenate([batch["chosen_loss_mask"], batch["rejected_loss_mask"]])
    return ids, mask, loss_mask


def dpo_objective(config: DPOConfig, reference_graphdef: nnx.GraphDef | None) -> Callable:
    """DPO family; `frozen` is the reference model's state (not trained, not in the
    optimizer). Without `reference_graphdef` (and not reference-free) the reference is the
    trained model with its LoRA adapters off (`rljax.models.lora`). Sequence log-probs sum
    over response tokens (`*_loss_mask`)."""
    average = config.loss_type == "ipo"

    def sequence_logps(model, ids, mask, loss_mask, adapters=True):
        logp = model.token_log_probs(ids, mask, adapters=adapters)  # [2B, T]
        seq = sequence_log_probs(logp, loss_mask, average=average)  # [2B]
        half = seq.shape[0] // 2
        return seq[:half], seq[half:]

    def objective(model, batch, frozen, totals=None, key=None):
        ids, mask, loss_mask = _pairs(batch)
        chosen, rejected = sequence_logps(model, ids, mask, loss_mask)
        ref_chosen = ref_rejected = None
        if not config.reference_free:
            reference = model if reference_graphdef is None else nnx.merge(reference_graphdef, frozen)
            ref_chosen, ref_rejected = jax.lax.stop_gradient(
                sequence_logps(reference, ids, mask, loss_mask, adapters=False))
        return dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=config.beta,
                        label_smoothing=config.label_smoothing, loss_type=config.loss_type,
                        reference_free=config.reference_free, return_terms=True)

    return objective


def rm_objective(config: RMConfig) -> Callable:
    """Bradley-Terry on a `ScalarHeadModel`: the score of each chosen answer against its
    rejected one."""

    def objective(model, batch, frozen, totals=None, key=None):
        ids, mask, _ = _pairs(batch)
        scores = model(ids, mask)
        half = scores.shape[0] // 2
        margin = jnp.full((half,), config.margin) if config.margin else None
        return bradley_terry_loss(scores[:half], scores[half:], margin, return_terms=True)

    return objective


def make_eval_step(graphdef: nnx.GraphDef, objective: Callable):
    """Jitted `(params, batch, frozen) -> (numerator, denominator, metrics * denominator)`;
    a validation loop sums these over batches and divides once. Evaluation is
    deterministic: the objective gets no totals and `key=None`."""

    def evaluate(params, batch, frozen):
        terms, metrics = objective(nnx.merge(graphdef, params), batch, frozen, None, None)
        weighted = {k: v * terms.denominator for k, v in metrics.items()}
        return terms.numerator, terms.denominator, weighted

    return jax.jit(evaluate)
