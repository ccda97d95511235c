"""`trainer.algorithm` presets: each RL algorithm name -> the config values that make the
run that algorithm, following verl's documentation and recipes.

A preset fills the defaults *under* the user's config: the dataclass defaults are replaced
by the preset's values, and every key the YAML file or an override sets wins over both
(`RLConfig.defaults_for`, applied by `rljax.config.from_dict` when it builds a whole
`RLConfig`). `rljax config show CONFIG` prints the values a run resolves to.

A key set by the user that makes the run a different algorithm than its label
(`trainer.algorithm=ppo` with `algorithm.adv_estimator=grpo`) is allowed: the set key
wins and `trainer.algorithm` stays the run's label. A saved run config holds every key,
so a run reads back as it ran whatever the presets say.

The keys a preset sets are the method's (advantage estimator, policy loss, loss
aggregation, clip range, KL terms, DAPO's dynamic sampling and overlong shaping); sizes
(batch sizes, `rollout.n`, lengths) and optimizer settings stay the user's. `grpo`,
`RLConfig`'s default algorithm, is exactly the dataclass defaults.

`MODE_PRESETS` do the same per `trainer.mode` for the off-policy correction, under a config
that sets no key of `algorithm.rollout_correction` (any key there is the user's choice of
correction, and the whole section is then the user's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the method of verl's GRPO example scripts with KL off: a group-relative advantage, PPO's
# clipped loss, token-mean (verl docs/algo/grpo.md)
_GRPO = {"algorithm.adv_estimator": "grpo"}
# no KL term in the reward or the loss (the recipes below that say so)
_NO_KL = {"algorithm.use_kl_in_reward": False, "algorithm.kl_ctrl.kl_coef": 0.0,
          "actor.use_kl_loss": False, "actor.kl_loss_coef": 0.0}

# algorithm name -> {dotted config key: value}; the keys of rljax.train.run_sections.RL_ALGORITHMS
PRESETS: dict[str, Mapping[str, Any]] = {
    # verl docs/algo/ppo.md: GAE advantages from a trained critic (verl's default adv_estimator)
    "ppo": {"algorithm.adv_estimator": "gae"},
    "grpo": _GRPO,
    # verl docs/algo/grpo.md, "DrGRPO": no std division, a constant token-sum normaliser, no KL loss
    "dr_grpo": {**_GRPO, "algorithm.norm_adv_by_std_in_grpo": False,
                "actor.loss_agg_mode": "seq-mean-token-sum-norm", "actor.use_kl_loss": False},
    # verl recipe/dapo/run_dapo_qwen2.5_32b.sh (docs/algo/dapo.md): clip-higher, token-level
    # loss, dynamic sampling on acc with at most 10 generation batches, overlong reward shaping,
    # no KL. The overlong buffer's length is the user's (verl's recipe: 4096 of 20480 tokens).
    "dapo": {**_GRPO, **_NO_KL, "actor.clip_ratio_low": 0.2, "actor.clip_ratio_high": 0.28,
             "actor.loss_agg_mode": "token-mean", "algorithm.filter_groups.enable": True,
             "algorithm.filter_groups.metric": "acc", "algorithm.filter_groups.max_num_gen_batches": 10,
             "reward.overlong_buffer.enable": True, "reward.overlong_buffer.penalty_factor": 1.0},
    # verl recipe/gspo/test_gspo_3b_math.sh: the sequence-level ratio, clip range (3e-4, 4e-4)
    # (GSPO paper, section 5.1), seq-mean-token-mean, no KL
    "gspo": {**_GRPO, **_NO_KL, "actor.policy_loss.loss_mode": "gspo",
             "actor.loss_agg_mode": "seq-mean-token-mean", "actor.clip_ratio_low": 0.0003,
             "actor.clip_ratio_high": 0.0004},
    # verl docs/algo/gpg.md: GPG's advantage and loss, no KL loss
    "gpg": {"algorithm.adv_estimator": "gpg", "actor.policy_loss.loss_mode": "gpg",
            "actor.use_kl_loss": False, "actor.kl_loss_coef": 0.0},
    # verl docs/algo/opo.md: the length-weighted group baseline, no entropy bonus, no KL loss
    "opo": {"algorithm.adv_estimator": "opo", "actor.entropy_coeff": 0.0, "actor.use_kl_loss": False,
            "actor.kl_loss_coef": 0.0},
    # the advantage estimators of verl's core_algos under their verl names (verl examples
    # rloo_trainer, reinforce_plus_plus_trainer, remax_trainer; grpo_passk)
    "rloo": {"algorithm.adv_estimator": "rloo"},
    "reinforce_plus_plus": {"algorithm.adv_estimator": "reinforce_plus_plus"},
    "reinforce_plus_plus_baseline": {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"},
    "remax": {"algorithm.adv_estimator": "remax"},
    "grpo_passk": {"algorithm.adv_estimator": "grpo_passk"},
    # the policy losses of verl's core_algos (actor.policy_loss.loss_mode) on GRPO's advantages:
    # CISPO, Clip-Cov and KL-Cov (verl docs/algo/entropy.md), REINFORCE, GMPO (geo_mean,
    # aggregated per sequence: seq-mean-token-mean)
    "cispo": {**_GRPO, "actor.policy_loss.loss_mode": "cispo"},
    "clip_cov": {**_GRPO, "actor.policy_loss.loss_mode": "clip_cov"},
    "kl_cov": {**_GRPO, "actor.policy_loss.loss_mode": "kl_cov"},
    "reinforce": {**_GRPO, "actor.policy_loss.loss_mode": "reinforce"},
    "geo_mean": {**_GRPO, "actor.policy_loss.loss_mode": "geo_mean", "actor.loss_agg_mode": "seq-mean-token-mean"},
    "gmpo": {**_GRPO, "actor.policy_loss.loss_mode": "geo_mean", "actor.loss_agg_mode": "seq-mean-token-mean"},
}


# trainer.mode -> the defaults of a config that sets nothing under `algorithm.rollout_correction`.
# The asynchronous modes train on samples of an older policy (the behaviour policy); PPO's
# ratio is taken against it, clipped (bypass mode: the old log-probs are the sampler's), as
# PipelineRL and prime-rl do. On the quickstart this learns as sync does where the trainer's
# recomputed old log-probs without a correction learn less (docs/async.md, learning table).
MODE_PRESETS: dict[str, Mapping[str, Any]] = {
    "one_step_off": {"algorithm.rollout_correction.bypass_mode": True},
    "async": {"algorithm.rollout_correction.bypass_mode": True},
}


def preset_tree(name: str, mode: str | None = None) -> dict[str, Any]:
    """The preset of algorithm `name`, then that of trainer mode `mode` (None: none), as a
    nested mapping (`{"actor": {"clip_ratio_high": 0.28}}`), the shape
    `rljax.config.from_dict` reads; {} for names without one."""
    tree: dict[str, Any] = {}
    for dotted, value in {**PRESETS.get(name, {}), **MODE_PRESETS.get(mode, {})}.items():
        *sections, key = dotted.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return tree
