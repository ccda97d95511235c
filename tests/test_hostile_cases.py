"""Hostile inputs, each answered by one clear line that names what is wrong: config keys
with impossible values (counts and sizes past their upper limits, model shapes no model
can have), and bad uses of the command line. Every case is cheap: a config load and
validation, or a CLI call that stops before any work. docs/hostile-cases.md lists these
cases with the rest (damaged checkpoints, bad data files, sandbox escapes, concurrent
runs...), which other tests cover.

CASES: (id, config, overrides, regex the one-line message must match)."""

import os
import re

import pytest

from rljax import cli
from rljax.config import ConfigError, load_config, validate
from rljax.rl.config import RLConfig
from rljax.train.run_config import RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT = os.path.join(REPO, "configs", "sft_tiny.yaml")
RL = os.path.join(REPO, "configs", "quickstart.yaml")
ROOTS = {SFT: RunConfig, RL: RLConfig}

CASES = [
    # counts and sizes past their upper limits (supervised config)
    ("num_threads", SFT, ["data.num_threads=100000"], r"^data\.num_threads: must be <= 1024, got 100000$"),
    ("prefetch", SFT, ["data.prefetch_buffer_size=100000000"], r"^data\.prefetch_buffer_size: must be <= 1048576"),
    ("max_length_huge", SFT, ["data.max_length=100000000"], r"^data\.max_length: must be <= 4194304"),
    ("batch_size_huge", SFT, ["data.batch_size=10000000"], r"^data\.batch_size: must be <= 1048576"),
    ("val_batch_size_0", SFT, ["data.val_batch_size=0"], r"^data\.val_batch_size: must be >= 1, got 0$"),
    ("num_epochs_0", SFT, ["data.num_epochs=0"], r"^data\.num_epochs: must be >= 1, got 0$"),
    ("num_epochs_huge", SFT, ["data.num_epochs=1000000"], r"^data\.num_epochs: must be <= 10000"),
    ("bucket_size_neg", SFT, ["data.bucket_size=-1"], r"^data\.bucket_size: must be >= 0, got -1$"),
    ("total_steps_huge", SFT, ["trainer.total_steps=10000000000"], r"^trainer\.total_steps: must be <= 2147483647"),
    ("save_freq_huge", SFT, ["trainer.save_freq=10000000000"], r"^trainer\.save_freq: must be <= 2147483647"),
    ("test_freq_huge", SFT, ["trainer.test_freq=10000000000"], r"^trainer\.test_freq: must be <= 2147483647"),
    ("max_to_keep_huge", SFT, ["trainer.max_to_keep=100000"], r"^trainer\.max_to_keep: must be <= 10000"),
    ("trainer_seed_huge", SFT, ["trainer.seed=4294967296"], r"^trainer\.seed: must be < 4294967296"),
    ("skipped_neg", SFT, ["trainer.max_consecutive_skipped_steps=-1"],
     r"^trainer\.max_consecutive_skipped_steps: must be >= 0"),
    ("micro_batch_huge", SFT, ["trainer.micro_batch_size=10000000"], r"^trainer\.micro_batch_size: must be <= 1048576"),
    ("init_seed_huge", SFT, ["model.init_seed=4294967296"], r"^model\.init_seed: must be < 4294967296"),
    ("lora_rank_neg", SFT, ["model.lora.rank=-1"], r"^model\.lora\.rank: must be >= 0, got -1$"),
    ("lora_rank_huge", SFT, ["model.lora.rank=100000"], r"^model\.lora\.rank: must be <= 65536"),
    ("lora_seed_neg", SFT, ["model.lora.init_seed=-1"], r"^model\.lora\.init_seed: must be >= 0"),
    ("warmup_steps_huge", SFT, ["optim.warmup_steps=10000000000"], r"^optim\.warmup_steps: must be <= 2147483647"),
    ("mesh_data_huge", SFT, ["mesh.data=100000"], r"^mesh\.data: must be <= 65536"),
    ("mesh_tensor_huge", SFT, ["mesh.tensor=100000"], r"^mesh\.tensor: must be <= 65536"),
    # values of the wrong kind or outside any range (supervised config)
    ("lr_inf", SFT, ["optim.lr=1e400"], r"^optim\.lr: must be a finite number, got inf$"),
    ("lr_text", SFT, ["optim.lr=fast"], r"^optim\.lr: expected a number, got 'fast'$"),
    ("total_steps_float", SFT, ["trainer.total_steps=1.5"], r"^trainer\.total_steps: expected an integer, got 1\.5$"),
    ("total_steps_bool", SFT, ["trainer.total_steps=true"], r"^trainer\.total_steps: expected an integer, got True$"),
    ("async_save_text", SFT, ["trainer.async_save=maybe"], r"^trainer\.async_save: expected true/false, got 'maybe'$"),
    ("logger_not_list", SFT, ["trainer.logger=jsonl"], r"^trainer\.logger: expected a list"),
    ("experiment_empty", SFT, ["trainer.experiment_name="], r"^trainer\.experiment_name: must not be empty$"),
    ("path_too_long", SFT, ["model.path=/" + "a/" * 2100], r"^model\.path: is 4201 bytes long, over the 4096"),
    ("path_name_too_long", SFT, ["data.train_files=[/data/" + "x" * 300 + ".parquet]"],
     r"^data\.train_files: has a name of 308 bytes \(x+\.\.\.\), over the 255 a file name may have$"),
    ("experiment_name_too_long", SFT, ["trainer.experiment_name=" + "r" * 256],
     r"^trainer\.experiment_name: has a name of 256 bytes"),
    ("run_dir_too_long", RL, ["trainer.default_local_dir=/" + "d" * 4100],
     r"^trainer\.default_local_dir: is 4101 bytes long"),
    ("unknown_section", SFT, ["trainr.total_steps=5"], r"^unknown config key 'trainr\.total_steps'; did you mean"),
    ("unknown_leaf", SFT, ["trainer.total_step=5"], r"^unknown config key 'trainer\.total_step'; did you mean "
                                                     r"'total_steps'\?$"),
    ("data_format", SFT, ["data.format=csv"], r"^data\.format: expected one of \["),
    ("resume_missing", SFT, ["trainer.resume_mode=/no/such/run"],
     r"^trainer\.resume_mode: no such run directory or checkpoint '/no/such/run'"),
    ("compute_dtype_int", SFT, ["model.compute_dtype=int8"], r"^model\.compute_dtype: 'int8' is not a floating-point"),
    ("lora_alpha_0", SFT, ["model.lora.rank=8", "model.lora.alpha=0"], r"^model\.lora\.alpha: must be > 0"),
    ("nul_in_name", SFT, ['trainer.experiment_name="a\\0b"'], r"^trainer\.experiment_name: contains a NUL character"),
    ("nul_in_files", SFT, ['data.train_files=["x\\0.jsonl"]'], r"^data\.train_files: contains a NUL character"),
    # impossible model shapes (model.hf_config, checked at load)
    ("hidden_neg", SFT, ["model.hf_config.hidden_size=-64"],
     r"^model\.hf_config\.hidden_size: must be in \[1, 2147483647\], got -64$"),
    ("hidden_0", SFT, ["model.hf_config.hidden_size=0"], r"^model\.hf_config\.hidden_size: must be in \[1, "),
    ("hidden_float", SFT, ["model.hf_config.hidden_size=64.5"],
     r"^model\.hf_config\.hidden_size: must be a whole number, got 64\.5$"),
    ("hidden_text", SFT, ["model.hf_config.hidden_size=big"],
     r"^model\.hf_config\.hidden_size: must be a whole number, got 'big'$"),
    ("intermediate_0", SFT, ["model.hf_config.intermediate_size=0"], r"^model\.hf_config\.intermediate_size: must be"),
    ("layers_neg", SFT, ["model.hf_config.num_hidden_layers=-1"], r"^model\.hf_config\.num_hidden_layers: must be"),
    ("heads_0", SFT, ["model.hf_config.num_attention_heads=0"], r"^model\.hf_config\.num_attention_heads: must be"),
    ("kv_not_dividing", SFT, ["model.hf_config.num_key_value_heads=3"],
     r"^model\.hf_config\.num_key_value_heads: 3 does not divide num_attention_heads=4$"),
    ("heads_not_dividing_hidden", SFT, ["model.hf_config.num_attention_heads=6", "model.hf_config.num_key_value_heads=3"],
     r"^model\.hf_config\.num_attention_heads: 6 does not divide hidden_size=64 \(and head_dim is not set\)$"),
    ("head_dim_0", SFT, ["model.hf_config.head_dim=0"], r"^model\.hf_config\.head_dim: must be in \[1, "),
    ("vocab_0", SFT, ["model.hf_config.vocab_size=0"], r"^model\.hf_config\.vocab_size: must be in \[1, "),
    ("vocab_huge", SFT, ["model.hf_config.vocab_size=1000000000000"],
     r"^model\.hf_config\.vocab_size: must be in \[1, 2147483647\], got 1000000000000$"),
    ("positions_0", SFT, ["model.hf_config.max_position_embeddings=0"],
     r"^model\.hf_config\.max_position_embeddings: must be"),
    ("model_type_unknown", SFT, ["model.hf_config.model_type=gpt2"],
     r"^model\.hf_config\.model_type: 'gpt2' is not supported; rljax implements \["),
    ("rope_theta_neg", SFT, ["model.hf_config.rope_theta=-1"],
     r"^model\.hf_config\.rope_theta: must be a finite number > 0, got -1$"),
    ("rope_theta_0", SFT, ["model.hf_config.rope_theta=0"], r"^model\.hf_config\.rope_theta: must be a finite"),
    ("rope_theta_inf", SFT, ["model.hf_config.rope_theta=.inf"], r"^model\.hf_config\.rope_theta: must be a finite"),
    ("rope_factor_neg", SFT, ["model.hf_config.rope_scaling={rope_type: linear, factor: -2}"],
     r"^model\.hf_config\.rope_parameters\.factor: must be a finite number > 0, got -2$"),
    ("rms_eps_0", SFT, ["model.hf_config.rms_norm_eps=0"], r"^model\.hf_config\.rms_norm_eps: must be a finite"),
    ("rms_eps_neg", SFT, ["model.hf_config.rms_norm_eps=-1e-6"], r"^model\.hf_config\.rms_norm_eps: must be"),
    ("init_range_neg", SFT, ["model.hf_config.initializer_range=-1"],
     r"^model\.hf_config\.initializer_range: must be a finite number >= 0"),
    ("tie_not_bool", SFT, ["model.hf_config.tie_word_embeddings=2"],
     r"^model\.hf_config\.tie_word_embeddings: must be true or false, got 2$"),
    ("bos_neg", SFT, ["model.hf_config.bos_token_id=-5"], r"^model\.hf_config\.bos_token_id: must be a token id >= 0"),
    ("eos_list_neg", SFT, ["model.hf_config.eos_token_id=[1, -2]"],
     r"^model\.hf_config\.eos_token_id: must be a token id >= 0 \(or null\), got \[1, -2\]$"),
    # counts and sizes past their upper limits, impossible values (RL config)
    ("rollout_n_huge", RL, ["rollout.n=100000"], r"^rollout\.n: must be <= 65536, got 100000$"),
    ("response_length_huge", RL, ["rollout.response_length=100000000"], r"^rollout\.response_length: must be <= "),
    ("max_num_seqs_huge", RL, ["rollout.max_num_seqs=10000000"], r"^rollout\.max_num_seqs: must be <= 1048576"),
    ("batched_tokens_huge", RL, ["rollout.max_num_batched_tokens=1000000000"],
     r"^rollout\.max_num_batched_tokens: must be <= 67108864"),
    ("page_size_0", RL, ["rollout.page_size=0"], r"^rollout\.page_size: must be >= 1, got 0$"),
    ("num_pages_huge", RL, ["rollout.num_pages=1000000000"], r"^rollout\.num_pages: must be <= 16777216"),
    ("scheduler_steps_0", RL, ["rollout.num_scheduler_steps=0"], r"^rollout\.num_scheduler_steps: must be >= 1"),
    ("scheduler_steps_huge", RL, ["rollout.num_scheduler_steps=1000000"], r"^rollout\.num_scheduler_steps: must be <="),
    ("tp_huge", RL, ["rollout.tensor_parallel_size=1000000"], r"^rollout\.tensor_parallel_size: must be <= 65536"),
    ("dp_neg", RL, ["rollout.data_parallel_size=-1"], r"^rollout\.data_parallel_size: must be >= 0"),
    ("rollout_seed_neg", RL, ["rollout.seed=-1"], r"^rollout\.seed: must be >= 0, got -1$"),
    ("rollout_seed_huge", RL, ["rollout.seed=4294967296"], r"^rollout\.seed: must be < 4294967296"),
    ("top_k_huge", RL, ["rollout.top_k=1000000000"], r"^rollout\.top_k: must be <= 16777216"),
    ("temperature_inf", RL, ["rollout.temperature=.inf"], r"^rollout\.temperature: must be a finite number"),
    ("val_n_huge", RL, ["rollout.val_kwargs.n=1000000"], r"^rollout\.val_kwargs\.n: must be <= 65536"),
    ("ppo_epochs_huge", RL, ["actor.ppo_epochs=1000000"], r"^actor\.ppo_epochs: must be <= 10000"),
    ("mini_batch_huge", RL, ["actor.ppo_mini_batch_size=10000000"], r"^actor\.ppo_mini_batch_size: must be <="),
    ("micro_batch_neg", RL, ["actor.ppo_micro_batch_size_per_device=-1"],
     r"^actor\.ppo_micro_batch_size_per_device: must be >= 0"),
    ("entropy_nan", RL, ["actor.entropy_coeff=.nan"], r"^actor\.entropy_coeff: must be a finite number"),
    ("actor_warmup_neg", RL, ["actor.optim.warmup_steps=-1"], r"^actor\.optim\.warmup_steps: must be >= 0"),
    ("critic_epochs_huge", RL, ["critic.ppo_epochs=1000000"], r"^critic\.ppo_epochs: must be <= 10000"),
    ("horizon_huge", RL, ["algorithm.kl_ctrl.horizon=10000000000"], r"^algorithm\.kl_ctrl\.horizon: must be <= "),
    ("gen_batches_huge", RL, ["algorithm.filter_groups.max_num_gen_batches=1000000"],
     r"^algorithm\.filter_groups\.max_num_gen_batches: must be <= 10000"),
    ("gamma_nan", RL, ["algorithm.gamma=.nan"], r"^algorithm\.gamma: must be a finite number"),
    ("reward_workers_huge", RL, ["reward.num_workers=5000"], r"^reward\.num_workers: must be <= 1024, got 5000$"),
    ("reward_failed_huge", RL, ["reward.max_consecutive_failed_steps=10000000000"],
     r"^reward\.max_consecutive_failed_steps: must be <= 2147483647"),
    ("reward_timeout_neg", RL, ["reward.timeout_s=-1"], r"^reward\.timeout_s: must be > 0"),
    ("rm_batch_huge", RL, ["reward.reward_model.batch_size=10000000"], r"^reward\.reward_model\.batch_size: must be <="),
    ("verifier_tokens_huge", RL, ["reward.verifier.max_tokens=100000000"], r"^reward\.verifier\.max_tokens: must be <="),
    ("verifier_seqs_huge", RL, ["reward.verifier.max_num_seqs=10000000"], r"^reward\.verifier\.max_num_seqs: must be"),
    ("verifier_pages_neg", RL, ["reward.verifier.num_pages=-1"], r"^reward\.verifier\.num_pages: must be >= 0"),
    ("overlong_len_huge", RL, ["reward.overlong_buffer.len=100000000"], r"^reward\.overlong_buffer\.len: must be <="),
    ("warmup_sft_steps_huge", RL, ["warmup_sft.steps=10000000000"], r"^warmup_sft\.steps: must be <= 2147483647"),
    ("warmup_sft_batch_huge", RL, ["warmup_sft.batch_size=10000000"], r"^warmup_sft\.batch_size: must be <= 1048576"),
    ("agent_turns_huge", RL, ["agent={max_turns: 100000}"], r"^agent\.max_turns: must be <= 10000, got 100000$"),
    ("agent_tools_huge", RL, ["agent={max_parallel_tool_calls: 5000}"], r"^agent\.max_parallel_tool_calls: must be <="),
    ("agent_tokens_0", RL, ["agent={max_response_tokens: 0}"], r"^agent\.max_response_tokens: must be >= 1"),
    ("rl_hidden_neg", RL, ["model.hf_config.hidden_size=-64"], r"^model\.hf_config\.hidden_size: must be in \[1, "),
]


