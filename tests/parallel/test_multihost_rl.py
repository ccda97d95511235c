"""RL on 2 processes x 4 CPU devices (jax.distributed over gloo) equals RL on 1 process x 8
devices: the same config with 4 rollout replicas of 2 devices (2 per process, none
spanning processes), fsdp training over all 8 devices. Every process reads the whole
prompt batch, runs its replicas' rollouts, and gathers the rest; the sampled tokens (seen
through the rewards and lengths), losses and checkpoints must agree.

Two runs:
- GRPO with agent rollouts (calculator tool calls; each episode on one replica);
- PPO with a critic, validation, and prompts whose lengths differ sharply between the two
  processes' replicas (short on the first, long on the second), so their schedulers run
  different step counts and shapes and must still not deadlock. Process 1 is SIGKILLed
  after saving step 1: every process stops; the relaunched run resumes and ends equal to
  the uninterrupted one-process run. Then `rljax eval` of its checkpoint on 2 processes
  reports the one-process run's final validation.

Test hooks reach the subprocesses through a `sitecustomize` module on PYTHONPATH (the
code under test has no test switches)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
import yaml

from rljax.checkpoint import Checkpointer, abstract_like
from rljax.config import load_config
from rljax.data.synthetic_spec import materialize
import rljax.rl.generation as generation
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer, train_rl
from tests.tiny_models import tiny_qwen2_hf

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS_YAML = os.path.join(ROOT, "configs", "tools", "calculator.yaml")

DIGIT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''

COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/ppo_kl",
            "actor/grad_norm", "actor/loss")


def scripted_make_sampler(make_sampler):
    """`make_sampler` whose samplers script every episode's first turn (a calculator call),
    as in tests/rl/test_agent_rl.py; later turns are sampled by the model."""
    def scripted(cfg, decoder):
        from rljax.data.tokenizer import build_char_tokenizer
        from tests.rl.test_agent_rl import FirstTurnScripted
        return FirstTurnScripted(make_sampler(cfg, decoder), build_char_tokenizer())
    return scripted


SCRIPTED_AGENT_HOOK = textwrap.dedent("""
    import rljax.rl.generation as generation
    from tests.parallel.test_multihost_rl import scripted_make_sampler
    generation.make_sampler = scripted_make_sampler(generation.make_sampler)
""")

# process 1 dies (SIGKILL: no cleanup) once the step-1 checkpoint is complete on disk
KILL_PROCESS_1_AFTER_SAVE_1 = textwrap.dedent("""
    import os, signal, time
    if os.environ.get("RLJAX_PROCESS_ID") == "1":
        from rljax.checkpoint import Checkpointer, finalized_steps
        real_save = Checkpointer.save
        def save(self, step, *args, **kwargs):
            real_save(self, step, *args, **kwargs)
            self.wait()
            if step == 1:
                deadline = time.time() + 120
                while 1 not in finalized_steps(self.directory) and time.time() < deadline:
                    time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)
        Checkpointer.save = save
""")


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


def write_config(tmp_path, model: dict) -> str:
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(model))
    return str(path)


COMMON = ["trainer.logger=[jsonl]", "trainer.async_save=false", "data.bucket_size=16",
          "rollout.tensor_parallel_size=2", "actor.optim.lr=1e-2", "mesh.data=1", "mesh.fsdp=8", "mesh.tensor=1"]


# the processes reuse what this one compiled, as this one does (tests/conftest.py)
SHARE_PROGRAMS_HOOK = textwrap.dedent("""
    import tests.conftest
    tests.conftest._share_programs_across_devices()
