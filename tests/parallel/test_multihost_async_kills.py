"""`trainer.mode: async` on 2 processes x 4 CPU devices, SIGKILLed at random moments: each
launch SIGKILLs one process (chosen at random) at a random moment after a random number of
its steps; the launcher then kills the other; the next launch resumes from the last
checkpoint every process finished. Once a launch gets to the end, every step trained the
samples the uninterrupted 1 process x 8 devices run trained (same tokens and policy
versions, the sampler's log-probs to float tolerance) and the final weights agree: no
sample lost, none trained twice.

Test hooks reach the subprocesses through `sitecustomize` (tests/parallel/test_multihost_rl.py)."""

import os
import textwrap

import pytest

from rljax.rl.trainer import RLTrainer, train_rl
from tests.parallel.test_multihost_one_step_off import (ASYNC, RECORD_HOOK, assert_final_weights_match, overrides,
                                                        read_samples, recording, samples_log_prob_diff)
from tests.parallel.test_multihost_rl import configs, finish, launch, write_config
from tests.tiny_models import tiny_qwen2_hf

pytestmark = pytest.mark.slow

STEPS = 4

# one process of the launch, chosen by `seed`, SIGKILLs itself 0-1.5 s after its 1st or 2nd step of this launch
# (leaving the file `marker` first)
KILL_AT_RANDOM = textwrap.dedent("""
    import os, random, signal, threading
    import rljax.rl.trainer as trainer_module
    rng = random.Random({seed})
    victim, after, delay = rng.randint(0, 1), rng.randint(1, 2), rng.uniform(0.0, 1.5)
    def kill():
        open({marker!r}, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("RLJAX_PROCESS_ID") == str(victim):
        real_step = trainer_module.RLTrainer.step
        done = []
        def step(self, *args, **kwargs):
            out = real_step(self, *args, **kwargs)
            done.append(1)
            if len(done) == after:
                threading.Timer(delay, kill).start()
            return out
        trainer_module.RLTrainer.step = step
""")


def test_random_kills_then_resume_train_every_sample_exactly_once(tmp_path, monkeypatch):
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    args = overrides(tmp_path, f"trainer.total_steps={STEPS}", "trainer.save_freq=1", mode=ASYNC)
    (cfg1, _), run1, run2 = configs(tmp_path, config, args)
    command = ["train", config, *args, f"trainer.default_local_dir={tmp_path / 'two'}"]

    def armed(seed):
        return RECORD_HOOK + KILL_AT_RANDOM.format(seed=seed, marker=str(tmp_path / f"killed.{seed}"))

    # the uninterrupted one-process run first: beside a launch it would slow one process enough that gloo's
    # 30 s wait for the other, at a collective over a new device group, runs out on a loaded 2-core machine
    monkeypatch.setattr(RLTrainer, "make_batch", recording(RLTrainer.make_batch))
    train_rl(cfg1)

    def run(seed):
        code, out = finish(launch(tmp_path, command, hook=armed(seed)))
        (tmp_path / f"launch.{seed}.log").write_text(out)
        return code, out

    # a launch that did not end is resumed: one ended by its kill, or one whose gloo connection timed out under
    # this machine's load (gloo waits 30 s for the other process at a new device group) before its kill
    launches, kills, timeouts = 0, 0, 0
    code, out = run(0)
    codes = [code]
    while code != 0:
        killed = (tmp_path / f"killed.{launches}").exists()
        assert killed or "Gloo context initialization failed" in out, out[-3000:]
        kills, timeouts = kills + killed, timeouts + (not killed)
        launches += 1
        assert launches < 12, "no launch got to the end"
        code, out = run(launches)
        codes.append(code)
    print(f"launches killed: {kills}; ended by a gloo timeout: {timeouts}; exit codes {codes}")
    assert kills >= 1

    one = read_samples(os.path.join(run1, "samples.0.jsonl"))
    assert [r["step"] for r in one] == list(range(1, STEPS + 1))
    for p in (0, 1):
        runs = read_samples(os.path.join(run2, f"samples.{p}.jsonl"))
        diff = samples_log_prob_diff(one, runs, p)
        print(f"process {p}: {len(runs)} step records over {launches + 1} launches; the last of each step equals "
              f"1 x 8; sampler log-probs max |diff| {diff:.3g}")
        assert diff < 1e-5

    assert_final_weights_match(cfg1, run2, STEPS)
