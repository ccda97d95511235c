"""The supervised trainers end to end on synthetic data: learning, resume after SIGKILL,
export to transformers, and config errors."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rljax.checkpoint import Checkpointer
from rljax.config import ConfigError, load_config
from rljax.train.export import abstract_train_state, export_checkpoint, load_run_config
from rljax.train.loop import train
from rljax.train.run_config import RunConfig
from rljax.train.setup import build_decoder, load_tokenizer
from rljax.train.tasks import make_task
from rljax.parallel import make_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
FAST = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.async_save=false"]


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run(config_name, tmp_path, *overrides):
    cfg = load_config(RunConfig, os.path.join(CONFIGS, config_name),
                      [f"trainer.default_local_dir={tmp_path}", *FAST, *overrides])
    train(cfg)
    return os.path.join(str(tmp_path), cfg.trainer.experiment_name), cfg


@pytest.mark.slow
def test_sft_loss_falls_and_export_matches_transformers(tmp_path):
    run_dir, cfg = run("sft_tiny.yaml", tmp_path, "trainer.total_steps=30", "trainer.save_freq=0",
                       "trainer.test_freq=0")
    rows = [m for m in metrics(run_dir) if "train/loss" in m]
    first, final = rows[0]["train/loss"], rows[-1]["train/loss"]
    print(f"SFT loss {first:.3f} -> {final:.3f}; val {rows[-1].get('val/loss')}")
    assert final < 0.6 * first
    out = str(tmp_path / "hf")
    export_checkpoint(run_dir, out)
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    # the trained parameters, restored independently of the exporter
    tokenizer = load_tokenizer(cfg.model)
    mesh = make_mesh(cfg.mesh)
    module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, tokenizer, weights=False), mesh).module)
    graphdef, abstract = abstract_train_state(module, cfg, mesh)
    state, _, _ = Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).restore(30, abstract)
    model = nnx.merge(graphdef, state.params)
    ids = np.asarray([tokenizer.encode("12+7=19"), tokenizer.encode("40-3=37")], np.int32)
    ours = np.asarray(model(jnp.asarray(ids)))
    with torch.no_grad():
        ref = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)


@pytest.mark.slow
def test_dpo_raises_margin_and_accuracy(tmp_path):
    run_dir, _ = run("dpo_tiny.yaml", tmp_path, "trainer.total_steps=30", "trainer.save_freq=0",
                     "trainer.test_freq=0")
    rows = metrics(run_dir)
    train_rows = [m for m in rows if "rewards/margins" in m]
    assert abs(train_rows[0]["rewards/margins"]) < 1e-6  # policy == reference at step 1
    val = [m for m in rows if "val/rewards/margins" in m][-1]
    print("DPO val", val)
    assert val["val/rewards/margins"] > 0.05 and val["val/rewards/accuracies"] > 0.6


@pytest.mark.slow
def test_reward_model_separates_pairs_and_exports(tmp_path):
    run_dir, cfg = run("rm_tiny.yaml", tmp_path, "trainer.total_steps=20", "data.batch_size=32",
                       "trainer.save_freq=0", "trainer.test_freq=0")
    val = [m for m in metrics(run_dir) if "val/rm/accuracy" in m][-1]
    print("RM val", val)
    # 256 validation pairs: chance is 0.5 +- 0.03, the untrained loss is ln 2 = 0.693
    assert val["val/rm/accuracy"] >= 0.65 and val["val/loss"] < 0.6
    out = str(tmp_path / "hf_rm")
    export_checkpoint(run_dir, out)
    hf, info = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


KILL_AT_STEP_7 = textwrap.dedent("""
    import os, signal, sys
    import jax
    jax.config.update("jax_default_matmul_precision", "highest")
    from rljax.config import load_config
    from rljax.train import loop
    from rljax.tracking import Tracker
    from rljax.train.run_config import RunConfig
    real_log = Tracker.log
    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == 7:
            os.kill(os.getpid(), signal.SIGKILL)   # no cleanup, no final save
    Tracker.log = log
    loop.train(load_config(RunConfig, sys.argv[1], sys.argv[2:]))
""")


@pytest.mark.slow
def test_sigkill_then_resume_ends_bit_identical(tmp_path, capsys):
    common = ["trainer.total_steps=10", "trainer.save_freq=4", "trainer.test_freq=0", "data.val_files=[]",
              "optim.lr_scheduler_type=cosine", "optim.warmup_steps=2"]
    straight_dir, _ = run("sft_tiny.yaml", tmp_path / "a", *common)
    config = os.path.join(CONFIGS, "sft_tiny.yaml")
    overrides = [f"trainer.default_local_dir={tmp_path / 'b'}", *FAST, *common]
    killed = subprocess.run([sys.executable, "-c", KILL_AT_STEP_7, config, *overrides],
                            capture_output=True, text=True, env={**os.environ}, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed_dir = str(tmp_path / "b" / "sft_tiny")
    assert max(m["step"] for m in metrics(resumed_dir)) == 7
    assert Checkpointer(os.path.join(resumed_dir, "checkpoints")).latest_step() == 4
    train(load_config(RunConfig, config, overrides))
    assert "resumed from" in capsys.readouterr().out

    def final_params(run_dir):
        cfg = load_run_config(run_dir)
        tokenizer = load_tokenizer(cfg.model)
        mesh = make_mesh(cfg.mesh)
        module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, tokenizer, weights=False), mesh).module)
        _, abstract = abstract_train_state(module, cfg, mesh)
        state, data, _ = Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).restore(10, abstract)
        return jax.device_get(state), data

    (a, data_a), (b, data_b) = final_params(straight_dir), final_params(resumed_dir)
    assert data_a == data_b
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("override, message", [
    ("optim.lrr=1e-5", "unknown config key 'optim.lrr'; did you mean 'lr'"),
    ("trainer.total_step=5", "did you mean 'total_steps'"),
    ("trainer.total_steps=five", "trainer.total_steps: expected an integer"),
    ("model.param_dtype=3", "model.param_dtype: expected a string"),
    ("trainer", "not of the form"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(RunConfig, os.path.join(CONFIGS, "sft_tiny.yaml"), [override])


def test_unknown_key_in_yaml_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  total_stepz: 3\n")
    with pytest.raises(ConfigError, match="trainer.total_stepz"):
        load_config(RunConfig, str(path))


def test_resolved_config_is_saved_and_reloads(tmp_path):
    cfg = load_config(RunConfig, os.path.join(CONFIGS, "sft_tiny.yaml"), ["optim.lr=1e-5"])
    from rljax.config import save_config
    save_config(cfg, str(tmp_path / "config.yaml"))
    assert load_run_config(str(tmp_path)) == cfg
