"""RL on 2 processes x 4 CPU devices (jax.distributed over gloo) equals RL on 1 process x 8
devices: the same config with 4 rollout replicas of 2 devices (2 per process, none
spanning processes), fsdp training over all 8 devices. Every process reads the whole
prompt batch, runs its replicas' rounds, and gathers the rest; the sampled tokens (seen
through the rewards and lengths), losses and the final checkpoint must agree.

Two runs: GRPO; and PPO with a critic, validation, and prompts whose lengths differ
sharply between the two processes' replicas (short on the first, long on the second), so
their schedulers run different step counts and shapes and must still not deadlock."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import yaml

from rljax.checkpoint import Checkpointer, abstract_like
from rljax.config import load_config
from rljax.data.synthetic_spec import materialize
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer, train_rl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIGIT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''

MODEL = {"model": {"tokenizer": "char", "hf_config": {
    "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 2, "tie_word_embeddings": True}}}

COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
            "train/grad_norm", "train/loss")


def ragged_rows(path, count: int) -> str:
    """RL rows whose prompts are short in the first half of every batch of 8 and long in
    the second (the replicas of process 1 get the long ones)."""
    rows = []
    for i in range(count):
        a, b = i % 7, (i // 7) % 3
        question = f"{a}+{b}=" if i % 8 < 4 else f"{a}+{b}= think, then answer:"
        rows.append({"data_source": "ragged", "prompt": [{"role": "user", "content": question}],
                     "reward_model": {"ground_truth": str(a + b)}, "extra_info": {"answer": str(a + b)}})
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


PPO = ["trainer.total_steps=1", "algorithm.adv_estimator=gae", "data.max_prompt_length=64", "critic.ppo_mini_batch_size=4", "critic.optim.lr=1e-2",
       "trainer.test_freq=0", "rollout.val_kwargs.n=2", "rollout.val_kwargs.temperature=1.0"]


def write_config(tmp_path) -> tuple[str, list[str]]:
    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(MODEL))
    overrides = [
        "trainer.algorithm=grpo", "trainer.total_steps=2", "trainer.logger=[jsonl]", "trainer.async_save=false",
        "trainer.save_freq=0", 'data.train_files=["synthetic:arithmetic/rl?n=256&seed=0&digits=1"]',
        "data.train_batch_size=8", "data.max_prompt_length=32", "data.bucket_size=16", "rollout.n=4",
        "rollout.response_length=8", "rollout.max_num_seqs=32", "rollout.num_pages=128", "rollout.page_size=8",
        "rollout.tensor_parallel_size=2", "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-2",
        "mesh.data=1", "mesh.fsdp=8", "mesh.tensor=1",
        f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.mode=inline"]
    return str(path), overrides


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_two_processes_run_rl_like_one(tmp_path, algorithm):
    config, overrides = write_config(tmp_path)
    if algorithm == "ppo":
        overrides = [*overrides, *PPO, f"data.train_files=[{ragged_rows(tmp_path / 'train.jsonl', 64)}]",
                     f"data.val_files=[{ragged_rows(tmp_path / 'val.jsonl', 8)}]"]
    two = tmp_path / "two"
    cfg2 = load_config(RLConfig, config, [*overrides, f"trainer.default_local_dir={two}"])
    run2 = str(two / cfg2.trainer.experiment_name)
    materialize(cfg2.data.train_files, os.path.join(run2, "data"), "train")  # not raced by the two processes
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "local_multiprocess.py"), "-n", "2",
         "--devices-per-process", "4", "--timeout", "600", "--",
         "train", config, *overrides, f"trainer.default_local_dir={two}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        one = tmp_path / "one"
        cfg1 = load_config(RLConfig, config, [*overrides, f"trainer.default_local_dir={one}"])
        train_rl(cfg1)
        out, _ = proc.communicate(timeout=700)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"two-process run: {time.time() - start:.1f}s wall")
    assert proc.returncode == 0, out[-5000:]
    run1 = str(one / cfg1.trainer.experiment_name)
    m1, m2 = metrics(run1), metrics(run2)
    steps = [0, 1] if algorithm == "ppo" else [1, 2]  # validation before training logs step 0
    assert [m["step"] for m in m2] == [m["step"] for m in m1] == steps
    compared = COMPARED + (("critic/values/mean", "critic/vf_loss", "val-core/ragged/reward/mean@2",
                            "val-aux/ragged/reference/nll") if algorithm == "ppo" else ())
    seen = set()
    for a, b in zip(m1, m2):
        assert set(a) == set(b)
        for key in compared:
            if key not in a:
                continue
            seen.add(key)
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {key}")
    assert seen == set(compared)
    # the checkpoint both processes wrote equals the one-process one
    with jax.set_mesh(jax.make_mesh((1, 8, 1), ("data", "fsdp", "tensor"),
                                    axis_types=(jax.sharding.AxisType.Auto,) * 3)):
        trainer = RLTrainer(cfg1)  # resumes run 1's last checkpoint: the target layout
        try:
            abstract = {"actor": abstract_like(trainer.actor.state)}
            if trainer.critic is not None:
                abstract["critic"] = abstract_like(trainer.critic.state)
            ref = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
            if trainer.critic is not None:
                ref += [np.asarray(x) for x in jax.tree.leaves(trainer.critic.state.params)]
        finally:
            trainer.close()
    state, _, _ = Checkpointer(os.path.join(run2, "checkpoints"), async_save=False).restore(steps[-1], abstract)
    restored = jax.tree.leaves(state["actor"].params) + (
        jax.tree.leaves(state["critic"].params) if "critic" in state else [])
    assert len(restored) == len(ref)
    for a, b in zip(restored, ref):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)
