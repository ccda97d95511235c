"""`trainer.mode: one_step_off` end to end on a tiny model: the rollout replica samples on
its own device while the trainer trains on four others. GRPO still learns; every batch
is sampled by the version its samples state (their rollout log-probs are that version's
log-probs, not the trainer's current ones); a run killed with SIGKILL at several points
and resumed trains exactly the batches of an uninterrupted run (none lost, none twice)
and ends with the same weights and metrics."""

import hashlib
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
from rljax.hostsync import fetch, shard_global_batch
from rljax.rl.trainer import RLTrainer

from .test_rl_train import make_config

pytestmark = pytest.mark.slow

ONE_STEP_OFF = ("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1", "async.rollout_devices=4",
                "rollout.data_parallel_size=1")


def record_trained(trainer, path):
    """Append, per trained batch, the step it trains and a fingerprint of every sample
    (prompt + response tokens, rollout log-probs) to the JSONL file `path`."""
    make_batch = trainer.make_batch

    def spy(rollout, timer):
        samples = [hashlib.sha1(json.dumps([list(map(int, s.prompt_ids)), list(map(int, s.response_ids)),
                                            [float(x) for x in s.response_log_probs]]).encode()).hexdigest()
                   for s in rollout.samples]
        with open(path, "a") as f:
            f.write(json.dumps({"step": trainer.step_count + 1, "samples": samples,
                                "versions": sorted({s.policy_version for s in rollout.samples})}) + "\n")
        return make_batch(rollout, timer)

    trainer.make_batch = spy


def log_probs_under(trainer, batch, params) -> np.ndarray:
    """The batch's log-probs under `params` (the trainer's forward)."""
    ids, mask = shard_global_batch({"i": batch.input_ids, "m": batch.attention_mask}, trainer.mesh).values()
    return fetch(trainer.forwards.log_probs(params, ids, mask))


def test_one_step_off_learns_and_samples_with_the_version_it_states(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=12", "actor.optim.lr=1e-2", "actor.optim.weight_decay=0.0",
                      "algorithm.adv_estimator=grpo", *ONE_STEP_OFF)
    trainer = RLTrainer(cfg)
    assert {d.id for d in trainer.mesh.devices.flat}.isdisjoint(
        {d.id for d in trainer.generation.replicas.layout.mesh.devices.flat})
    params_of, checked, expected_kl = {}, [], {}
    make_batch = trainer.make_batch

    def spy(rollout, timer):
        k = trainer.step_count
        params_of[k] = jax.tree.map(jnp.copy, trainer.actor.params)  # version k (the update donates its buffers)
        batch, metrics = make_batch(rollout, timer)
        versions = {s.policy_version for s in rollout.samples}
        assert versions == {max(k - 1, 0)}, (k, versions)
        if k >= 2:  # the stated version's log-probs are the sampler's; the trainer's current ones are not
            (v,) = versions
            m = batch.response_mask > 0
            stated, current = (log_probs_under(trainer, batch, params_of[u]) for u in (v, k))
            checked.append((float(np.abs(stated - batch.rollout_log_probs)[m].max()),
                            float(np.abs(current - batch.rollout_log_probs)[m].max())))
            # KL(behaviour || proximal), k3 by hand over the response tokens: r = pi_current / pi_sampler
            log_r = (current - batch.rollout_log_probs)[m].astype(np.float64)
            expected_kl[k + 1] = float(np.mean(np.exp(log_r) - log_r - 1.0))
        return batch, metrics

    trainer.make_batch = spy
    history = trainer.fit()
    scores = [h["critic/score/mean"] for h in history]
    print("one_step_off digit-fraction reward per step:", np.round(scores, 3))
    print("|stated - sampler|, |current - sampler| log-prob max:", checked)
    assert np.mean(scores[-3:]) > np.mean(scores[:3]) + 0.2, scores
    assert [h["async/staleness/max"] for h in history] == [0.0] + [1.0] * 11
    assert all(stated < 1e-4 and current > 1e-2 for stated, current in checked), checked
    # the default correction takes the sampler's log-probs as the old ones (bypass mode); the off-policy KL
    # comes from the update, whose one mini-batch is measured at the params of the version being trained
    assert trainer.forwards.reuse_rollout_log_probs
    for h in history:
        if h["step"] in expected_kl:
            assert h["async/off_policy_kl"] == pytest.approx(expected_kl[h["step"]], rel=1e-3, abs=1e-6), h["step"]
    assert min(expected_kl.values()) > 0
    for h in history:
        assert 0.0 <= h["async/trainer_idle_fraction"] <= 1.0 and 0.0 <= h["async/sampler_idle_fraction"] <= 1.0
        assert "timing_s/wait_rollout" in h and "timing_s/update_weights" in h and "timing_s/gen" in h


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.trainer import RLTrainer
    from rljax.tracking import Tracker
    from tests.rl.test_one_step_off import record_trained

    where, at, record = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    trainer = RLTrainer(load_config(RLConfig, sys.argv[4]))
    record_trained(trainer, record)
    if where == "log":  # after step `at` is logged, before its checkpoint
        real_log = Tracker.log
        def log(self, step, metrics):
            real_log(self, step, metrics)
            if step == at:
                os.kill(os.getpid(), signal.SIGKILL)
        Tracker.log = log
    else:  # inside step `at`'s actor update, the next batch's rollout in flight
        update = trainer.actor.update
        def killing_update(*args, **kwargs):
            if trainer.step_count + 1 == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return update(*args, **kwargs)
        trainer.actor.update = killing_update
    trainer.fit()
