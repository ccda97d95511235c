"""Rollouts -> the RL step batch of the data contract (docs/design.md), a typed pytree.

Each sample becomes one right-padded row `prompt + response`, padded to a bucket length
so a run compiles a handful of shapes. Per-token arrays are `[B, T]` and aligned with
`input_ids` (entry t is about token t). `StepBatch` holds them; its optional fields are
None unless the run's config needs them (`BatchFields.of`). The stages of a step each
return a new batch (`dataclasses.replace`), never change one:

    build_batch        the rollout's fields (expert_ids when the sampler recorded routing)
    the trainer        group_ids re-indexed 0..G-1; reward_baselines as configured
    BatchForwards.run  old_log_probs; ref_log_probs, full_kl, values as configured
                       (`rljax.rl.forwards`)
    AdvantageStage     token_level_rewards, rollout_is_weights, advantages, returns
                       (`rljax.rl.advantage_stage`)

Multi-turn trajectories pass their own `response_mask` (tool observations are 0) and
`rollout_log_probs` (0 there), so the same builder serves single- and multi-turn rollouts.

A learner's objective reads a view of the batch: a registered dataclass whose fields are
a subset of `StepBatch`'s (`take`), so only what it reads goes to the devices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from rljax.algos.kl import FULL_KL
from rljax.algos.registry import get_adv_estimator

Array = Any  # a host numpy array, a jax.Array on the mesh, or a jax.ShapeDtypeStruct


@dataclass
class Sample:
    """One trajectory, token ids only: `response_mask` and `response_log_probs` are per
    response token (1 / sampler log-prob for sampled tokens, 0 / 0 for observations)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_log_probs: list[float]
    group_id: int
    score: float = 0.0
    truncated: bool = False  # the response hit the length limit
    baseline: float = 0.0  # ReMax: the score of the greedy response to the same prompt
    expert_ids: np.ndarray | None = None  # [P + R, L, k] int32: recorded routing (`Completion.expert_ids`)
    policy_version: int | None = None  # the learner steps in the weights that sampled it (`rljax.rl.producer`)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StepBatch:
    """One RL step's batch: B rows of T tokens (L layers, k experts per token for MoE).
    The first six fields always hold arrays; the others are None until their stage fills
    them, and stay None when the config does not need them (`BatchFields`)."""

    input_ids: Array  # [B, T] i32 prompt + response tokens, right-padded
    attention_mask: Array  # [B, T] i32 1 = a real token, 0 = padding
    # [B, T] f32 1 = sampled by the policy (the loss applies); 0 = prompt, observation, padding, rejected
    response_mask: Array
    rollout_log_probs: Array  # [B, T] f32 the sampler's log-prob of each sampled token, 0 elsewhere
    token_level_scores: Array  # [B, T] f32 the sample's score on its last sampled token, 0 elsewhere
    group_ids: Array  # [B] i32 the prompt each sample came from (GRPO / RLOO groups), 0..G-1 in the trainer
    # [B, T, L, k] i32 the experts the sampler routed each token to per layer, -1 = none (padding, each
    # row's last token); actor.router_replay
    expert_ids: Array | None = None
    reward_baselines: Array | None = None  # [B] f32 the greedy response's score to the same prompt; ReMax
    old_log_probs: Array | None = None  # [B, T] f32 the policy's before the update (the sampler's when reused)
    ref_log_probs: Array | None = None  # [B, T] f32 the frozen reference's; a per-token KL in the loss or reward
    full_kl: Array | None = None  # [B, T] f32 exact KL(pi_old || pi_ref) per position; algorithm.kl_penalty=full
    values: Array | None = None  # [B, T] f32 the critic's, 0 off the response; estimators with a critic (GAE)
    token_level_rewards: Array | None = None  # [B, T] f32 scores minus the KL-in-reward penalty
    rollout_is_weights: Array | None = None  # [B, T] f32 rollout-correction IS weights; decoupled mode with rollout_is
    advantages: Array | None = None  # [B, T] f32 the estimator's
    returns: Array | None = None  # [B, T] f32 the estimator's (the critic's targets)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


