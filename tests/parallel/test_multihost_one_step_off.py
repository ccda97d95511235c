"""`trainer.mode: one_step_off` on 2 processes x 4 CPU devices (jax.distributed over gloo)
equals it on 1 process x 8 devices: each process gives 2 devices to the trainer's mesh
(fsdp 4 over both processes) and 2 to rollout replicas of 1 device (4 replicas in both
runs), so the weights cross between disjoint multi-process device sets
(`rljax.rollout.cross_transfer.UnionTransfer`) and the replicas' results are gathered on
the main thread while the trainer trains.

- Equality: the same sampled tokens and policy versions per step, the sampler's log-probs
  and the losses to float tolerance, the same checkpoint; process 1 is SIGKILLed after the
  step-1 save, the relaunched run resumes from it (its pending batch, sampled by version
  1, is the next one trained) and ends like the uninterrupted one-process run.
- No hang: a stalled sampler, a slow reward, and a failing replica, each on process 1
  only, end the run on both processes with one clear error within `async.timeout_s` of
  the wait that meets it.

Test hooks reach the subprocesses through `sitecustomize` (tests/parallel/test_multihost_rl.py)."""

import json
import os
import textwrap

import jax
import numpy as np
import pytest

from rljax.checkpoint import Checkpointer, abstract_like
from rljax.config import load_config, save_config
from rljax.parallel import make_mesh
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer, train_rl, trainer_devices
from tests.parallel.helpers import run_two_processes
from tests.parallel.test_multihost_rl import (DIGIT_REWARD, KILL_PROCESS_1_AFTER_SAVE_1, configs, finish, launch,
                                              metrics, write_config)
from tests.rl.test_one_step_off import VOLATILE
from tests.tiny_models import tiny_qwen2_hf

pytestmark = pytest.mark.slow

ONE_STEP_OFF = ["trainer.mode=one_step_off", "async.rollout_devices=0", "rollout.tensor_parallel_size=1",
                "mesh.data=1", "mesh.fsdp=4", "mesh.tensor=1"]
# the stream: the replicas of both processes exchange what they finished at every segment boundary
ASYNC = ["trainer.mode=async", *ONE_STEP_OFF[1:], "async.max_staleness=2", "async.segment_steps=2"]


def overrides(tmp_path, *extra, mode=ONE_STEP_OFF):
    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    return ["trainer.logger=[jsonl]", "trainer.async_save=false", "data.bucket_size=16", "actor.optim.lr=1e-2",
            "trainer.algorithm=grpo", 'data.train_files=["synthetic:arithmetic/rl?n=512&seed=0&digits=1"]',
            "data.train_batch_size=4", "data.max_prompt_length=32", "rollout.n=4", "rollout.response_length=8",
            "rollout.max_num_seqs=16", "rollout.num_pages=128", "rollout.page_size=8", "actor.ppo_mini_batch_size=4",
            f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.mode=inline", *mode,
            *extra]


def recording(make_batch):
    """`RLTrainer.make_batch` that first appends the step's samples (token ids, the
    sampler's log-probs, policy versions) to `samples.<process>.jsonl` in the run folder."""
    def spy(self, rollout, timer):
        with open(os.path.join(self.run.directory, f"samples.{jax.process_index()}.jsonl"), "a") as f:
            f.write(json.dumps({
                "step": self.step_count + 1,
                "tokens": [[list(map(int, s.prompt_ids)), list(map(int, s.response_ids))] for s in rollout.samples],
                "log_probs": [[float(x) for x in s.response_log_probs] for s in rollout.samples],
                "versions": [s.policy_version for s in rollout.samples]}) + "\n")
        return make_batch(self, rollout, timer)
    return spy


RECORD_HOOK = textwrap.dedent("""
    import rljax.rl.trainer as trainer_module
    from tests.parallel.test_multihost_one_step_off import recording
    trainer_module.RLTrainer.make_batch = recording(trainer_module.RLTrainer.make_batch)
""")


