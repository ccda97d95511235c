"""`trainer.mode: async` end to end on a tiny model: the rollout replica samples a stream of
groups on its own device while the trainer trains on four others.

- `max_staleness: 0` trains exactly what `trainer.mode: sync` trains on the same trainer
  mesh and replica (a sync run on 4 devices, in a subprocess).
- With a larger bound GRPO learns, no group is staler than the bound, samples continue
  across weight updates (partial rollouts), and a sample sampled by one version has that
  version's log-probs.
- A run killed with SIGKILL at several points and resumed trains exactly the samples of
  an uninterrupted run (none lost, none twice) and ends with the same weights.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import save_config
from rljax.rl.trainer import RLTrainer

from .test_one_step_off import VOLATILE, log_probs_under, read_jsonl, record_trained
from .test_rl_train import make_config

pytestmark = pytest.mark.slow

ASYNC = ("trainer.mode=async", "rollout.tensor_parallel_size=1", "async.rollout_devices=4",
         "rollout.data_parallel_size=1", "async.segment_steps=3")


def test_async_learns_within_the_bound_with_partial_rollouts(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=12", "actor.optim.lr=1e-2", "actor.optim.weight_decay=0.0",
                      "algorithm.adv_estimator=grpo", "async.max_staleness=2", *ASYNC)
    trainer = RLTrainer(cfg)
    params_of, checked = {}, []
    make_batch = trainer.make_batch

    def spy(rollout, timer):
        k = trainer.step_count
        params_of[k] = jax.tree.map(jnp.copy, trainer.actor.params)
        batch, metrics = make_batch(rollout, timer)
        versions = sorted({s.policy_version for s in rollout.samples})
        assert all(k - v <= 2 for v in versions), (k, versions)
        if len(versions) == 1 and rollout.metrics["async/partial_rollout_fraction"] == 0 and 0 < k - versions[0]:
            # a batch sampled by one older version: its log-probs are that version's, not the trainer's current
            m = batch.response_mask > 0
            stated, current = (log_probs_under(trainer, batch, params_of[u]) for u in (versions[0], k))
            checked.append((float(np.abs(stated - batch.rollout_log_probs)[m].max()),
                            float(np.abs(current - batch.rollout_log_probs)[m].max())))
        return batch, metrics

    trainer.make_batch = spy
    history = trainer.fit()
    scores = [h["critic/score/mean"] for h in history]
    print("async digit-fraction reward per step:", np.round(scores, 3))
    print("partial rollout fraction:", [h["async/partial_rollout_fraction"] for h in history])
    print("off-policy KL:", [round(h["async/off_policy_kl"], 5) for h in history])
    assert np.mean(scores[-3:]) > np.mean(scores[:3]) + 0.2, scores
    assert max(h["async/staleness/max"] for h in history) <= 2
    assert max(h["async/staleness/max"] for h in history) == 2, "the bound is reached"
    assert sum(h["async/partial_rollout_fraction"] for h in history) > 0
    print("|stated - sampler|, |current - sampler| log-prob max:", checked)
    assert checked and all(stated < 1e-4 and current > 1e-2 for stated, current in checked), checked
    for h in history:
        assert 0.0 <= h["async/trainer_idle_fraction"] <= 1.0 and 0.0 <= h["async/sampler_idle_fraction"] <= 1.0
        assert "timing_s/wait_rollout" in h and "timing_s/update_weights" in h and h["async/off_policy_kl"] >= 0
    assert max(h["async/off_policy_kl"] for h in history) > 0


SYNC_ON_4 = textwrap.dedent("""
    import json, sys
    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.trainer import RLTrainer
    from tests.rl.test_one_step_off import record_trained
    trainer = RLTrainer(load_config(RLConfig, sys.argv[1]))
    record_trained(trainer, sys.argv[2])
    history = trainer.fit()
    json.dump(history, open(sys.argv[3], "w"))