# dtypes of the fields; every other field is float32
_INT_FIELDS = ("input_ids", "attention_mask", "group_ids", "expert_ids", "segment_ids", "positions", "branch_ids")
# fields of one entry per row; every other field but expert_ids is [B, T]
_ROW_FIELDS = ("group_ids", "reward_baselines")
_ALWAYS = ("input_ids", "attention_mask", "response_mask", "rollout_log_probs", "token_level_scores", "group_ids")
_FILLED = ("old_log_probs", "token_level_rewards", "advantages", "returns")  # every finished batch has them


@dataclass(frozen=True)
class BatchFields:
    """Which optional `StepBatch` fields a run's batches hold, as its config asks (`of`):
    the builder, the forwards and the advantage stage fill exactly these, and ahead-of-time
    compilation (`rljax.tpu.programs`) lays out the same."""

    expert_ids: bool = False  # actor.router_replay: the sampler records routing, the policy replays it
    reward_baselines: bool = False  # the estimator compares with a greedy response (ReMax)
    ref_log_probs: bool = False  # a per-token KL estimator, in the actor's loss or in the reward
    full_kl: bool = False  # the exact KL in the reward (algorithm.kl_penalty=full)
    values: bool = False  # the estimator needs a critic
    rollout_is_weights: bool = False  # decoupled rollout correction with IS weights
    # the update's own forward gives old_log_probs (`old_log_probs_from_update`): the batch it receives lacks them
    old_log_probs_from_update: bool = False

    @classmethod
    def of(cls, cfg) -> BatchFields:
        """The fields of an `RLConfig`'s step batches."""
        a, alg = cfg.actor, cfg.algorithm
        corr, estimator = alg.rollout_correction, get_adv_estimator(alg.adv_estimator)
        return cls(
            old_log_probs_from_update=old_log_probs_from_update(cfg),
            expert_ids=a.router_replay,
            reward_baselines=estimator.needs_greedy_baseline,
            ref_log_probs=((a.kl_loss and a.kl_loss_type != FULL_KL)
                           or (alg.use_kl_in_reward and alg.kl_penalty != FULL_KL)),
            full_kl=alg.use_kl_in_reward and alg.kl_penalty == FULL_KL,
            values=estimator.needs_critic,
            rollout_is_weights=corr.rollout_is is not None and not corr.bypass_mode,
        )

    def names(self, updated: bool = True) -> tuple[str, ...]:
        """Every field a step batch holds, in `StepBatch`'s order: after the update
        (`updated`), or as the update receives it (without old_log_probs when it computes
        them)."""
        wanted = {*_ALWAYS, *_FILLED, *(f.name for f in dataclasses.fields(self) if getattr(self, f.name))}
        if self.old_log_probs_from_update and not updated:
            wanted.discard("old_log_probs")
        return tuple(f.name for f in dataclasses.fields(StepBatch) if f.name in wanted)

    def check(self, batch: StepBatch) -> None:
        """A `ValueError` naming the fields a batch ready for the update holds or lacks
        against these."""
        held = set(present(batch))
        wanted = set(self.names(updated=False))
        if held != wanted:
            raise ValueError(f"the step batch holds {sorted(held - wanted)} it should not and lacks "
                             f"{sorted(wanted - held)}")


V = TypeVar("V")
_STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(StepBatch))


def old_log_probs_from_update(cfg) -> bool:
    """Whether a step's old log-probs are the actor update's own, detached, instead of a
    forward of their own. Exactly when they are provably equal: one optimizer step per
    batch (`actor.ppo_epochs` 1, one mini-batch), so the update's forward runs at the very
    parameters the old forward would; LoRA without dropout, so that forward is the same
    function; and nothing needs them before the update (KL in the reward, decoupled
    rollout correction). Not when they are the sampler's (`actor.use_rollout_log_probs`,
    bypass mode): then no forward runs at all. (TRL's GRPOTrainer makes the same choice;
    verl always runs the forward.)"""
    a, alg = cfg.actor, cfg.algorithm
    corr = alg.rollout_correction
    return (a.ppo_epochs == 1 and a.ppo_mini_batch_size >= cfg.data.batch_size
            and not (a.use_rollout_log_probs or corr.bypass_mode)
            and not alg.use_kl_in_reward and not corr.enabled and cfg.model.lora.dropout == 0)


