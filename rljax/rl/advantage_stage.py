"""The advantage stage of an RL step: a step batch with its forwards filled -> the batch
with `token_level_rewards`, `advantages`, `returns` (and, as configured,
`rollout_is_weights` and a rejection-narrowed `response_mask`), plus its metrics.

In verl's order (`RayPPOTrainer.fit`):

1. KL in the reward (`algorithm.use_kl_in_reward`): `r = scores - beta * m * kl`, with `kl`
   the estimator `algorithm.kl_penalty` of (old_log_probs, ref_log_probs), or the exact
   KL of the forwards for "full" (`rljax.algos.kl.apply_kl_to_rewards`); `beta` is the KL
   controller's coefficient. The controller (fixed, or adaptive: Ziegler et al. 2019)
   comes in and its update comes out: its state stays with the caller, which
   checkpoints it. Otherwise `r = scores`.
2. Decoupled rollout correction (`algorithm.rollout_correction`, not bypass mode): IS
   weights and rejections from (old_log_probs, rollout_log_probs)
   (`rljax.algos.rollout_correction`); rejected tokens leave `response_mask`, so every
   later use (advantages, actor and critic losses, their denominators) drops them.
3. The estimator (`algorithm.adv_estimator`, `rljax.algos.advantages`) on (r,
   response_mask, values, group_ids, reward_baselines).

`AdvantageStage.of(cfg)` fixes what the config decides (and jits the correction once);
calling it is a function of its arguments alone.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np

from rljax.algos.advantages import AdvantageEstimator, AdvantageInputs, compute_advantages
from rljax.algos.kl import FULL_KL, AdaptiveKLController, FixedKLController, apply_kl_to_rewards, kl_penalty
from rljax.algos.registry import get_adv_estimator
from rljax.algos.rollout_correction import compute_rollout_correction_and_rejection_mask
from rljax.rl.batch import StepBatch
from rljax.rl.config import RLConfig, RolloutCorrectionConfig

KLController = FixedKLController | AdaptiveKLController


def correction_kwargs(correction: RolloutCorrectionConfig) -> dict:
    """`compute_rollout_correction_and_rejection_mask` keyword arguments of the config
    (the decoupled correction here, and bypass mode's in the actor's loss)."""
    return dict(rollout_is=correction.rollout_is, rollout_is_threshold=correction.rollout_is_threshold,
                rollout_is_mode=correction.rollout_is_mode,
                rollout_is_batch_normalize=correction.rollout_is_batch_normalize,
                rollout_rs=correction.rollout_rs, rollout_rs_threshold=correction.rollout_rs_threshold,
                rollout_is_veto_threshold=correction.rollout_token_veto_threshold)


@dataclass(frozen=True)
class AdvantageStage:
    """KL in the reward, decoupled rollout correction and the advantages, as a config asks."""

    estimator: AdvantageEstimator
    kl_penalty: str | None  # the reward's KL estimator ("full": the batch's exact KL); None: no KL in the reward
    kl_ctrl_steps: int  # the controller's n_steps per update: prompts per step (data.train_batch_size), as verl
    # (old_log_probs, rollout_log_probs, response_mask) -> (IS weights or None, kept mask, metrics), jitted;
    # None: no correction on the batch (none configured, or bypass mode: it is in the loss)
    correction: Callable | None
    gamma: float  # discount
    lam: float  # GAE lambda
    norm_adv_by_std_in_grpo: bool  # GRPO divides by the group std

    @classmethod
    def of(cls, cfg: RLConfig) -> AdvantageStage:
        alg = cfg.algorithm
        corr = alg.rollout_correction
        return cls(
            estimator=get_adv_estimator(alg.adv_estimator),
            kl_penalty=alg.kl_penalty if alg.use_kl_in_reward else None,
            kl_ctrl_steps=cfg.data.batch_size,
            correction=(jax.jit(functools.partial(compute_rollout_correction_and_rejection_mask,
                                                  **correction_kwargs(corr)))
                        if corr.enabled and not corr.bypass_mode else None),
            gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)

    def __call__(self, batch: StepBatch, kl_ctrl: KLController
                 ) -> tuple[StepBatch, dict[str, float], KLController]:
        """-> (the batch with the stage's fields, the stage's metrics, the KL controller
        after this step's update; `kl_ctrl` itself without KL in the reward)."""
        metrics: dict[str, float] = {}
        rewards = batch.token_level_scores  # [B, T]
        if self.kl_penalty is not None:
            kld = batch.full_kl if self.kl_penalty == FULL_KL else kl_penalty(
                batch.old_log_probs, batch.ref_log_probs, self.kl_penalty)  # [B, T]
            rewards, kl_metrics = apply_kl_to_rewards(rewards, kld, batch.response_mask, kl_ctrl.value)
            kl_metrics = {k: float(v) for k, v in kl_metrics.items()}
            kl_ctrl = kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], self.kl_ctrl_steps)
            metrics.update(kl_metrics)
        batch = dataclasses.replace(batch, token_level_rewards=np.asarray(rewards, np.float32))
        if self.correction is not None:
            weights, kept, corr_metrics = self.correction(batch.old_log_probs, batch.rollout_log_probs,
                                                          batch.response_mask)
            batch = dataclasses.replace(batch, response_mask=np.asarray(kept, np.float32),
                                        rollout_is_weights=None if weights is None else np.asarray(weights, np.float32))
            metrics.update({k: float(v) for k, v in corr_metrics.items()})
        inputs = AdvantageInputs(batch.token_level_rewards, batch.response_mask, values=batch.values,
                                 group_ids=batch.group_ids, reward_baselines=batch.reward_baselines)
        advantages, returns = compute_advantages(self.estimator, inputs, gamma=self.gamma, lam=self.lam,
                                                 norm_adv_by_std_in_grpo=self.norm_adv_by_std_in_grpo)
        batch = dataclasses.replace(batch, advantages=np.asarray(advantages, np.float32),
                                    returns=np.asarray(returns, np.float32))
        return batch, metrics, kl_ctrl
