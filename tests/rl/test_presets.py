"""`trainer.algorithm` selects the algorithm's defaults (`rljax.rl.presets`): each preset
holds verl's published values, the user's keys win over it, and the shipped configs
resolve exactly as they do with the presets off."""

import glob
import os

import pytest
import yaml

from rljax import cli
from rljax.commands.run_kinds import config_class
from rljax.config import check_config, config_to_dict, from_dict, load_config, read_yaml
from rljax.rl.config import RL_ALGORITHMS, RLConfig
from rljax.rl.presets import PRESETS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(REPO, "configs", "quickstart.yaml")
SHIPPED = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")) + glob.glob(os.path.join(REPO, "launch", "configs", "*.yaml")))

# verl's published values, written out by hand from verl's docs and recipes (verl-project/verl):
NO_KL = {"algorithm.use_kl_in_reward": False, "algorithm.kl_ctrl.kl_coef": 0.0,
         "actor.use_kl_loss": False, "actor.kl_loss_coef": 0.0}
VERL = {
    # docs/algo/ppo.md: GAE with a critic
    "ppo": {"algorithm.adv_estimator": "gae"},
    # docs/algo/grpo.md: "algorithm.adv_estimator: Default is gae. Please set it to grpo instead";
    # loss_agg_mode token-mean in every GRPO example
    "grpo": {"algorithm.adv_estimator": "grpo", "actor.loss_agg_mode": "token-mean",
             "algorithm.norm_adv_by_std_in_grpo": True, "actor.policy_loss.loss_mode": "vanilla"},
    # docs/algo/grpo.md, DrGRPO: seq-mean-token-sum-norm, use_kl_loss False, norm_adv_by_std_in_grpo False
    "dr_grpo": {"algorithm.adv_estimator": "grpo", "actor.loss_agg_mode": "seq-mean-token-sum-norm",
                "actor.use_kl_loss": False, "algorithm.norm_adv_by_std_in_grpo": False},
    # recipe/dapo/run_dapo_qwen2.5_32b.sh: adv_estimator=grpo, kl_coef=0.0, kl_loss_coef=0.0,
    # clip_ratio_low=0.2, clip_ratio_high=0.28, enable_overlong_buffer=True, overlong_penalty_factor=1.0,
    # enable_filter_groups=True, filter_groups_metric=acc, max_num_gen_batches=10, use_token_level_loss=True
    "dapo": {**NO_KL, "algorithm.adv_estimator": "grpo", "actor.clip_ratio_low": 0.2, "actor.clip_ratio_high": 0.28,
             "reward.overlong_buffer.enable": True, "reward.overlong_buffer.penalty_factor": 1.0,
             "algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
             "algorithm.filter_groups.max_num_gen_batches": 10, "actor.loss_agg_mode": "token-mean"},
    # recipe/gspo/test_gspo_3b_math.sh: adv_estimator=grpo, loss_mode=gspo, loss_agg_mode=seq-mean-token-mean,
    # clip_ratio_low=0.0003, clip_ratio_high=0.0004, no KL in the reward or the loss
    "gspo": {**NO_KL, "algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "gspo",
             "actor.loss_agg_mode": "seq-mean-token-mean", "actor.clip_ratio_low": 0.0003,
             "actor.clip_ratio_high": 0.0004},
    # docs/algo/gpg.md: adv_estimator gpg, use_kl_loss False, kl_loss_coef 0, the GPG loss
    "gpg": {"algorithm.adv_estimator": "gpg", "actor.use_kl_loss": False, "actor.kl_loss_coef": 0.0,
            "actor.policy_loss.loss_mode": "gpg"},
    # docs/algo/opo.md: adv_estimator opo, entropy_coeff 0, use_kl_loss False, kl_loss_coef 0
    "opo": {"algorithm.adv_estimator": "opo", "actor.entropy_coeff": 0.0, "actor.use_kl_loss": False,
            "actor.kl_loss_coef": 0.0},
    # verl core_algos: the estimators and policy losses under their registered names
    "rloo": {"algorithm.adv_estimator": "rloo"},
    "reinforce_plus_plus": {"algorithm.adv_estimator": "reinforce_plus_plus"},
    "reinforce_plus_plus_baseline": {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"},
    "remax": {"algorithm.adv_estimator": "remax"},
    "grpo_passk": {"algorithm.adv_estimator": "grpo_passk"},
    "cispo": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "cispo"},
    "clip_cov": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "clip_cov"},
    "kl_cov": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "kl_cov"},
    "reinforce": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "reinforce"},
    # GMPO: verl's geo_mean loss, one loss per sequence
    "geo_mean": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "geo_mean",
                 "actor.loss_agg_mode": "seq-mean-token-mean"},
    "gmpo": {"algorithm.adv_estimator": "grpo", "actor.policy_loss.loss_mode": "geo_mean",
             "actor.loss_agg_mode": "seq-mean-token-mean"},
}


