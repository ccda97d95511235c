"""Preemption: a SIGTERM stops a run after a step every process agrees on, with that step
saved, and `rljax` exits 75 (the launchers' "resume"); the same command then resumes, and
the resumed run logs what an uninterrupted one logs. Ctrl-C keeps its own way (exit 130).

Here: the agreement on one process (`rljax.runs.Preemption`), and a supervised run
signalled in the middle of a step. The RL cases are in tests/rl/test_rl_preemption.py and
tests/parallel/test_multihost_preemption.py; they share the helpers below. Runs are
`rljax train` subprocesses, with test hooks in a `sitecustomize` module on PYTHONPATH (the
code under test has no test switches)."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rljax.checkpoint import finalized_steps
from rljax.cli import PREEMPTED_EXIT_CODE
from rljax.runs import Preemption

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT_CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")

# what differs between two runs of the same steps: wall-clock measurements
VOLATILE = ("timing_s/", "perf/throughput", "perf/mfu", "perf/time_per_step", "perf/update_flops_per_s",
            "perf/max_memory")

# the subprocesses reuse what the others compiled (tests/conftest.py)
SHARE_PROGRAMS_HOOK = textwrap.dedent("""
    import tests.conftest
    tests.conftest._share_programs_across_devices()
""")

# SIGTERM to this process when the metrics of step 2 are logged: a supervised run logs a
# step's metrics once the next step is on the device, so the signal comes during step 3
SIGTERM_AT_LOG_OF_STEP_2 = textwrap.dedent("""
    import os, signal
    from rljax.tracking import Tracker
    real_log = Tracker.log
    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
    Tracker.log = log
""")


def rljax(tmp_path, args: list[str], hook: str = "", name: str = "run") -> subprocess.Popen:
    """`python -m rljax.cli ARGS` with `hook` in its sitecustomize; output in tmp_path/<name>.log."""
    hook_dir = tmp_path / f"hook-{name}"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SHARE_PROGRAMS_HOOK + hook)
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest",
           "PYTHONPATH": os.pathsep.join([str(hook_dir), ROOT, os.environ.get("PYTHONPATH", "")])}
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "rljax.cli", *args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def finish(tmp_path, proc: subprocess.Popen, name: str = "run") -> tuple[int, str]:
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, (tmp_path / f"{name}.log").read_text()


def logged(run_dir: str) -> list[dict]:
    """metrics.jsonl without the wall-clock measurements."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows]


def assert_same_metrics(straight: list[dict], resumed: list[dict]) -> None:
    assert [m["step"] for m in resumed] == [m["step"] for m in straight]
    for a, b in zip(straight, resumed):
        assert b == a, f"step {a['step']}: " + ", ".join(f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b))
                                                         if a.get(k) != b.get(k))


# ---- the agreement on one process --------------------------------------------------------------


def test_one_process_agrees_after_its_own_sigterm_and_gives_the_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    watch = Preemption()
    try:
        assert not watch.agreed(1)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        assert watch.noticed and watch.agreed(2) and watch.agreed(3)
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_launchers_read_the_exit_code_the_command_line_gives():
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import local_multiprocess
    finally:
        sys.path.pop(0)
    assert PREEMPTED_EXIT_CODE == local_multiprocess.PREEMPTED == 75
    with open(os.path.join(ROOT, "launch", "tpu_vm.sh")) as f:
        assert "PREEMPTED=75" in f.read()
    with open(os.path.join(ROOT, "launch", "gke", "jobset.yaml")) as f:
        assert "values: [75]" in f.read()


# ---- a supervised run --------------------------------------------------------------------------

SFT = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.micro_batch_size=0", "trainer.total_steps=5",
       "trainer.save_freq=0", "trainer.test_freq=0", "data.val_files=[]", "trainer.async_save=true"]


@pytest.mark.slow
def test_sft_sigterm_mid_step_saves_that_step_exits_75_and_resumes_like_a_straight_run(tmp_path):
    def command(root):
        return ["train", SFT_CONFIG, *SFT, f"trainer.default_local_dir={tmp_path / root}"]

    straight = rljax(tmp_path, command("straight"), name="straight")
    stopped = rljax(tmp_path, command("stopped"), hook=SIGTERM_AT_LOG_OF_STEP_2, name="stopped")
    code, out = finish(tmp_path, stopped, "stopped")
    run_dir = str(tmp_path / "stopped" / "sft_tiny")
    assert code == PREEMPTED_EXIT_CODE, out[-3000:]
    assert finalized_steps(os.path.join(run_dir, "checkpoints")) == [3]  # save_freq=0: only the agreed step
    assert [m["step"] for m in logged(run_dir)] == [1, 2, 3]
    assert "rljax: preempted at step 3 (SIGTERM)" in out and "Traceback" not in out, out[-3000:]

    code, out = finish(tmp_path, rljax(tmp_path, command("stopped"), name="resumed"), "resumed")
    assert code == 0 and "resumed from" in out, out[-3000:]
    code, out = finish(tmp_path, straight, "straight")
    assert code == 0, out[-3000:]
    assert_same_metrics(logged(str(tmp_path / "straight" / "sft_tiny")), logged(run_dir))
    assert finalized_steps(os.path.join(run_dir, "checkpoints")) == [3, 5]