def read_samples(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def samples_log_prob_diff(one: list[dict], runs: list[dict], process: int) -> float:
    """The 1 x 8 run's step records `one` against the last record of each step in `runs`
    (a resumed run redoes the steps after its checkpoint): the same tokens and versions at
    every step; -> the sampler log-probs' largest |difference|."""
    last = {r["step"]: r for r in runs}
    assert sorted(last) == [r["step"] for r in one], process
    diff = 0.0
    for a in one:
        b = last[a["step"]]
        assert b["tokens"] == a["tokens"] and b["versions"] == a["versions"], (process, a["step"])
        for x, y in zip(a["log_probs"], b["log_probs"]):
            diff = max(diff, float(np.max(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0)))
    return diff


def assert_final_weights_match(cfg1, run2: str, step: int) -> None:
    """The actor weights of `run2`'s checkpoint `step` equal those of the 1 x 8 run of `cfg1` (its last checkpoint)."""
    with jax.set_mesh(make_mesh(cfg1.mesh, trainer_devices(cfg1))):
        trainer = RLTrainer(cfg1)  # resumes run 1's last checkpoint: the reference weights and their layout
        try:
            abstract = {"actor": abstract_like(trainer.actor.state)}
            reference = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
        finally:
            trainer.close()
    state, _, _ = Checkpointer(os.path.join(run2, "checkpoints"), async_save=False).restore(step, abstract)
    restored = jax.tree.leaves(state["actor"].params)
    assert len(restored) == len(reference)
    for a, b in zip(restored, reference):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_two_processes_like_one_killed_and_resumed(tmp_path, monkeypatch, mode):
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    args = overrides(tmp_path, "trainer.total_steps=3", "trainer.save_freq=1",
                     mode=ONE_STEP_OFF if mode == "one_step_off" else ASYNC)
    (cfg1, _), run1, run2 = configs(tmp_path, config, args)
    train_command = ["train", config, *args, f"trainer.default_local_dir={tmp_path / 'two'}"]

    killed = launch(tmp_path, train_command, hook=RECORD_HOOK + KILL_PROCESS_1_AFTER_SAVE_1)
    try:  # the uninterrupted one-process run (4 trainer + 4 rollout devices), meanwhile
        monkeypatch.setattr(RLTrainer, "make_batch", recording(RLTrainer.make_batch))
        train_rl(cfg1)
    finally:
        code, out = finish(killed)
    assert code == 256 - 9, out[-3000:]  # process 1's SIGKILL after its step-1 save ended the run
    assert Checkpointer(os.path.join(run2, "checkpoints")).latest_step() == 1
    code, out = finish(launch(tmp_path, train_command, hook=RECORD_HOOK))  # resumes step 1, runs steps 2, 3
    assert code == 0, out[-5000:]
    assert "resumed from" in out

    one = read_samples(os.path.join(run1, "samples.0.jsonl"))
    assert [r["step"] for r in one] == [1, 2, 3]
    if mode == "one_step_off":
        assert [sorted(set(r["versions"])) for r in one] == [[0], [0], [1]]  # step k trains what v_(k-1) sampled
    for p in (0, 1):
        runs = read_samples(os.path.join(run2, f"samples.{p}.jsonl"))
        # the killed run trained step 1 (then saved, with step 2's batch pending; async: a process may have trained
        # step 2 too before the kill reached it); the resumed run trains steps 2 and 3: keep each step's last record
        if mode == "one_step_off":
            assert [r["step"] for r in runs] == [1, 2, 3], p
        diff = samples_log_prob_diff(one, runs, p)
        print(f"process {p}: same tokens and versions at steps 1-3; sampler log-probs max |diff| {diff:.3g}")
        assert diff < 1e-5

    m1, m2 = metrics(run1), metrics(run2)
    assert [m["step"] for m in m2] == [m["step"] for m in m1] == [1, 2, 3]
    for a, b in zip(m1, m2):  # a resumed step has no generation time or hand-off of its restored batch
        assert {k for k in a if not k.startswith(VOLATILE)} == {k for k in b if not k.startswith(VOLATILE)}
    compared = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
                "actor/grad_norm", "actor/loss", "actor/pg_clipfrac", "training/rollout_probs_diff_max",
                "async/staleness/max", "async/staleness/mean")
    for key in compared:
        diff = max(abs(b[key] - a[key]) for a, b in zip(m1, m2))
        print(f"{key}: 1 x 8 {[a[key] for a in m1]}; 2 x 4 max |diff| {diff:.3g}")
        for a, b in zip(m1, m2):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {key}")
    print("timing_s/update_weights, 2 x 4 (union transfer + reshard):", [m.get("timing_s/update_weights") for m in m2],
          "1 x 8:", [m.get("timing_s/update_weights") for m in m1])
    if mode == "one_step_off":
        assert [m["async/staleness/max"] for m in m2] == [0.0, 1.0, 1.0]
    else:
        assert max(m["async/staleness/max"] for m in m2) <= 2

    assert_final_weights_match(cfg1, run2, 3)


# ---- no hang ---------------------------------------------------------------------------------------------------

TIMEOUT_S = 15.0  # async.timeout_s once every program compiled (the first rollout compiles: 25-30 s here)

