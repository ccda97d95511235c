"""`rljax plan` reads the config as the run does (the run kind's class through the one
loader): an RL config's defaults are the RL sections' own, and a wrong key is refused."""

import re

import pytest

from rljax.cli import main as cli_main
from rljax.commands.plan import load, make_plan

TINY_MODEL = {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "tie_word_embeddings": True}


@pytest.fixture
def bare_rl_config(tmp_path):
    """An RL config that sets nothing but the algorithm and the model: every size a default."""
    import yaml

    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"algorithm": "grpo"}, "model": {"hf_config": TINY_MODEL}}))
    return str(path)


def test_an_rl_config_without_a_rollout_section_is_planned_with_the_rl_defaults(bare_rl_config):
    """Rows of data.max_prompt_length 256 + rollout.response_length 64 = 320 tokens; the
    mini-batch actor.ppo_mini_batch_size 8 x rollout.n 4 = 32 rows over 8 devices; the
    sampler's rollout.max_num_seqs 64 sequences of a row each, beside the params with
    rollout.kv_cache_memory_fraction 0.3 of the free memory."""
    plan = make_plan(load(bare_rl_config, []), devices=8, device_memory_gb=16)
    assert "micro-batch 32 rows (4 per device) x 320 tokens" in plan.title[1]
    assert plan.kv[0][0].startswith("kv cache: 64 seqs x 320 tokens")
    assert "a sampler beside params + optimizer state gets 0.3 x" in plan.notes[0]


def test_plan_refuses_a_misspelt_key_in_any_section(bare_rl_config, capsys):
    assert cli_main(["plan", bare_rl_config, "rollout.temprature=0.5", "--devices", "8"]) == 1
    assert re.search(r"^rljax: error: plan: unknown config key 'rollout\.temprature'; did you mean",
                     capsys.readouterr().err, re.M)


def test_an_asynchronous_mode_plans_the_trainer_and_the_replicas_on_their_own_devices():
    """one_step_off on 8 devices (one process; async.rollout_devices 0: half): the mesh
    has 4 devices and the replicas the other 4, each holding only its weights and pool."""
    import os

    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.yaml")
    sync = make_plan(load(config, ["rollout.tensor_parallel_size=1"]), devices=8, device_memory_gb=1)
    split = make_plan(load(config, ["rollout.tensor_parallel_size=1", "trainer.mode=one_step_off"]), devices=8,
                      device_memory_gb=1)
    assert "mesh(data=1, fsdp=8, tensor=1) on 8 devices" in sync.title[0] and "trainer.mode" not in sync.title[0]
    assert "on 4 devices" in split.title[0] and "4 of the 8 devices train, the other 4 sample" in split.title[0]
    assert (sync.rollout.dp, split.rollout.dp) == (8, 4)
    # the trainer's shards are about twice as large on half the devices (fsdp=4 instead of 8; norms stay whole)
    params = lambda plan: dict(plan.rows)["params (float32)"]  # noqa: E731
    assert 1.9 * params(sync) < params(split) <= 2 * params(sync)
    rollout_note = [n for n in split.notes if n.startswith("a rollout device:")]
    assert len(rollout_note) == 1 and not any(n.startswith("while the replicas sample") for n in split.notes)
    stream = make_plan(load(config, ["rollout.tensor_parallel_size=1", "trainer.mode=async"]), devices=8,
                       device_memory_gb=1)
    assert "4 of the 8 devices train, the other 4 sample" in stream.title[0] and stream.rows == split.rows
    odd = load(config, ["rollout.tensor_parallel_size=1", "trainer.mode=one_step_off", "async.rollout_devices=8"])
    with pytest.raises(Exception, match=r"async\.rollout_devices=8: each process has 8 devices"):
        make_plan(odd, devices=8)