@pytest.mark.parametrize("config, overrides, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_hostile_config_value_is_one_line_naming_its_key(config, overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(load_config(ROOTS[config], config, overrides), num_devices=8)
    text = str(info.value)
    assert "\n" not in text and re.search(message, text), text


def test_the_cases_are_distinct():
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({(c[1], tuple(c[2])) for c in CASES}) == len(CASES)


# bad uses of the command line: (id, argv, exit code, regex of the first stderr line)
CLI_CASES = [
    ("unknown_command", ["trian"], 2, r"invalid choice: 'trian'"),
    ("export_without_out", ["export", "/tmp"], 2, r"the following arguments are required: --out"),
    ("export_step_not_a_number", ["export", "/tmp", "--out", "/tmp/x", "--step", "seven"], 2,
     r"argument --step: invalid int value: 'seven'"),
    ("export_lora_format", ["export", "/tmp", "--out", "/tmp/x", "--lora-format", "gguf"], 2,
     r"argument --lora-format: invalid choice: 'gguf'"),
    ("export_not_a_run", ["export", "/no/such/run", "--out", "{tmp}/out"], 1,
     r"^rljax: error: .*/no/such/run"),
    ("export_out_is_a_file", ["export", "/no/such/run", "--out", "{tmp}/file"], 1,
     r"^rljax: error: --out .*/file is a file, not a folder$"),
    ("plan_unknown_key", ["plan", SFT, "optim.lrr=1"], 1, r"^rljax: error: plan: unknown config key 'optim\.lrr'"),
    ("train_missing_config", ["train", "/no/such.yaml"], 1, r"^rljax: error: .*No such file or directory.*/no/such\.yaml"),
    ("train_override_without_equals", ["train", SFT, "optim.lr"], 2, r"^rljax: error: .*optim\.lr"),
    ("train_hostile_value", ["train", SFT, "data.num_threads=100000"], 2,
     r"^rljax: error: data\.num_threads: must be <= 1024, got 100000$"),
    ("train_model_shape", ["train", SFT, "model.hf_config.hidden_size=-64"], 2,
     r"^rljax: error: model\.hf_config\.hidden_size: must be in \[1, 2147483647\], got -64$"),
    ("eval_missing_checkpoint", ["eval", RL, "--checkpoint", "/no/such/run"], 1, r"^rljax: error: .*/no/such/run"),
]


@pytest.fixture
def no_training(monkeypatch):
    """Any case that got as far as training fails the test instead of training."""
    from rljax.commands import run_kinds

    def refuse(*args, **kwargs):
        raise AssertionError("reached training")

    for name in dir(run_kinds):
        if name.startswith("train"):
            monkeypatch.setattr(run_kinds, name, refuse, raising=False)


@pytest.mark.parametrize("argv, code, message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_each_bad_command_line_is_one_line(argv, code, message, tmp_path, capsys, no_training):
    (tmp_path / "file").write_text("not a folder")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        got = cli.main(argv)
    except SystemExit as e:  # argparse: its usage and one line
        got = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code, (got, err)
    first = next((line for line in err if not line.startswith("usage:") and not line.startswith(" ")), "")
    assert re.search(message, first), err