""")


def launch(tmp_path, command: list[str], hook: str = "") -> subprocess.Popen:
    """`launch/local_multiprocess.py -n 2 --devices-per-process 4 -- COMMAND`, with `hook`
    in every process's sitecustomize."""
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
    hook_dir = tmp_path / f"hook{len(list(tmp_path.glob('hook*')))}"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SHARE_PROGRAMS_HOOK + hook)
    env["PYTHONPATH"] = os.pathsep.join([str(hook_dir), ROOT, env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "local_multiprocess.py"), "-n", "2",
         "--devices-per-process", "4", "--timeout", "600", "--", *command],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=700)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_metrics_agree(m1: list[dict], m2: list[dict], compared) -> None:
    assert [m["step"] for m in m2] == [m["step"] for m in m1]
    seen = set()
    for a, b in zip(m1, m2):
        assert set(a) - {"timing_s/testing"} == set(b) - {"timing_s/testing"}
        for key in compared:
            if key in a:
                seen.add(key)
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=f"step {a['step']} {key}")
    assert seen == set(compared)


def assert_checkpoints_agree(cfg1, run2: str, step: int) -> None:
    """The checkpoint both processes wrote at `step` equals the one-process run's, within
    1e-4: a hundredth of one AdamW step at these tests' learning rate of 1e-2 (a lost,
    repeated or misordered step moves parameters by about the learning rate). The two
    layouts reduce gradients in different orders, and AdamW's update m / sqrt(v) does not
    shrink with the gradient, so a parameter whose gradients are near zero takes that
    rounding noise into its update: 1.4e-5 on one element after 4 PPO steps, on an AMD
    EPYC CPU. The metrics of every step (`assert_metrics_agree`) stay within 1e-5."""
    with jax.set_mesh(jax.make_mesh((1, 8, 1), ("data", "fsdp", "tensor"),
                                    axis_types=(jax.sharding.AxisType.Auto,) * 3)):
        trainer = RLTrainer(cfg1)  # resumes run 1's last checkpoint: the target layout
        try:
            abstract = {"actor": abstract_like(trainer.actor.state)}
            ref = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
            if trainer.critic is not None:
                abstract["critic"] = abstract_like(trainer.critic.state)
                ref += [np.asarray(x) for x in jax.tree.leaves(trainer.critic.state.params)]
        finally:
            trainer.close()
    state, _, _ = Checkpointer(os.path.join(run2, "checkpoints"), async_save=False).restore(step, abstract)
    restored = jax.tree.leaves(state["actor"].params) + (
        jax.tree.leaves(state["critic"].params) if "critic" in state else [])
    assert len(restored) == len(ref)
    for a, b in zip(restored, ref):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-4)


def configs(tmp_path, config: str, overrides: list[str]):
    cfgs = [load_config(RLConfig, config, [*overrides, f"trainer.default_local_dir={tmp_path / name}"])
            for name in ("one", "two")]
    run1, run2 = (str(tmp_path / name / c.trainer.experiment_name) for name, c in zip(("one", "two"), cfgs))
    materialize(cfgs[1].data.train_files, os.path.join(run2, "data"), "train")  # not raced by the two processes
    return cfgs, run1, run2


def test_two_processes_run_agent_grpo_like_one(tmp_path, monkeypatch):
    config = write_config(tmp_path, {
        "model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)},
        "agent": {"tool_config_path": TOOLS_YAML, "max_turns": 3, "max_tokens_per_turn": 96, "min_turn_tokens": 8}})
    overrides = [*COMMON, "trainer.algorithm=grpo", "trainer.total_steps=1", "trainer.save_freq=1",
                 'data.train_files=["synthetic:tool_arithmetic/rl?n=64&seed=0"]', "data.train_batch_size=4",
                 "data.max_prompt_length=240", "rollout.n=2", "rollout.response_length=128",
                 "rollout.max_num_seqs=8", "rollout.num_pages=128", "rollout.page_size=16",
                 "actor.ppo_mini_batch_size=4", "reward.mode=inline"]
    (cfg1, _), run1, run2 = configs(tmp_path, config, overrides)
    start = time.time()
    proc = launch(tmp_path, ["train", config, *overrides, f"trainer.default_local_dir={tmp_path / 'two'}"],
                  hook=SCRIPTED_AGENT_HOOK)
    try:
        monkeypatch.setattr(generation, "make_sampler", scripted_make_sampler(generation.make_sampler))
        train_rl(cfg1)
    finally:
        code, out = finish(proc)
    print(f"two-process run: {time.time() - start:.1f}s wall")
    assert code == 0, out[-5000:]
    m1, m2 = metrics(run1), metrics(run2)
    assert [m["step"] for m in m1] == [1]
    assert m1[0]["agent/tool_use_rate"] == 1.0  # every episode called the calculator
    assert_metrics_agree(m1, m2, COMPARED + ("agent/tool_use_rate", "agent/num_turns/mean"))
    assert_checkpoints_agree(cfg1, run2, 1)


