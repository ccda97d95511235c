"""The shipped configs on 2 processes x 4 CPU devices (jax.distributed over gloo) run like
1 process x 8 devices, the SFT warm-up included: its losses, the Hugging Face folder it
hands to RL (written by process 0 from parameters sharded over both processes), and the RL
metrics agree. Each config is shortened by overrides (a few warm-up and RL steps, small
batches and validation) and samples on rollout replicas of 2 devices (a run of several
processes cannot sample on the training mesh). The LoRA run is the quickstart with
adapters (README, LoRA); its policy is then exported as a PEFT folder by `rljax export` on
2 processes and by one process, and the two folders agree.

The two-process run is launched as a user would (`launch/local_multiprocess.py`); the
one-process run is this process's, meanwhile."""

import os
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

import rljax.rl.generation as generation
from rljax.rl.policy_checkpoint import export_policy
from rljax.rl.trainer import train_rl
from tests.parallel.test_multihost_rl import (
    DIGIT_REWARD,
    SCRIPTED_AGENT_HOOK,
    assert_metrics_agree,
    configs,
    finish,
    launch,
    metrics,
    scripted_make_sampler,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")
AGENT_QUICKSTART = os.path.join(ROOT, "configs", "agent_quickstart.yaml")

SHORT = ["trainer.logger=[jsonl]", "trainer.async_save=false", "trainer.total_steps=2", "trainer.test_freq=2",
         "warmup_sft.steps=3", "warmup_sft.batch_size=8", "data.train_batch_size=4", "rollout.n=4",
         "actor.ppo_mini_batch_size=4", "rollout.val_kwargs.n=2", "rollout.max_num_seqs=16",
         "rollout.num_pages=128", "rollout.tensor_parallel_size=2"]
QUICKSTART_SHORT = [*SHORT, 'data.val_files=["synthetic:arithmetic/rl?n=8&seed=2&digits=1&operators=%2B"]']
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


def digit_reward(tmp_path) -> list[str]:
    """The quickstart's exact-match reward is 0 for every sample of a 3-step warm-up (the
    GRPO loss would be 0); the fraction of digits in the answer varies, so the update does."""
    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    return [f"reward.custom_reward_function.path={tmp_path / 'reward.py'}"]

SFT_COMPARED = ("train/loss", "train/grad_norm", "train/loss_denominator")
RL_COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
               "actor/grad_norm", "actor/loss")


def assert_folders_agree(one: str, two: str, atol: float) -> float:
    """The safetensors of two Hugging Face / PEFT folders hold the same tensors, within
    `atol`; -> the largest difference."""
    files = sorted(f for f in os.listdir(one) if f.endswith(".safetensors"))
    assert files and files == sorted(f for f in os.listdir(two) if f.endswith(".safetensors"))
    assert sorted(os.listdir(one)) == sorted(os.listdir(two))
    worst = 0.0
    for name in files:
        a, b = load_file(os.path.join(one, name)), load_file(os.path.join(two, name))
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=0, atol=atol, err_msg=f"{name} {key}")
            worst = max(worst, float(np.max(np.abs(b[key].astype(np.float64) - a[key]))))
    return worst


def run_both(tmp_path, config: str, overrides: list[str], hook: str = "", one_process=train_rl):
    """The config on 2 processes (launched) and on this process; -> (cfg, run 1, run 2)."""
    (cfg1, _), run1, run2 = configs(tmp_path, config, overrides)
    start = time.time()
    proc = launch(tmp_path, ["train", config, *overrides, f"trainer.default_local_dir={tmp_path / 'two'}"], hook=hook)
    try:
        one_process(cfg1)
    finally:
        code, out = finish(proc)
    print(f"two-process run: {time.time() - start:.1f}s wall")
    assert code == 0, out[-5000:]
    return cfg1, run1, run2


def assert_runs_agree(run1: str, run2: str, rl_compared=RL_COMPARED) -> None:
    """The warm-up's losses and export, and the RL metrics, of the two runs agree."""
    sft1, sft2 = (os.path.join(r, "warmup_sft") for r in (run1, run2))
    assert_metrics_agree(metrics(sft1), metrics(sft2), SFT_COMPARED)
    print("warm-up export: largest difference", assert_folders_agree(os.path.join(sft1, "hf"),
                                                                      os.path.join(sft2, "hf"), atol=1e-5))
    m1, m2 = metrics(run1), metrics(run2)
    assert [m["step"] for m in m1] == [0, 1, 2]  # validation at steps 0 and 2
    assert_metrics_agree(m1, m2, rl_compared)
    for a, b in zip(m1, m2):
        print("step", a["step"], {k: (a[k], b[k]) for k in rl_compared if k in a})
    for name, x, y in (("warm-up", metrics(sft1), metrics(sft2)), ("RL", m1, m2)):
        keys = SFT_COMPARED if name == "warm-up" else rl_compared
        diffs = [abs(a[k] - b[k]) for a, b in zip(x, y) for k in keys if k in a]
        print(f"{name} metrics: largest difference {max(diffs):.3g}")


@pytest.mark.slow
def test_quickstart_on_two_processes_equals_one(tmp_path):
    _, run1, run2 = run_both(tmp_path, QUICKSTART, [*QUICKSTART_SHORT, *digit_reward(tmp_path)])
    assert metrics(run1)[1]["actor/grad_norm"] > 0
    assert_runs_agree(run1, run2, RL_COMPARED + ("val-core/synthetic/arithmetic/reward/mean@2",))


@pytest.mark.slow
def test_agent_quickstart_on_two_processes_equals_one(tmp_path, monkeypatch):
    """Every episode's first turn is a scripted calculator call (as in
    tests/parallel/test_multihost_rl.py): a warm-up of 3 steps has not learned to call it,
    and the tool's round trip is what an agent run adds."""
    overrides = [*SHORT, 'data.val_files=["synthetic:tool_arithmetic/rl?n=8&seed=2&min_digits=3&max_digits=3'
                         '&tools=false"]', "rollout.response_length=128", "rollout.page_size=16", "rollout.num_pages=256"]

    def one_process(cfg):
        monkeypatch.setattr(generation, "make_sampler", scripted_make_sampler(generation.make_sampler))
        train_rl(cfg)

    _, run1, run2 = run_both(tmp_path, AGENT_QUICKSTART, overrides, hook=SCRIPTED_AGENT_HOOK, one_process=one_process)
    assert metrics(run1)[1]["agent/tool_use_rate"] == 1.0 and metrics(run1)[1]["actor/grad_norm"] > 0
    assert_runs_agree(run1, run2, RL_COMPARED + ("agent/tool_use_rate", "agent/num_turns/mean"))


@pytest.mark.slow
def test_lora_quickstart_on_two_processes_equals_one_and_exports_alike(tmp_path):
    _, run1, run2 = run_both(tmp_path, QUICKSTART, [*QUICKSTART_SHORT, *LORA, *digit_reward(tmp_path)])
    assert metrics(run1)[1]["actor/grad_norm"] > 0
    assert_runs_agree(run1, run2)
    code, out = finish(launch(tmp_path, ["export", run2, "--out", str(tmp_path / "peft2"), "--lora-format", "peft"]))
    assert code == 0, out[-5000:]
    export_policy(run1, str(tmp_path / "peft1"), lora_format="peft")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path / "peft2"))
    print("PEFT export: largest difference",
          assert_folders_agree(str(tmp_path / "peft1"), str(tmp_path / "peft2"), atol=1e-5))