def present(batch) -> dict[str, Array]:
    """The fields of a batch (or a view) that hold arrays, by name, in field order."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}


def take(view: type[V], batch: StepBatch) -> V:
    """The `view` (a dataclass whose fields are `StepBatch` fields, and optional fields of
    its own that stay at their default, e.g. packing's `segment_ids`) of `batch`."""
    return view(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(view) if f.name in _STEP_FIELDS})


def select_rows(batch: V, rows: np.ndarray) -> V:
    """`batch` (a step batch or a view, host arrays) restricted to `rows`, in that order."""
    return dataclasses.replace(batch, **{k: v[rows] for k, v in present(batch).items()})


def abstract_batch(view: type[V], fields: BatchFields, rows: int, length: int, routing: tuple[int, int] | None = None,
                   sharding=None, extra: tuple[str, ...] = ()) -> V:
    """`jax.ShapeDtypeStruct`s of the `view` of a step batch of `rows x length` as the
    update receives it (`routing`: (layers, experts per token) of a MoE model; `extra`:
    the view's own int fields it carries, e.g. packing's), as the run lays them out."""
    held = set(fields.names(updated=False)) | set(extra)

    def spec(name: str):
        if name not in held:
            return None
        shape = (rows,) if name in _ROW_FIELDS else (rows, length)
        if name == "expert_ids":
            shape = (rows, length, *routing)
        return jax.ShapeDtypeStruct(shape, jnp.int32 if name in _INT_FIELDS else jnp.float32, sharding=sharding)

    return view(**{f.name: spec(f.name) for f in dataclasses.fields(view)})


def bucket_length(length: int, bucket: int, max_length: int) -> int:
    """Round up to a multiple of `bucket`, capped at `max_length` (itself a bucket)."""
    return min(-(-length // bucket) * bucket, max_length)


def build_batch(samples: Sequence[Sample], bucket: int, max_length: int, pad_id: int = 0) -> StepBatch:
    """The rollout fields of the step batch, and `expert_ids` when the samples recorded
    routing."""
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    if max(lengths) > max_length:
        raise ValueError(f"a sample of {max(lengths)} tokens exceeds the row length {max_length}")
    t = bucket_length(max(lengths), bucket, max_length)
    b = len(samples)
    input_ids = np.full((b, t), pad_id, np.int32)
    attention_mask = np.zeros((b, t), np.int32)
    response_mask = np.zeros((b, t), np.float32)
    rollout_log_probs = np.zeros((b, t), np.float32)
    token_level_scores = np.zeros((b, t), np.float32)
    recorded = [s.expert_ids for s in samples if s.expert_ids is not None]
    expert_ids = np.full((b, t, *recorded[0].shape[1:]), -1, np.int32) if recorded else None  # [B, T, L, k]
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = s.prompt_ids + s.response_ids
        attention_mask[i, : p + r] = 1
        response_mask[i, p : p + r] = s.response_mask
        rollout_log_probs[i, p : p + r] = s.response_log_probs
        if s.expert_ids is not None:
            expert_ids[i, : p + r] = s.expert_ids
        sampled = np.flatnonzero(np.asarray(s.response_mask) > 0)
        if sampled.size:  # the outcome reward sits on the last token the policy produced
            token_level_scores[i, p + sampled[-1]] = s.score
    return StepBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
        rollout_log_probs=rollout_log_probs, token_level_scores=token_level_scores,
        group_ids=np.asarray([s.group_id for s in samples], np.int32), expert_ids=expert_ids)