def value(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_every_rl_algorithm_has_a_preset_and_a_test():
    assert set(PRESETS) == set(RL_ALGORITHMS) == set(VERL)


@pytest.mark.parametrize("name", sorted(VERL))
def test_preset_holds_verls_values(name):
    cfg = load_config(RLConfig, None, [f"trainer.algorithm={name}"])
    assert cfg.trainer.algorithm == name
    for key, expected in VERL[name].items():
        assert value(cfg, key) == expected, key


def test_ppo_trains_a_critic_and_grpo_does_not():
    assert load_config(RLConfig, None, ["trainer.algorithm=ppo"])._learners() == ("actor", "critic")
    assert load_config(RLConfig, None, ["trainer.algorithm=grpo"])._learners() == ("actor",)


def test_grpo_the_default_algorithm_is_the_dataclass_defaults():
    assert load_config(RLConfig) == RLConfig()
    assert load_config(RLConfig, None, ["trainer.algorithm=grpo"]) == RLConfig()


def test_user_keys_win_over_the_preset(tmp_path):
    path = tmp_path / "dapo.yaml"
    path.write_text("trainer: {algorithm: dapo}\nactor: {clip_ratio_high: 0.3}\n"
                    "algorithm: {filter_groups: {max_num_gen_batches: 3}}\n")
    cfg = load_config(RLConfig, str(path), ["reward.overlong_buffer.enable=false"])
    assert cfg.actor.clip_ratio_high == 0.3  # the file's
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 3  # the file's, inside a preset's section
    assert cfg.algorithm.filter_groups.enable is True and cfg.algorithm.filter_groups.metric == "acc"  # the preset's
    assert cfg.reward.overlong_buffer.enable is False  # the override's
    assert cfg.actor.clip_ratio_low == 0.2  # the preset's


def test_an_override_of_the_algorithm_selects_its_preset():
    cfg = load_config(RLConfig, QUICKSTART, ["trainer.algorithm=gspo"])
    assert cfg.actor.policy_loss.loss_mode == "gspo" and cfg.actor.clip_ratio_high == 0.0004
    assert cfg.actor.loss_agg_mode == "token-mean"  # the quickstart sets it: it wins over gspo's


def test_a_key_that_changes_the_method_is_allowed_and_wins():
    cfg = load_config(RLConfig, None, ["trainer.algorithm=ppo", "algorithm.adv_estimator=grpo"])
    assert cfg.trainer.algorithm == "ppo" and cfg.algorithm.adv_estimator == "grpo"
    assert cfg._learners() == ("actor",)


def test_a_saved_config_reads_back_as_it_ran():
    cfg = load_config(RLConfig, None, ["trainer.algorithm=dapo", "algorithm.filter_groups.enable=false"])
    saved = yaml.safe_load(yaml.safe_dump(config_to_dict(cfg)))
    assert from_dict(RLConfig, saved) == cfg


@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.relpath(p, REPO) for p in SHIPPED])
def test_shipped_configs_resolve_as_with_the_presets_off(path):
    cls = config_class(path, [])
    cfg = load_config(cls, path)
    without_presets = from_dict(cls, read_yaml(path), base=cls())  # a base given: no preset
    check_config(without_presets)
    assert cfg == without_presets


def test_config_show_prints_the_resolved_values(capsys, tmp_path):
    # the buffer's length is the user's: the quickstart's responses are 8 tokens
    assert cli.main(["config", "show", QUICKSTART, "trainer.algorithm=dapo", "reward.overlong_buffer.len=4"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["actor"]["clip_ratio_high"] == 0.28
    assert shown["algorithm"]["filter_groups"] == {"enable": True, "metric": "acc", "max_num_gen_batches": 10}
    assert shown["reward"]["overlong_buffer"]["enable"] is True
    assert cli.main(["config", "show", QUICKSTART, "trainer.algorithm=ppo"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["algorithm"]["adv_estimator"] == "grpo"  # the quickstart sets it
    path = tmp_path / "ppo.yaml"
    path.write_text("trainer: {algorithm: ppo}\n")
    assert cli.main(["config", "show", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["algorithm"]["adv_estimator"] == "gae"


ASYNC_SPLIT = ["rollout.tensor_parallel_size=1", "async.rollout_devices=1"]


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_asynchronous_modes_default_to_ppo_clip_against_the_behaviour_policy(mode):
    # the old log-probs are the sampler's (bypass mode), PPO's clipped ratio against them
    cfg = load_config(RLConfig, None, [f"trainer.mode={mode}", *ASYNC_SPLIT])
    corr = cfg.algorithm.rollout_correction
    assert corr.bypass_mode is True and corr.loss_type == "ppo_clip" and corr.rollout_is is None
    assert load_config(RLConfig, None, ["trainer.mode=sync"]).algorithm.rollout_correction.bypass_mode is False


@pytest.mark.parametrize("keys", [["algorithm.rollout_correction.rollout_is=token"],
                                  ["algorithm.rollout_correction.bypass_mode=false"]])
def test_any_rollout_correction_key_leaves_the_mode_default_out(keys):
    # decoupled PPO (trainer-recomputed old log-probs with IS weights), or no correction, as written
    cfg = load_config(RLConfig, None, ["trainer.mode=async", *ASYNC_SPLIT, *keys])
    assert cfg.algorithm.rollout_correction.bypass_mode is False


def test_the_mode_default_sits_under_the_algorithm_preset():
    cfg = load_config(RLConfig, None, ["trainer.algorithm=dapo", "trainer.mode=one_step_off", *ASYNC_SPLIT,
                                       "algorithm.filter_groups.enable=false"])
    assert cfg.actor.clip_ratio_high == 0.28 and cfg.algorithm.rollout_correction.bypass_mode is True
