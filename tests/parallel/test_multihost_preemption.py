"""Preemption of a 2-process RL run (2 processes x 4 CPU devices, `launch/local_multiprocess.py`):
SIGTERM reaches process 1 alone while its sampler is generating step 2's rollout. Both
processes stop after the same step (jax's preemption sync point: the largest step any
process had reported when the notice reached it, plus one), save it together and exit 75;
the launcher (`--max-restarts 1`) starts the job again, which resumes and ends where an
uninterrupted one-process run of the same config ends: every logged metric and the final
checkpoint agree (rtol 1e-5, as tests/parallel/test_multihost_rl.py compares 2 processes
with 1)."""

import os
import re
import subprocess
import sys

import pytest

from rljax.checkpoint import finalized_steps
from rljax.rl.trainer import train_rl
from tests.parallel.test_multihost_rl import (COMMON, COMPARED, DIGIT_REWARD, ROOT, SHARE_PROGRAMS_HOOK,
                                              assert_checkpoints_agree, assert_metrics_agree, configs, metrics,
                                              ragged_rows, write_config)
from tests.rl.test_rl_preemption import sigterm_during_rollout_of_step_2
from tests.tiny_models import tiny_qwen2_hf

pytestmark = pytest.mark.slow

TOTAL_STEPS = 4


def launch(tmp_path, launcher_args: list[str], command: list[str], hook: str) -> subprocess.Popen:
    """`launch/local_multiprocess.py -n 2 --devices-per-process 4 LAUNCHER_ARGS -- COMMAND`,
    with `hook` in every process's sitecustomize."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SHARE_PROGRAMS_HOOK + hook)
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest",
           "PYTHONPATH": os.pathsep.join([str(hook_dir), ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "local_multiprocess.py"), "-n", "2", "--devices-per-process",
         "4", "--timeout", "600", *launcher_args, "--", *command],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=1500)  # two starts of the job
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


def test_sigterm_to_one_process_mid_rollout_stops_both_at_one_saved_step_and_resumes_like_one(tmp_path):
    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    overrides = [
        *COMMON, "trainer.algorithm=ppo", "algorithm.adv_estimator=gae", f"trainer.total_steps={TOTAL_STEPS}",
        "trainer.save_freq=0", "trainer.test_freq=0", f"data.train_files=[{ragged_rows(tmp_path / 'train.jsonl', 64)}]",
        "data.train_batch_size=8", "data.max_prompt_length=64", "rollout.n=2", "rollout.response_length=8",
        "rollout.max_num_seqs=16", "rollout.num_pages=128", "rollout.page_size=8", "actor.ppo_mini_batch_size=4",
        "critic.ppo_mini_batch_size=4", "critic.optim.lr=1e-2",
        f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.mode=inline"]
    (cfg1, _), run1, run2 = configs(tmp_path, config, overrides)
    command = ["train", config, *overrides, f"trainer.default_local_dir={tmp_path / 'two'}"]
    code, out = finish(launch(tmp_path, ["--max-restarts", "1"], command,
                              sigterm_during_rollout_of_step_2(tmp_path / "signalled")))
    (tmp_path / "launcher.log").write_text(out)
    out = "\n".join(line for line in out.splitlines() if "spmd_partitioner" not in line)  # XLA's warnings
    assert code == 0, out[-5000:]
    stops = {int(p): int(s) for p, s in re.findall(r"\[(\d)\] rljax: preempted at step (\d+) \(SIGTERM\)", out)}
    assert set(stops) == {0, 1} and stops[0] == stops[1], out[-5000:]  # both processes, one step
    step = stops[0]
    assert 2 <= step < TOTAL_STEPS, out[-5000:]
    assert "exit statuses [75, 75]" in out and "restart 1 of 1" in out, out[-5000:]
    assert "[0] resumed from" in out and f"checkpoints/{step}" in out
    assert finalized_steps(os.path.join(run2, "checkpoints")) == [step, TOTAL_STEPS]
    train_rl(cfg1)  # the uninterrupted one-process run (after the others: no contention for the cores)
    assert_metrics_agree(metrics(run1), metrics(run2), COMPARED + ("critic/values/mean", "critic/vf_loss"))
    assert_checkpoints_agree(cfg1, run2, TOTAL_STEPS)
