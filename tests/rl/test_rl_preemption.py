"""An RL run (PPO with a critic and an adaptive KL-in-reward coefficient) sent SIGTERM
while the sampler is generating step 2's rollout finishes that step, saves it (with
`trainer.save_freq=0` no other step is saved before the last), and `rljax` exits 75; the
same command resumes it and the run logs exactly what an uninterrupted run logs."""

import os
import textwrap

import pytest

from rljax.checkpoint import finalized_steps
from rljax.cli import PREEMPTED_EXIT_CODE
from tests.rl.test_rl_resume import config_and_overrides
from tests.train.test_preemption import assert_same_metrics, finish, logged, rljax

pytestmark = pytest.mark.slow

def sigterm_during_rollout_of_step_2(marker) -> str:
    """A sitecustomize hook: SIGTERM to this process (to process `RLJAX_PROCESS_ID`=1 alone
    when there are several) once the sampler has taken the requests of the run's second
    rollout (step 2's), so the signal arrives while it decodes them; once per test (the
    file `marker` records it, so a restarted run is not signalled again)."""
    return textwrap.dedent(f"""
        import os, signal, threading
        from rljax.rl.generation import Generation
        from rljax.rollout.sampler import Sampler
        rollouts, lock, marker = [0], threading.Lock(), {str(marker)!r}
        real_rollout, real_submit_many = Generation.rollout, Sampler.submit_many
        def rollout(self, *args, **kwargs):
            rollouts[0] += 1
            return real_rollout(self, *args, **kwargs)
        def submit_many(self, requests):
            futures = real_submit_many(self, requests)
            with lock:
                due = (rollouts[0] == 2 and os.environ.get("RLJAX_PROCESS_ID", "1") == "1"
                       and not os.path.exists(marker))
                if due:
                    open(marker, "w").close()
            if due:
                os.kill(os.getpid(), signal.SIGTERM)
            return futures
        Generation.rollout, Sampler.submit_many = rollout, submit_many
    """)


def test_rl_sigterm_mid_rollout_saves_that_step_exits_75_and_resumes_like_a_straight_run(tmp_path):
    config, overrides = config_and_overrides(tmp_path, tmp_path / "straight")
    straight = rljax(tmp_path, ["train", config, *overrides, "trainer.algorithm=ppo"], name="straight")
    config, overrides = config_and_overrides(tmp_path, tmp_path / "stopped")
    overrides = [*overrides, "trainer.algorithm=ppo", "trainer.save_freq=0", "trainer.async_save=true"]  # last wins
    command = ["train", config, *overrides]
    hook = sigterm_during_rollout_of_step_2(tmp_path / "signalled")
    code, out = finish(tmp_path, rljax(tmp_path, command, hook=hook, name="stopped"), "stopped")
    run_dir = str(tmp_path / "stopped" / "run")
    assert code == PREEMPTED_EXIT_CODE, out[-3000:]
    assert "rljax: SIGTERM" in out and "rljax: preempted at step 2 (SIGTERM)" in out, out[-3000:]
    assert finalized_steps(os.path.join(run_dir, "checkpoints")) == [2]
    assert [m["step"] for m in logged(run_dir)] == [1, 2]

    code, out = finish(tmp_path, rljax(tmp_path, command, name="resumed"), "resumed")
    assert code == 0 and "resumed from" in out, out[-3000:]
    code, out = finish(tmp_path, straight, "straight")
    assert code == 0, out[-3000:]
    assert_same_metrics(logged(str(tmp_path / "straight" / "run")), logged(run_dir))
    assert finalized_steps(os.path.join(run_dir, "checkpoints")) == [2, 4]
