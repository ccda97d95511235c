"""The run scaffold (`rljax.runs`): the run-kind rule every command uses
(`rljax.commands.run_kinds`) and the loaders' refusal of a run of the other kind, the
folder a run writes before any training, one owner per run folder (`RunLock`),
resume / save / close, a resume under a changed config (refused, or allowed and
recorded), and the decoder's one log-prob entry point (`Decoder.token_log_probs`)
against the pure chunked math it calls."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from rljax.algos.log_probs import log_probs_from_hidden, token_log_probs
from rljax.checkpoint import abstract_like
from rljax.config import ConfigError, load_config
from rljax.models import ModelConfig, init_model
from rljax.commands.run_kinds import RUN_CONFIGS, checkpoint_kind, run_kind
from rljax.runs import ConfigChangeError, Run, RunLock, RunLockedError, config_changes, saved_config
from rljax.train.run_config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(ROOT, "configs", "sft_tiny.yaml")


@pytest.mark.parametrize("raw,kind", [
    ({"trainer": {"algorithm": "sft"}}, "supervised"),
    ({"trainer": {"algorithm": "dpo"}, "dpo": {"beta": 0.2}}, "supervised"),
    ({"trainer": {"algorithm": "grpo"}}, "rl"),
    ({"trainer": {"algorithm": "ppo"}, "actor": {}, "critic": {}}, "rl"),
    ({"model": {"tokenizer": "char"}}, "supervised"),  # unset, no RL sections: sft
    ({}, "supervised"),
])
def test_run_kind_from_the_algorithm_or_the_sections(raw, kind):
    assert run_kind(raw) == kind
    assert RUN_CONFIGS[kind].__name__ == ("RLConfig" if kind == "rl" else "RunConfig")


def test_run_kind_refuses_an_unset_algorithm_with_rl_sections_and_unknown_names():
    with pytest.raises(ConfigError, match=r"trainer\.algorithm: not set, and x\.yaml has RL sections "
                                          r"\(actor, rollout\); set it to one of .*grpo"):
        run_kind({"rollout": {"n": 4}, "actor": {}, "model": {}}, "x.yaml")
    with pytest.raises(ConfigError, match=r"unknown 'grpoo'; did you mean 'grpo'"):
        run_kind({"trainer": {"algorithm": "grpoo"}})


@pytest.mark.parametrize("algorithm,kind", [("grpo", "rl"), ("dpo", "supervised")])
def test_each_checkpoint_loader_refuses_a_run_of_the_other_kind(tmp_path, algorithm, kind):
    from rljax.rl.config import RLConfig
    from rljax.rl.policy_checkpoint import load_policy
    from rljax.train.export import load_run_config

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"trainer": {"algorithm": algorithm}}))
    assert checkpoint_kind(str(run_dir)) == kind
    if kind == "rl":
        with pytest.raises(ValueError, match=r"trainer\.algorithm=grpo, not a supervised run; an RL run's policy is "
                                             r"exported by rljax\.rl\.policy_checkpoint\.export_policy"):
            load_run_config(str(run_dir))
    else:
        with pytest.raises(ValueError, match=r"a supervised run's checkpoint, with no RL policy in it"):
            load_policy(RLConfig(), str(run_dir), mesh=None)


def _tiny_cfg(tmp_path, *overrides):
    return load_config(RunConfig, SFT, [f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]",
                                        "trainer.async_save=false", "trainer.total_steps=10", "trainer.save_freq=4",
                                        "trainer.test_freq=5", *overrides])


def test_run_writes_its_folder_before_training_and_decides_when_to_save_and_validate(tmp_path):
    run = Run(_tiny_cfg(tmp_path))
    try:
        directory = os.path.join(tmp_path, "sft_tiny")
        assert run.directory == directory
        saved = saved_config(directory)
        assert run_kind(saved) == "supervised"
        # synthetic specs are materialised once, under the run, and the saved config names the files
        for split in ("train_files", "val_files"):
            (path,) = saved["data"][split]
            assert path == getattr(run.config.data, split)[0] and path.startswith(os.path.join(directory, "data"))
            assert os.path.exists(path)
        assert os.path.isdir(os.path.join(directory, "tokenizer"))
        assert [s for s in range(1, 11) if run.save_due(s)] == [4, 8, 10]
        assert [s for s in range(1, 11) if run.validation_due(s)] == [5, 10]
    finally:
        run.close(None, 0)
    no_val = Run(_tiny_cfg(tmp_path, "data.val_files=[]", "trainer.experiment_name=no_val"))
    no_val.close(None, 0)
    assert not any(no_val.validation_due(s) for s in range(1, 11))


class _Data:
    def __init__(self):
        self.state = None

    def set_state(self, state):
        self.state = state


def test_resume_restores_state_data_and_meta_and_close_runs_every_closer(tmp_path):
    state = {"w": jnp.arange(4.0)}
    run = Run(_tiny_cfg(tmp_path))
    assert run.resume(abstract_like(state), _Data()) is None
    run.save(4, state, {"position": 7}, kl_coef=0.5)
    closed = []
    run.on_close(lambda: closed.append("first"))

    def failing():
        raise RuntimeError("worker pool would not stop")

    run.on_close(failing)
    run.on_close(lambda: closed.append("last"))
    with pytest.raises(RuntimeError, match="worker pool"):  # every closer runs; the first failure is raised
        run.close(None, 4)
    assert closed == ["first", "last"]

    again, data = Run(_tiny_cfg(tmp_path)), _Data()
    try:
        found = again.resume(abstract_like(state), data)
        assert found.step == 4 and data.state == {"position": 7}
        assert found.meta["kl_coef"] == 0.5 and found.meta["step"] == 4
        assert found.meta["config"]["trainer"]["experiment_name"] == "sft_tiny"
        np.testing.assert_array_equal(found.state["w"], np.arange(4.0))
    finally:
        again.close(None, 4)
    with open(os.path.join(tmp_path, "sft_tiny", "config.yaml")) as f:
        assert yaml.safe_load(f)["trainer"]["total_steps"] == 10


# ---- one owner per run folder ----------------------------------------------------------------


def test_a_second_owner_of_a_run_folder_fails_at_once_naming_the_first_until_it_closes(tmp_path):
    run = Run(_tiny_cfg(tmp_path))
    try:
        started = time.monotonic()
        with pytest.raises(RunLockedError) as raised:
            Run(_tiny_cfg(tmp_path))
        assert time.monotonic() - started < 5
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith(os.path.join(str(tmp_path), "sft_tiny") + ": the run folder is in use by ")
        assert f"host {socket.gethostname()}, pid {os.getpid()}, since 20" in message
    finally:
        run.close(None, 0)
    Run(_tiny_cfg(tmp_path)).close(None, 0)  # released at a normal close


def test_run_lock_is_per_open_file_and_released_by_release(tmp_path):
    first = RunLock(str(tmp_path))
    with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        RunLock(str(tmp_path))
    first.release()
    RunLock(str(tmp_path)).release()


_HOLD = """
import sys, time
from rljax.config import load_config
from rljax.runs import Run
from rljax.train.run_config import RunConfig
run = Run(load_config(RunConfig, sys.argv[1], sys.argv[2:]))
print("owner", flush=True)
time.sleep(600)
"""


def _env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


@pytest.mark.slow
def test_two_processes_on_one_run_folder_the_second_exits_at_once_and_kill_9_frees_it(tmp_path):
    overrides = [f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.total_steps=2"]
    owner = subprocess.Popen([sys.executable, "-c", _HOLD, SFT, *overrides], cwd=ROOT, env=_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "owner"
        second = subprocess.run([sys.executable, "-m", "rljax.cli", "train", SFT, *overrides], cwd=ROOT,
                                env=_env(), capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert lines[0].startswith(f"rljax: error: {tmp_path}/sft_tiny: the run folder is in use by "
                                   f"host {socket.gethostname()}, pid {owner.pid}, since 20"), second.stderr
        assert "Traceback" not in second.stderr
        assert not os.path.exists(os.path.join(tmp_path, "sft_tiny", "checkpoints", "1"))
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # the owner died without closing anything: the next run owns the folder and trains
    after = subprocess.run([sys.executable, "-m", "rljax.cli", "train", SFT, *overrides], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert after.returncode == 0, after.stderr
    assert os.path.isdir(os.path.join(tmp_path, "sft_tiny", "checkpoints", "2"))


# ---- a resume under a changed config ----------------------------------------------------------


def _saved_at(tmp_path, step, *overrides):
    """A run of `_tiny_cfg(*overrides)` with a checkpoint at `step`, closed."""
    run = Run(_tiny_cfg(tmp_path, *overrides))
    run.save(step, {"w": jnp.arange(4.0)}, {"position": step})
    run.close(None, step)


def _resume(tmp_path, *overrides, allow=None):
    run = Run(_tiny_cfg(tmp_path, *overrides), allow_config_change=allow)
    try:
        return run.resume(abstract_like({"w": jnp.arange(4.0)}), _Data())
    finally:
        run.close(None, 0)


def _run_file(tmp_path, name):
    return os.path.join(tmp_path, "sft_tiny", name)


def _events(tmp_path):
    path = _run_file(tmp_path, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line for line in map(json.loads, f) if "event" in line]


def test_config_changes_lists_each_differing_leaf_old_and_new():
    old = {"optim": {"lr": 0.003, "betas": [0.9, 0.95]}, "trainer": {"total_steps": 10, "seed": 1}}
    new = {"optim": {"lr": 0.001, "betas": (0.9, 0.95)}, "trainer": {"total_steps": 20, "seed": 1}, "x": {"y": 2}}
    assert config_changes(old, new) == {"optim.lr": (0.003, 0.001), "trainer.total_steps": (10, 20), "x.y": (None, 2)}


def test_a_resume_with_the_same_config_resumes_and_keeps_config_yaml(tmp_path):
    _saved_at(tmp_path, 4)
    # trainer.logger is how the run is logged, not what it trains: free to differ
    assert _resume(tmp_path, "trainer.logger=[console]").step == 4
    assert not [n for n in os.listdir(_run_file(tmp_path, "")) if n.startswith("config.step-")]
    assert saved_config(_run_file(tmp_path, ""))["optim"]["lr"] == 3.0e-3
    assert _events(tmp_path) == []


def test_a_run_folder_moved_elsewhere_resumes_with_its_own_data_files(tmp_path):
    import shutil

    _saved_at(tmp_path / "old", 4)
    shutil.copytree(tmp_path / "old" / "sft_tiny", tmp_path / "sft_tiny")
    assert _resume(tmp_path).step == 4
    assert saved_config(_run_file(tmp_path, ""))["data"]["train_files"][0].startswith(_run_file(tmp_path, "data"))
    with pytest.raises(ConfigChangeError, match=r"resuming at step 4 with a config other than the run's: "
                                                r"data\.train_files: \[\S+/sft_tiny/data/\S+\] -> \[\"/elsewhere"):
        _resume(tmp_path, 'data.train_files=["/elsewhere/train.jsonl"]')


def test_a_resume_with_changed_keys_is_refused_naming_each_and_config_yaml_stays(tmp_path):
    _saved_at(tmp_path, 4)
    with open(_run_file(tmp_path, "config.yaml")) as f:
        before = f.read()
    with pytest.raises(ConfigChangeError) as raised:
        _resume(tmp_path, "optim.lr=1.0e-3", "trainer.seed=7")
    message = str(raised.value)
    assert "\n" not in message
    assert "resuming at step 4 with a config other than the run's: " in message
    assert "optim.lr: 0.003 -> 0.001" in message and "trainer.seed: 0 -> 7" in message
    assert "--allow-config-change" in message
    with open(_run_file(tmp_path, "config.yaml")) as f:
        assert f.read() == before
    assert _events(tmp_path) == []
    # the folder is free again after the refusal
    assert _resume(tmp_path).step == 4


def test_an_allowed_change_is_recorded_at_the_step_resumed_from(tmp_path):
    _saved_at(tmp_path, 4)
    assert _resume(tmp_path, "optim.lr=1.0e-3", allow=True).step == 4
    kept = yaml.safe_load(open(_run_file(tmp_path, "config.step-4.yaml")))
    assert kept["optim"]["lr"] == 3.0e-3
    assert saved_config(_run_file(tmp_path, ""))["optim"]["lr"] == 1.0e-3
    assert _events(tmp_path) == [{"step": 4, "event": "config_change", "changed": {"optim.lr": [0.003, 0.001]}}]
    # the same config again: a plain resume
    assert _resume(tmp_path, "optim.lr=1.0e-3").step == 4
    assert len(_events(tmp_path)) == 1


def test_raising_total_steps_extends_the_run_announced_and_recorded(tmp_path, capsys):
    _saved_at(tmp_path, 10)
    assert _resume(tmp_path, "trainer.total_steps=20").step == 10
    out = capsys.readouterr().out
    assert "config changed at step 10: trainer.total_steps: 10 -> 20" in out
    assert yaml.safe_load(open(_run_file(tmp_path, "config.step-10.yaml")))["trainer"]["total_steps"] == 10
    assert saved_config(_run_file(tmp_path, ""))["trainer"]["total_steps"] == 20
    assert _events(tmp_path)[0]["changed"] == {"trainer.total_steps": [10, 20]}
    # with another change as well, the flag is needed
    with pytest.raises(ConfigChangeError, match=r"optim\.lr: 0\.003 -> 0\.001"):
        _resume(tmp_path, "trainer.total_steps=30", "optim.lr=1.0e-3")


def test_total_steps_below_the_latest_checkpoint_is_refused(tmp_path):
    _saved_at(tmp_path, 8)
    with pytest.raises(ConfigError, match=r"trainer\.total_steps=5: the run in .* has a checkpoint at step 8"):
        _resume(tmp_path, "trainer.total_steps=5")


def test_a_finished_run_says_so(tmp_path, capsys):
    _saved_at(tmp_path, 10)
    capsys.readouterr()
    assert _resume(tmp_path).step == 10
    assert "finished at step 10" in capsys.readouterr().out


def test_no_comparison_without_a_checkpoint_or_with_resume_disabled(tmp_path):
    Run(_tiny_cfg(tmp_path)).close(None, 0)  # folder and config.yaml, no checkpoint: a new run
    assert _resume(tmp_path, "optim.lr=1.0e-3") is None
    assert saved_config(_run_file(tmp_path, ""))["optim"]["lr"] == 1.0e-3
    _saved_at(tmp_path, 4, "optim.lr=1.0e-3")
    assert _resume(tmp_path, "optim.lr=2.0e-3", "trainer.resume_mode=disable") is None  # starts over
    assert saved_config(_run_file(tmp_path, ""))["optim"]["lr"] == 2.0e-3


@pytest.mark.slow
def test_rljax_train_again_finished_refused_or_allowed_and_recorded(tmp_path):
    overrides = [f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.total_steps=2",
                 "trainer.test_freq=0", "data.val_files=[]"]

    def train(*more):
        return subprocess.run([sys.executable, "-m", "rljax.cli", "train", SFT, *overrides, *more], cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=600)

    assert train().returncode == 0
    with open(_run_file(tmp_path, "config.yaml")) as f:
        saved = f.read()
    again = train()
    assert again.returncode == 0, again.stderr
    assert "finished at step 2" in again.stdout
    refused = train("optim.lr=1.0e-3")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[0].startswith(f"rljax: error: {tmp_path}/sft_tiny: resuming at step 2 with "
                                                     "a config other than the run's: optim.lr: 0.003 -> 0.001.")
    with open(_run_file(tmp_path, "config.yaml")) as f:
        assert f.read() == saved
    allowed = train("optim.lr=1.0e-3", "trainer.total_steps=3", "--allow-config-change")
    assert allowed.returncode == 0, allowed.stderr
    assert os.path.isdir(_run_file(tmp_path, "checkpoints/3"))
    with open(_run_file(tmp_path, "config.step-2.yaml")) as f:
        assert f.read() == saved
    assert saved_config(_run_file(tmp_path, ""))["optim"]["lr"] == 1.0e-3
    assert _events(tmp_path) == [{"step": 2, "event": "config_change",
                                  "changed": {"optim.lr": [0.003, 0.001], "trainer.total_steps": [2, 3]}}]


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_decoder_token_log_probs_is_the_chunked_math_bit_for_bit(temperature):
    config = ModelConfig.from_hf_dict({"model_type": "qwen2", "vocab_size": 40, "hidden_size": 32,
                                       "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "num_key_value_heads": 2, "tie_word_embeddings": True})
    model = init_model(config, seed=3)
    ids = jax.random.randint(jax.random.key(0), (2, 300), 0, 40)  # more than one 256-position chunk
    mask = jnp.ones_like(ids).at[1, :17].set(0)
    hidden = model.hidden_states(ids, attention_mask=mask)
    want_lp, want_ent = log_probs_from_hidden(hidden, model.unembedding(), ids, temperature=temperature,
                                              compute_entropy=True)
    lp, ent = model.token_log_probs(ids, mask, temperature=temperature, entropy=True)
    np.testing.assert_array_equal(lp, want_lp)
    np.testing.assert_array_equal(ent, want_ent)
    np.testing.assert_array_equal(model.token_log_probs(ids, mask, temperature=temperature),
                                  log_probs_from_hidden(hidden, model.unembedding(), ids, temperature=temperature))
    # and the same numbers as the full-logits path
    np.testing.assert_allclose(lp, token_log_probs(model(ids, mask), ids, temperature), rtol=1e-5, atol=1e-5)
