"""GRPO on 2 processes x 4 CPU devices (jax.distributed over gloo) equals GRPO on 1 process
x 8 devices: the same config with 4 rollout replicas of 2 devices (2 per process, none
spanning processes), fsdp training over all 8 devices. Every process reads the whole
prompt batch, runs its replicas' rounds, and gathers the rest; the sampled tokens (seen
through the rewards and lengths), losses and the final checkpoint must agree."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
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


def test_two_processes_run_grpo_like_one(tmp_path):
    config, overrides = write_config(tmp_path)
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
    assert [m["step"] for m in m2] == [m["step"] for m in m1] == [1, 2]
    for a, b in zip(m1, m2):
        for key in COMPARED:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {key}")
    # the checkpoint both processes wrote equals the one-process one
    with jax.set_mesh(jax.make_mesh((1, 8, 1), ("data", "fsdp", "tensor"),
                                    axis_types=(jax.sharding.AxisType.Auto,) * 3)):
        trainer = RLTrainer(cfg1)  # resumes run 1's last checkpoint: the target layout
        try:
            abstract = {"actor": abstract_like(trainer.actor.state)}
            ref = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
        finally:
            trainer.close()
    state, _, _ = Checkpointer(os.path.join(run2, "checkpoints"), async_save=False).restore(2, abstract)
    for a, b in zip(jax.tree.leaves(state["actor"].params), ref):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)
