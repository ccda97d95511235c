"""Config validation at load time: every numeric field (sign, range), cross-field sizes,
registry names and `trainer.algorithm`, each error naming the full dotted key. No model is
built: these are `load_config` / `validate` calls on dataclasses."""

import glob
import os
import textwrap

import pytest

from rljax.config import ConfigError, load_config, validate
from rljax.rl.config import RL_ALGORITHMS, RLConfig
from rljax.train.run_config import SUPERVISED_ALGORITHMS, RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {"sft": RunConfig, "rl": RLConfig}

# (kind, overrides, regex the one-line message must match: it names the full key)
INVALID = [
    # supervised (RunConfig)
    ("sft", ["optim.lr=-1"], r"^optim\.lr: must be >= 0, got -1"),
    ("sft", ["optim.lr=.nan"], r"^optim\.lr: must be a finite number"),
    ("sft", ["trainer.save_freq=-1"], r"^trainer\.save_freq: must be >= 0"),
    ("sft", ["trainer.test_freq=-5"], r"^trainer\.test_freq: must be >= 0"),
    ("sft", ["trainer.total_steps=0"], r"^trainer\.total_steps: must be >= 1"),
    ("sft", ["trainer.max_to_keep=0"], r"^trainer\.max_to_keep: must be >= 1"),
    ("sft", ["trainer.seed=-1"], r"^trainer\.seed: must be >= 0"),
    ("sft", ["trainer.peak_flops_per_device=-1"], r"^trainer\.peak_flops_per_device: must be >= 0"),
    ("sft", ["trainer.micro_batch_size=3"], r"trainer\.micro_batch_size=3 does not divide data\.batch_size=8"),
    ("sft", ["trainer.logger=[console, wandb]"], r"^trainer\.logger\[1\]: expected one of"),
    ("sft", ["optim.eps=0"], r"^optim\.eps: must be > 0"),
    ("sft", ["optim.weight_decay=-0.1"], r"^optim\.weight_decay: must be >= 0"),
    ("sft", ["optim.betas=[0.9, 1.5]"], r"^optim\.betas: .*\[0, 1\)"),
    ("sft", ["optim.warmup_steps=-1"], r"^optim\.warmup_steps: must be >= 0"),
    ("sft", ["optim.warmup_steps_ratio=2"], r"^optim\.warmup_steps_ratio: must be <= 1"),
    ("sft", ["optim.min_lr_ratio=-0.5"], r"^optim\.min_lr_ratio: must be >= 0"),
    ("sft", ["optim.lr_scheduler_type=linear"], r"^optim\.lr_scheduler_type: unknown 'linear'.*cosine"),
    ("sft", ["data.batch_size=0"], r"^data\.batch_size: must be >= 1, got 0"),
    ("sft", ["data.train_batch_size=0"], r"^data\.batch_size: must be >= 1, got 0"),
    ("sft", ["data.max_length=0"], r"^data\.max_length: must be >= 1, got 0"),
    ("sft", ["data.seed=4294967296"], r"^data\.seed: must be < 4294967296, got 4294967296"),
    ("sft", ["data.truncation=middle"], r"^data\.truncation: expected one of \['error', 'left', 'right'\]"),
    ("sft", ["data.packing=true", "data.format=rl"], r"^data\.packing: only supported for format 'sft'"),
    ("sft", ["data.buckets=[64, 1024]"], r"^data\.buckets: positive lengths <= max_length=512"),
    ("sft", ["trainer.algorithm=dpo", "data.format=preference", "data.max_prompt_length=512"],
     r"^data\.max_prompt_length: must be smaller than data\.max_length"),
    ("sft", ["model.remat=everything"], r"^model\.remat: unknown 'everything'.*save_dots"),
    ("sft", ["model.attention=flash3"], r"^model\.attention: unknown 'flash3'"),
    ("sft", ["model.param_dtype=float33"], r"^model\.param_dtype: unknown dtype 'float33'"),
    ("sft", ["model.init_seed=-3"], r"^model\.init_seed: must be >= 0"),
    ("sft", ["mesh.fsdp=0"], r"^mesh\.fsdp: must be >= 1 or -1 \(the devices left over\), got 0"),
    ("sft", ["mesh.tensor=-2"], r"^mesh\.tensor: must be >= -1, got -2"),
    ("sft", ["mesh.data=-1"], r"^mesh\.fsdp: -1 like data: at most one of data / fsdp / tensor may be -1"),
    ("rl", ["mesh.fsdp=0"], r"^mesh\.fsdp: must be >= 1 or -1"),
    ("sft", ["rm.margin=.nan"], r"^rm\.margin: must be a finite number"),
    ("sft", ["trainer.algorithm=grpoo"], r"^trainer\.algorithm: unknown 'grpoo'; did you mean 'grpo'\?.*sft"),
    ("sft", ["trainer.algorithm=grpo"], r"^trainer\.algorithm: 'grpo' is an RL algorithm"),
    ("sft", ["trainer.algorithm=dpo"], r"^data\.format: 'sft', but trainer\.algorithm=dpo reads 'preference'"),
    ("sft", ["trainer.algorithm=dpo", "data.format=preference", "dpo.beta=0"], r"^dpo\.beta: must be > 0"),
    ("sft", ["trainer.algorithm=dpo", "data.format=preference", "dpo.loss_type=kto"],
     r"^dpo\.loss_type: unknown 'kto'.*sigmoid"),
    ("sft", ["trainer.algorithm=dpo", "data.format=preference", "dpo.label_smoothing=0.7"],
     r"^dpo\.label_smoothing: must be <= 0\.5, got 0\.7"),
    # RL (RLConfig)
    ("rl", ["rollout.n=0"], r"^rollout\.n: must be >= 1, got 0"),
    ("rl", ["actor.ppo_epochs=0"], r"^actor\.ppo_epochs: must be >= 1, got 0"),
    ("rl", ["critic.ppo_epochs=0"], r"^critic\.ppo_epochs: must be >= 1"),
    ("rl", ["actor.ppo_mini_batch_size=0"], r"^actor\.ppo_mini_batch_size: must be >= 1"),
    ("rl", ["data.train_batch_size=12"],
     r"^data\.batch_size=12 is not a multiple of actor\.ppo_mini_batch_size=8"),
    ("rl", ["actor.ppo_micro_batch_size_per_device=3"],
     r"^actor\.ppo_micro_batch_size_per_device=3 does not divide the mini-batch of 8x4=32 rows"),
    ("rl", ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"],
     r"^data\.batch_size=8 is not a multiple of critic\.ppo_mini_batch_size=3"),
    ("rl", ["actor.loss_agg_mode=tokenmean"], r"^actor\.loss_agg_mode: unknown 'tokenmean'; did you mean 'token-mean'"),
    ("rl", ["algorithm.adv_estimator=gae", "critic.loss_agg_mode=x"], r"^critic\.loss_agg_mode: unknown 'x'"),
    ("rl", ["algorithm.adv_estimator=grp"], r"^algorithm\.adv_estimator: unknown 'grp'.*rloo"),
    ("rl", ["actor.policy_loss.loss_mode=ppo"], r"^actor\.policy_loss\.loss_mode: unknown 'ppo'.*vanilla"),
    ("rl", ["actor.kl_loss_type=k9"], r"^actor\.kl_loss_type: unknown KL type 'k9'"),
    ("rl", ["algorithm.kl_penalty=k9"], r"^algorithm\.kl_penalty: unknown KL type 'k9'"),
    ("rl", ["algorithm.kl_ctrl.type=pid"], r"^algorithm\.kl_ctrl\.type: expected one of \['fixed', 'adaptive'\], got 'pid'"),
    ("rl", ["algorithm.kl_ctrl.type=adaptiv"], r"^algorithm\.kl_ctrl\.type: expected one of .*; did you mean 'adaptive'\?"),
    ("rl", ["rollout.response_length=0"], r"^rollout\.response_length: must be >= 1, got 0"),
    ("rl", ["rollout.temperature=-1"], r"^rollout\.temperature: must be >= 0"),
    ("rl", ["rollout.top_p=0"], r"^rollout\.top_p: must be > 0"),
    ("rl", ["rollout.top_p=1.5"], r"^rollout\.top_p: must be <= 1"),
    ("rl", ["rollout.min_p=2"], r"^rollout\.min_p: must be <= 1"),
    ("rl", ["rollout.top_k=-2"], r"^rollout\.top_k: must be >= -1"),
    ("rl", ["rollout.attention=flash"], r"^rollout\.attention: expected one of .*'pallas_tpu'\], got 'flash'"),
    ("rl", ["rollout.num_pages=1"], r"^rollout\.num_pages: 0 \(automatic\) or >= 2"),
    ("rl", ["rollout.page_size=0"], r"^rollout\.page_size: must be >= 1"),
    ("rl", ["rollout.max_num_seqs=0"], r"^rollout\.max_num_seqs: must be >= 1"),
    ("rl", ["rollout.kv_cache_memory_fraction=0"], r"^rollout\.kv_cache_memory_fraction: must be > 0"),
    ("rl", ["rollout.val_kwargs.n=0"], r"^rollout\.val_kwargs\.n: must be >= 1"),
    ("rl", ["rollout.val_kwargs.top_p=0"], r"^rollout\.val_kwargs\.top_p: must be > 0"),
    ("rl", ["rollout.n=1"], r"^rollout\.n: 1 sample per prompt .*algorithm\.adv_estimator=grpo"),
    ("rl", ["trainer.algorithm=grpoo"], r"^trainer\.algorithm: unknown 'grpoo'; did you mean 'grpo'\?.*dapo"),
    ("rl", ["trainer.algorithm=sft"], r"^trainer\.algorithm: 'sft' is a supervised algorithm"),
    ("rl", ["trainer.save_freq=-1"], r"^trainer\.save_freq: must be >= 0"),
    ("rl", ["actor.optim.lr=-1"], r"^actor\.optim\.lr: must be >= 0"),
    ("rl", ["critic.optim.lr=-1"], r"^critic\.optim\.lr: must be >= 0"),
    ("rl", ["actor.clip_ratio=-0.2"], r"^actor\.clip_ratio: must be >= 0"),
    ("rl", ["actor.clip_ratio_high=-0.2"], r"^actor\.clip_ratio_high: must be >= 0"),
    ("rl", ["actor.clip_ratio_c=0.5"], r"^actor\.clip_ratio_c: must be > 1"),
    ("rl", ["actor.kl_loss_coef=-1"], r"^actor\.kl_loss_coef: must be >= 0"),
    ("rl", ["actor.loss_scale_factor=0"], r"^actor\.loss_scale_factor: must be > 0"),
    ("rl", ["actor.policy_loss.clip_cov_ratio=0"], r"^actor\.policy_loss\.clip_cov_ratio: must be > 0"),
    ("rl", ["actor.policy_loss.clip_cov_lb=6"], r"^actor\.policy_loss\.clip_cov_lb=6.* clip_cov_ub=5"),
    ("rl", ["critic.cliprange_value=-1"], r"^critic\.cliprange_value: must be >= 0"),
    ("rl", ["algorithm.gamma=1.5"], r"^algorithm\.gamma: must be <= 1"),
    ("rl", ["algorithm.lam=-0.1"], r"^algorithm\.lam: must be >= 0"),
    ("rl", ["algorithm.kl_ctrl.horizon=0"], r"^algorithm\.kl_ctrl\.horizon: must be >= 1"),
    ("rl", ["algorithm.kl_ctrl.target_kl=0"], r"^algorithm\.kl_ctrl\.target_kl: must be > 0"),
    ("rl", ["algorithm.filter_groups.max_num_gen_batches=0"],
     r"^algorithm\.filter_groups\.max_num_gen_batches: must be >= 1"),
    ("rl", ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
            "algorithm.use_kl_in_reward=true"], r"^algorithm\.filter_groups\.metric=seq_final_reward"),
    ("rl", ["reward.timeout_s=0"], r"^reward\.timeout_s: must be > 0"),
    ("rl", ["reward.num_workers=0"], r"^reward\.num_workers: must be >= 1"),
    ("rl", ["reward.mode=threads"], r"^reward\.mode: expected one of \['process', 'inline'\]"),
    ("rl", ["reward.mode=inlne"], r"^reward\.mode: expected one of .*got 'inlne'; did you mean 'inline'\?"),
    ("rl", ["algorithm.rollout_correction.rollout_is_mode=clip"], r"^algorithm\.rollout_correction\.rollout_is_mode: "
                                                                  r"expected one of \['truncate', 'mask'\]"),
    ("rl", ["reward.max_consecutive_failed_steps=-1"], r"^reward\.max_consecutive_failed_steps: must be >= 0"),
    ("rl", ["reward.trust_custom_reward=true"], r"^reward\.trust_custom_reward: only with reward\.mode=inline"),
    ("rl", ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=100"],
     r"^reward\.overlong_buffer\.len=100: must be in \[1, rollout\.response_length=64\]"),
    ("rl", ["reward.overlong_buffer.penalty_factor=-1"], r"^reward\.overlong_buffer\.penalty_factor: must be >= 0"),
    ("rl", ["reward.reward_model.batch_size=0"], r"^reward\.reward_model\.batch_size: must be >= 1"),
    ("rl", ["reward.reward_model.enable=true"], r"^reward\.reward_model\.path: required"),
    ("rl", ["reward.reward_model.enable=true", "reward.reward_model.path=/no/rm"],
     r"^reward\.reward_model\.path: no such directory '/no/rm'"),
    ("rl", ["reward.custom_reward_function.path=/no/reward.py"],
     r"^reward\.custom_reward_function\.path: no such file '/no/reward\.py'"),
    ("rl", ["reward.custom_reward_function.reward_kwargs={scale: 2}"],
     r"^reward\.custom_reward_function\.reward_kwargs: set, but custom_reward_function\.path is empty"),
    ("rl", ["reward.verifier.max_tokens=0"], r"^reward\.verifier\.max_tokens: must be >= 1"),
    ("rl", ["warmup_sft.enable=true"], r"^warmup_sft\.train_files: required"),
    ("rl", ["warmup_sft.steps=0"], r"^warmup_sft\.steps: must be >= 1"),
    ("rl", ["warmup_sft.lr=-1"], r"^warmup_sft\.lr: must be >= 0"),
    ("rl", ["agent={max_turns: 0}"], r"^agent\.max_turns: must be >= 1, got 0"),
    ("rl", ["agent={max_turn: 3}"], r"^unknown config key 'agent\.max_turn'"),
    ("rl", ["agent.max_turn=3"], r"^unknown config key 'agent\.max_turn'; did you mean 'max_turns'\?"),
    ("rl", ["agent.overflow=drop"], r"^agent\.overflow: expected one of \['truncate', 'end'\], got 'drop'"),
    ("rl", ["agent.max_turns=three"], r"^agent\.max_turns: expected an integer, got 'three'"),
    ("rl", ["agent.environment.option={}"],
     r"^unknown config key 'agent\.environment\.option'; did you mean 'options'"),
    ("rl", ["agent=3"], r"^agent: expected a mapping \(section AgentConfig\), got 3"),
    ("sft", ["data.format=chat"], r"^data\.format: expected one of \['sft', 'preference', 'rl'\], got 'chat'"),
]