""")

VOLATILE = ("timing_s/", "perf/", "async/trainer_idle", "async/sampler_idle", "memory/")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_sigkill_anywhere_then_resume_trains_each_batch_exactly_once(tmp_path):
    def config(name):
        cfg = make_config(tmp_path / name, "trainer.total_steps=4", "trainer.save_freq=1", "actor.optim.lr=1e-2",
                          *ONE_STEP_OFF)
        return cfg

    (tmp_path / "straight").mkdir()
    straight = RLTrainer(config("straight"))
    record_trained(straight, tmp_path / "straight.jsonl")
    expected = straight.fit()
    trained = read_jsonl(tmp_path / "straight.jsonl")
    assert [t["step"] for t in trained] == [1, 2, 3, 4]
    assert [t["versions"] for t in trained] == [[0], [0], [1], [2]]

    for where, at, checkpoint in (("update", 2, 1), ("log", 3, 2)):
        name = f"killed_{where}_{at}"
        (tmp_path / name).mkdir()
        cfg = config(name)
        save_config(cfg, str(tmp_path / f"{name}.yaml"))
        record = tmp_path / f"{name}.jsonl"
        killed = subprocess.run([sys.executable, "-c", KILLED_RUN, where, str(at), str(record),
                                 str(tmp_path / f"{name}.yaml")],
                                capture_output=True, text=True, timeout=900, cwd=os.getcwd())
        assert killed.returncode == -9, killed.stderr[-3000:]
        resumed = RLTrainer(cfg)
        assert resumed.step_count == checkpoint and resumed.producer.pending  # the saved, untrained batch
        record_trained(resumed, record)
        history = resumed.fit()
        assert [h["step"] for h in history] == list(range(checkpoint + 1, 5))
        runs = read_jsonl(record)
        # the killed run's batches up to its checkpoint, then the resumed run's: the uninterrupted sequence
        kept = [r for r in runs[: len(runs) - len(history)] if r["step"] <= checkpoint] + runs[-len(history):]
        assert kept == trained, (where, at)
        for h, e in zip(history, expected[checkpoint:]):
            assert {k: v for k, v in h.items() if not k.startswith(VOLATILE)} == {
                k: v for k, v in e.items() if not k.startswith(VOLATILE)}
        for x, y in zip(jax.tree.leaves(jax.device_get(straight.actor.state)),
                        jax.tree.leaves(jax.device_get(resumed.actor.state))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