def test_two_processes_ppo_killed_resumed_and_evaluated_like_one(tmp_path):
    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    overrides = [
        *COMMON, "trainer.algorithm=ppo", "algorithm.adv_estimator=gae", "trainer.total_steps=2",
        "trainer.save_freq=1", "trainer.test_freq=0", f"data.train_files=[{ragged_rows(tmp_path / 'train.jsonl', 64)}]",
        f"data.val_files=[{ragged_rows(tmp_path / 'val.jsonl', 8)}]", "data.train_batch_size=8",
        "data.max_prompt_length=64", "rollout.n=2", "rollout.response_length=8", "rollout.max_num_seqs=16",
        "rollout.num_pages=128", "rollout.page_size=8", "rollout.val_kwargs.n=2", "rollout.val_kwargs.temperature=1.0",
        "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "critic.optim.lr=1e-2",
        f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.mode=inline"]
    (cfg1, cfg2), run1, run2 = configs(tmp_path, config, overrides)
    train_command = ["train", config, *overrides, f"trainer.default_local_dir={tmp_path / 'two'}"]

    killed = launch(tmp_path, train_command, hook=KILL_PROCESS_1_AFTER_SAVE_1)
    try:
        train_rl(cfg1)  # the uninterrupted one-process run, meanwhile
    finally:
        code, out = finish(killed)
    assert code == 256 - 9, out[-3000:]  # process 1's SIGKILL ended the run (the launcher's status) ...
    assert Checkpointer(os.path.join(run2, "checkpoints")).latest_step() == 1  # ... after its step-1 save
    assert [m["step"] for m in metrics(run2)][:2] == [0, 1]

    code, out = finish(launch(tmp_path, train_command))  # relaunched: resumes step 1, runs step 2
    assert code == 0, out[-5000:]
    assert "resumed from" in out
    compared = COMPARED + ("critic/values/mean", "critic/vf_loss", "val-core/ragged/reward/mean@2",
                           "val-aux/ragged/reference/nll")
    assert_metrics_agree(metrics(run1), metrics(run2), compared)  # validation at steps 0 and 2, logged once each
    assert_checkpoints_agree(cfg1, run2, 2)

    # `rljax eval` of the checkpoint on 2 processes reports the one-process run's final
    # validation (validation sampling keys do not depend on the step)
    code, out = finish(launch(tmp_path, ["eval", os.path.join(run2, "config.yaml"), "--checkpoint", run2,
                                         "--out", str(tmp_path / "eval.json"), "--work-dir", str(tmp_path / "eval")]))
    assert code == 0, out[-5000:]
    evaluated, final = json.loads((tmp_path / "eval.json").read_text()), metrics(run1)[-1]
    assert "val-core/ragged/reward/mean@2" in evaluated and "val-aux/ragged/reference/nll" in evaluated
    for key, value in evaluated.items():
        np.testing.assert_allclose(value, final[key], rtol=1e-5, atol=1e-6, err_msg=key)


def recording_verdicts(path: str, settle):
    """`settle` that also appends each settled rollout's verifier outputs (a JSON list per
    rollout) to `path`."""
    def recording(rollout, *args, **kwargs):
        out = settle(rollout, *args, **kwargs)
        with open(path, "a") as f:
            f.write(json.dumps([r.get("verifier_output") for r in out.records]) + "\n")
        return out

    return recording


def test_two_processes_score_with_a_reward_model_and_a_verifier_like_one(tmp_path, monkeypatch):
    """A reward model and the policy as a generative verifier (both added to the rule's
    score) on 2 processes: each process's replicas score their samples with the rule, then
    every process scores the gathered batch with the reward model over the 8-device
    training mesh, and the verifier grades it on the replicas (its prompts cut over the 4
    replicas of both processes, the verdicts gathered); the verdicts, rewards, losses and
    checkpoint equal the one-process run's, at each of two steps."""
    from rljax.data.tokenizer import build_char_tokenizer
    from rljax.models import save_hf
    from tests.rl.test_model_rewards import random_rm

    (tmp_path / "reward.py").write_text(DIGIT_REWARD)
    rm_path = tmp_path / "rm"
    save_hf(random_rm(tied=True), str(rm_path), tokenizer=build_char_tokenizer())
    config = write_config(tmp_path, {"model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf(num_key_value_heads=2)}})
    overrides = [
        *COMMON, "trainer.algorithm=grpo", "trainer.total_steps=2", "trainer.save_freq=2", "trainer.test_freq=0",
        f"data.train_files=[{ragged_rows(tmp_path / 'train.jsonl', 32)}]", "data.train_batch_size=8",
        "data.max_prompt_length=64", "rollout.n=2", "rollout.response_length=8", "rollout.max_num_seqs=16",
        "rollout.num_pages=128", "rollout.page_size=8", "actor.ppo_mini_batch_size=8",
        f"reward.custom_reward_function.path={tmp_path / 'reward.py'}", "reward.mode=inline",
        "reward.reward_model.enable=true", f"reward.reward_model.path={rm_path}", "reward.reward_model.batch_size=8",
        "reward.reward_model.combine=add", "reward.reward_model.weight=0.5", "reward.verifier.enable=true",
        "reward.verifier.prompt_template='Q:{question} A:{answer} ok?'", "reward.verifier.max_tokens=4",
        "reward.verifier.max_model_len=128", "reward.verifier.max_num_seqs=8", "reward.verifier.num_pages=64",
        "reward.verifier.combine=add", "reward.verifier.weight=2.0",
        "model.hf_config.initializer_range=0.5"]  # a policy whose greedy verdicts differ
    (cfg1, _), run1, run2 = configs(tmp_path, config, overrides)
    verdicts1, verdicts2 = tmp_path / "verdicts1.jsonl", tmp_path / "verdicts2.jsonl"
    hook = textwrap.dedent(f"""
        import os
        if os.environ.get("RLJAX_PROCESS_ID") == "0":
            import rljax.rl.generation as generation
            from tests.parallel.test_multihost_rl import recording_verdicts
            generation.settle = recording_verdicts({str(verdicts2)!r}, generation.settle)
    """)
    proc = launch(tmp_path, ["train", config, *overrides, f"trainer.default_local_dir={tmp_path / 'two'}"], hook=hook)
    try:
        monkeypatch.setattr(generation, "settle", recording_verdicts(str(verdicts1), generation.settle))
        train_rl(cfg1)
    finally:
        code, out = finish(proc)
    assert code == 0, out[-5000:]
    m1, m2 = metrics(run1), metrics(run2)
    assert [m["step"] for m in m1] == [1, 2]
    assert all(np.ptp([m["reward_model/score/max"], m["reward_model/score/min"]]) > 0 for m in m1)
    assert_metrics_agree(m1, m2, COMPARED + ("reward_model/score/mean", "reward_model/score/max",
                                             "reward_model/score/min", "verifier/score/mean",
                                             "verifier/parse_failures"))
    v1, v2 = ([json.loads(line) for line in path.read_text().splitlines()] for path in (verdicts1, verdicts2))
    assert len(v1) == 2 and v1 == v2 and len(set(v1[0] + v1[1])) > 2  # 16 verdicts a step, not all alike
    assert_checkpoints_agree(cfg1, run2, 2)