@pytest.mark.parametrize("kind,overrides,message", INVALID, ids=[" ".join(c[1]) for c in INVALID])
def test_invalid_value_is_a_config_error_naming_the_key(kind, overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(KINDS[kind], None, overrides)
    assert "\n" not in str(info.value)


# (kind, overrides, devices, regex): sizes that only fail on a given device count
INVALID_ON_DEVICES = [
    ("rl", ["data.train_batch_size=4", "actor.ppo_mini_batch_size=1"], 8,
     r"^actor\.ppo_mini_batch_size=1: the mini-batch of 1x4=4 rows .* data-parallel size 8"),
    ("rl", ["actor.ppo_mini_batch_size=2", "data.train_batch_size=8", "actor.ppo_micro_batch_size_per_device=2"], 8,
     r"^actor\.ppo_micro_batch_size_per_device=2: .*2x8=16 rows .* mini-batch of 2x4=8 rows"),
    ("rl", ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=1", "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4"], 8, r"^critic\.ppo_mini_batch_size=1: "),
    ("rl", ["mesh.data=3", "rollout.n=6", "actor.ppo_mini_batch_size=1", "data.train_batch_size=1"], 8,
     r"^mesh: .*8 devices are not divisible by 3"),
    ("sft", ["data.batch_size=4", "trainer.micro_batch_size=0"], 8, r"^data\.batch_size of size 4 is not divisible"),
    ("sft", ["data.batch_size=16", "trainer.micro_batch_size=4"], 8, r"^trainer\.micro_batch_size of size 4"),
]


@pytest.mark.parametrize("kind,overrides,devices,message", INVALID_ON_DEVICES,
                         ids=[" ".join(c[1]) for c in INVALID_ON_DEVICES])
def test_sizes_checked_against_the_device_count(kind, overrides, devices, message):
    cfg = load_config(KINDS[kind], None, overrides)  # fine without devices
    validate(cfg)
    with pytest.raises(ConfigError, match=message):
        validate(cfg, num_devices=devices)
    fits = 3 if cfg.mesh.data == 3 else 1
    validate(cfg, num_devices=fits)


def test_resume_checkpoint_must_exist_before_the_run(tmp_path):
    """Checked before a run (`validate`), not when a saved config is read back."""
    for kind in KINDS.values():
        cfg = load_config(kind, None, [f"trainer.resume_mode={tmp_path}/gone"])
        with pytest.raises(ConfigError, match=r"^trainer\.resume_mode: no such run directory or checkpoint"):
            validate(cfg)
        validate(load_config(kind, None, [f"trainer.resume_mode={tmp_path}"]), num_devices=1)


def test_defaults_are_valid():
    for cls in (RunConfig, RLConfig):
        validate(cls(), num_devices=8)
        validate(load_config(cls), num_devices=1)


def test_section_defaults_survive_a_partial_section():
    """A YAML section that sets some keys keeps the run kind's defaults for the others
    (RLConfig's trainer.algorithm is grpo, its actor.optim.lr 1e-6), as the dataclass does."""
    cfg = load_config(RLConfig, None, ["trainer.total_steps=3", "actor.optim.weight_decay=0.0"])
    assert cfg.trainer.algorithm == "grpo" and cfg.trainer.total_steps == 3
    assert cfg.actor.optim.lr == RLConfig().actor.optim.lr == 1e-6
    assert cfg.data.format == "rl"


def test_reward_kwargs_reach_the_custom_function(tmp_path):
    """`reward.custom_reward_function.reward_kwargs` (documented in rljax.rewards.custom)
    is a config key, and every call of the function gets them."""
    from rljax.rl.generation import make_reward_manager

    path = tmp_path / "scaled.py"
    path.write_text(textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
            return scale * float(solution_str == ground_truth)
    """))
    cfg = load_config(RLConfig, None, [f"reward.custom_reward_function.path={path}",
                                       "reward.custom_reward_function.reward_kwargs={scale: 2.5}",
                                       "reward.num_workers=1"])
    assert cfg.reward.custom_reward_function.reward_kwargs == {"scale": 2.5}
    item = {"data_source": "d", "solution_str": "a", "ground_truth": "a"}
    with make_reward_manager(cfg) as manager:
        assert manager([item, {**item, "solution_str": "b"}]).scores.tolist() == [2.5, 0.0]


def test_algorithm_sets():
    from rljax.train.tasks import TASKS

    assert set(SUPERVISED_ALGORITHMS) == set(TASKS)
    assert {"grpo", "ppo", "dapo", "rloo", "gspo"} <= set(RL_ALGORITHMS)
    assert not set(SUPERVISED_ALGORITHMS) & set(RL_ALGORITHMS)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))),
                         ids=os.path.basename)
def test_shipped_configs_load_and_validate(path):
    from rljax.commands.run_kinds import config_class

    cfg = load_config(config_class(path, []), path)
    validate(cfg, num_devices=8)
    validate(cfg, num_devices=1)


def test_agent_section_is_typed_and_round_trips(tmp_path):
    """`agent:` is an `AgentConfig` (null: single-turn); a saved config reads back equal."""
    from rljax.agent import AgentConfig, EnvironmentConfig
    from rljax.config import save_config

    assert load_config(RLConfig).agent is None
    cfg = load_config(RLConfig, None, ["agent.max_turns=3", "agent.extra_turn_end_tokens=['<|eom_id|>']",
                                       "agent.environment={class_name: 'pkg.mod:Env', options: {steps: 2}}"])
    assert isinstance(cfg.agent, AgentConfig) and cfg.agent.max_turns == 3
    assert cfg.agent.extra_turn_end_tokens == ("<|eom_id|>",)
    assert cfg.agent.environment == EnvironmentConfig("pkg.mod:Env", {"steps": 2})
    for saved in (cfg, load_config(RLConfig)):
        save_config(saved, str(tmp_path / "config.yaml"))
        assert load_config(RLConfig, str(tmp_path / "config.yaml")) == saved


def test_agent_config_of_the_rl_loop_accepts_the_typed_section():
    """`rljax.rl.agent_rollout.agent_config` takes the section (the trainer) or its YAML mapping."""
    from rljax.rl.agent_rollout import agent_config

    cfg = load_config(RLConfig, None, ["agent.max_turns=2", "agent.tool_config_path=configs/tools/calculator.yaml"])
    typed = agent_config(cfg.agent)
    assert typed == agent_config({"max_turns": 2, "tool_config_path": "configs/tools/calculator.yaml"})
    assert os.path.isabs(typed.tool_config_path) and os.path.isfile(typed.tool_config_path)


def test_actor_loss_config_carries_the_policy_loss_knobs():
    """`ActorConfig.loss_config`: the actor's and actor.policy_loss's knobs as `PolicyLossParams`."""
    from rljax.algos.policy_loss import PolicyLossParams

    cfg = load_config(RLConfig, None, ["actor.clip_ratio_high=0.28", "actor.loss_scale_factor=512",
                                       "actor.policy_loss.clip_cov_ub=4", "actor.policy_loss.ppo_kl_coef=0.5"])
    assert cfg.actor.loss_config == PolicyLossParams(clip_ratio_high=0.28, loss_scale_factor=512.0, clip_cov_ub=4.0,
                                                     ppo_kl_coef=0.5)
    assert RLConfig().actor.loss_config == PolicyLossParams()