""")


def test_max_staleness_0_trains_what_sync_trains(tmp_path):
    common = ("trainer.total_steps=4", "actor.optim.lr=1e-2", "rollout.tensor_parallel_size=1",
              "rollout.data_parallel_size=1")
    (tmp_path / "sync").mkdir()
    sync_cfg = make_config(tmp_path / "sync", *common)
    save_config(sync_cfg, str(tmp_path / "sync.yaml"))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", SYNC_ON_4, str(tmp_path / "sync.yaml"), str(tmp_path / "sync.jsonl"),
                           str(tmp_path / "sync_history.json")], capture_output=True, text=True, timeout=900,
                          cwd=os.getcwd(), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / "async").mkdir()
    trainer = RLTrainer(make_config(tmp_path / "async", *common, *ASYNC[:1], "async.rollout_devices=4",
                                    "async.max_staleness=0", "async.segment_steps=2",
                                    "algorithm.rollout_correction.bypass_mode=false"))
    record_trained(trainer, tmp_path / "async.jsonl")
    history = trainer.fit()
    assert read_jsonl(tmp_path / "async.jsonl") == read_jsonl(tmp_path / "sync.jsonl")
    with open(tmp_path / "sync_history.json") as f:
        sync_history = json.load(f)
    for a, s in zip(history, sync_history):
        a = {k: v for k, v in a.items() if not k.startswith(VOLATILE) and not k.startswith("async/")}
        s = {k: v for k, v in s.items() if not k.startswith(VOLATILE)}
        assert a == s


KILLED_RUN = textwrap.dedent("""
    import os, random, signal, sys, threading
    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.trainer import RLTrainer
    from rljax.tracking import Tracker
    from tests.rl.test_one_step_off import record_trained

    seed, record = int(sys.argv[1]), sys.argv[2]
    trainer = RLTrainer(load_config(RLConfig, sys.argv[3]))
    record_trained(trainer, record)
    rng = random.Random(seed)
    after = trainer.step_count + rng.randint(1, 2)  # a random moment up to 1.5 s after this step's log
    real_log = Tracker.log
    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == after:
            threading.Timer(rng.uniform(0.0, 1.5), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    Tracker.log = log
    trainer.fit()
""")


def test_sigkill_at_random_moments_then_resume_trains_every_sample_exactly_once(tmp_path):
    def config(name):
        return make_config(tmp_path / name, "trainer.total_steps=6", "trainer.save_freq=1", "actor.optim.lr=1e-2",
                           "async.max_staleness=2", *ASYNC)

    (tmp_path / "straight").mkdir()
    straight = RLTrainer(config("straight"))
    record_trained(straight, tmp_path / "straight.jsonl")
    expected = straight.fit()
    trained = read_jsonl(tmp_path / "straight.jsonl")
    assert [t["step"] for t in trained] == list(range(1, 7))

    (tmp_path / "killed").mkdir()
    cfg = config("killed")
    save_config(cfg, str(tmp_path / "killed.yaml"))
    record = tmp_path / "killed.jsonl"
    kills = 0
    while True:  # kill at a random moment, resume, until a run gets to the end
        done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(kills), str(record),
                               str(tmp_path / "killed.yaml")], capture_output=True, text=True, timeout=900,
                              cwd=os.getcwd())
        if done.returncode == 0:
            break
        assert done.returncode == -9, done.stderr[-3000:]
        kills += 1
        assert kills < 20
    runs = read_jsonl(record)
    last = {}
    for r in runs:  # the resumed runs redo the steps after the checkpoint: keep the last record of each step
        last[r["step"]] = r
    assert [last[s] for s in sorted(last)] == trained, "the same samples, each step"
    print(f"kills: {kills}")
    resumed = RLTrainer(cfg)
    assert resumed.step_count == 6
    for x, y in zip(jax.tree.leaves(jax.device_get(straight.actor.state)),
                    jax.tree.leaves(jax.device_get(resumed.actor.state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    resumed.close()
    assert expected


def test_warmup_sft_runs_on_every_device_under_the_trainers_share(tmp_path):
    import dataclasses

    from rljax.parallel import make_mesh
    from rljax.rl.async_config import run_split
    from rljax.rl.warmup import run_warmup_sft

    cfg = make_config(tmp_path, *ASYNC, "warmup_sft.enable=true", "warmup_sft.steps=2", "warmup_sft.batch_size=8",
                      'warmup_sft.train_files=["synthetic:arithmetic/sft?n=64&seed=0&digits=1"]')
    with jax.set_mesh(make_mesh(cfg.mesh, run_split(cfg).trainer)):  # as train_rl runs it
        warmed = run_warmup_sft(cfg, str(tmp_path))
    assert os.path.exists(os.path.join(warmed.model.path, "config.json")) and not warmed.warmup_sft.enable
    assert dataclasses.replace(warmed, model=cfg.model, warmup_sft=cfg.warmup_sft) == cfg