SLOW_REWARD = """
import os, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if os.environ.get("RLJAX_PROCESS_ID") == "1" and os.path.exists({flag!r}):
        time.sleep(5.0)
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""

# each process: the run with the fault armed from step 2's rollout on (after every program compiled), on
# process 1 only, and async.timeout_s lowered to TIMEOUT_S then (the config's 600 s covers the compiling
# steps); -> its error and the seconds from the start of the wait that raised it to the run's close
NO_HANG_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from rljax.distributed import initialize
    initialize()
    import jax
    import rljax.rl.generation as generation
    from rljax.config import load_config
    from rljax.rl.config import RLConfig

    CASE, CONFIG, FLAG = {case!r}, {config!r}, {flag!r}
    armed = []
    make_sampler = generation.make_sampler

    def faulty_make_sampler(cfg, decoder):
        sampler = make_sampler(cfg, decoder)
        first = not hasattr(faulty_make_sampler, "made")
        faulty_make_sampler.made = True
        generate = sampler.generate
        def faulty_generate(*args, **kwargs):
            if armed and first and jax.process_index() == 1:
                if CASE == "stalled_sampler":
                    time.sleep(600)
                if CASE == "failed_replica":
                    raise RuntimeError("the sampler of this replica died")
            return generate(*args, **kwargs)
        sampler.generate = faulty_generate
        return sampler

    generation.make_sampler = faulty_make_sampler
    from rljax.rl.trainer import RLTrainer
    trainer = RLTrainer(load_config(RLConfig, CONFIG))
    submit, collect, close = trainer.producer.submit, trainer.producer.collect, trainer.close
    waits, closes = [], []
    def arming_submit(*args):
        if trainer.step_count == 1:  # step 1 submits step 2's prompts
            armed.append(True)
            trainer.producer.timeout_s = {timeout_s}
            if CASE == "slow_reward":
                open(FLAG, "w").close()
        return submit(*args)
    def timed_collect():
        waits.append(time.monotonic())
        return collect()
    def timed_close(error=None):
        closes.append(time.monotonic())
        return close(error)
    trainer.producer.submit, trainer.producer.collect, trainer.close = arming_submit, timed_collect, timed_close
    try:
        trainer.fit()
        result = {{"error": None}}
    except Exception as e:
        result = {{"error": f"{{type(e).__name__}}: {{e}}", "seconds": closes[0] - waits[-1],
                   "step": trainer.step_count}}
    print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()  # both processes leave together (the first one out would take the other down)
    os._exit(0)  # a stalled replica's thread would hold the interpreter's exit
""")


@pytest.mark.parametrize("case", ["stalled_sampler", "slow_reward", "failed_replica"])
def test_a_fault_on_one_process_is_a_clear_error_on_every_process_within_the_timeout(tmp_path, case):
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    args = overrides(tmp_path, "trainer.total_steps=4", "async.timeout_s=600", "reward.timeout_s=60",
                     f"trainer.default_local_dir={tmp_path / 'run'}")
    if case == "slow_reward":  # scored in worker processes, in the background
        args.append("reward.mode=process")
    flag = str(tmp_path / "slow_reward.flag")
    cfg = load_config(RLConfig, config, args)
    (tmp_path / "reward.py").write_text(SLOW_REWARD.format(flag=flag))
    save_config(cfg, str(tmp_path / "run.yaml"))
    outs = run_two_processes(NO_HANG_WORKER.format(case=case, config=str(tmp_path / "run.yaml"), flag=flag,
                                                   timeout_s=TIMEOUT_S),
                             timeout=600)
    print(case, outs)
    for p, out in enumerate(outs):
        assert out["error"] is not None and out["step"] == 2, (p, out)  # step 2's batch never arrived
        assert out["seconds"] < TIMEOUT_S + 10, (p, out)
        assert "\n" not in out["error"]
    if case == "failed_replica":  # both processes name the replica and its error at once
        for out in outs:
            assert out["error"] == ("RuntimeError: rollout replica 2 failed: RuntimeError: the sampler of this "
                                    "replica died"), out
            assert out["seconds"] < TIMEOUT_S / 2
    else:  # process 1 waited for its own rollout; process 0 for process 1 at the gather
        assert outs[1]["error"].startswith("RolloutTimeout: the rollout of the batch sampled by policy version 1 "
                                           f"is not done after async.timeout_s={TIMEOUT_S:g} s"), outs[1]
        assert outs[0]["error"].startswith("ProcessesTimeout: process 0: process(es) [1] did not reach the gather "
                                           "of rollout results"), outs[0]
        for out in outs:
            assert out["seconds"] > TIMEOUT_S - 1, out
