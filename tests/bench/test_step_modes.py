"""`rljax bench step --mode`: the per-mode summary's arithmetic on hand-made rows, the
stretch that makes a call last a set time, and the one_step_off benchmark config (one
rollout replica on the first half of the devices, the trainer on the second)."""

import time

import pytest

from rljax import cli
from rljax.bench import step
from rljax.config import validate
from rljax.rl.async_config import run_split


def rows(mode, values):
    return [{"mode": mode, "step": s, "gen": g, "wait_rollout": w, "update_weights": u, "trainer_idle": ti,
             "sampler_idle": si} for s, g, w, u, ti, si in values]


def test_summary_of_a_sync_and_a_one_step_off_run():
    # sync: step 2.5 = gen 1.0 + train 1.5 (weights 0); the first row (compile) and the last are left out
    sync = step.summary("sync", rows("sync", [(99, 9, None, 0, None, None), (2.5, 1.0, None, 0.0, None, None),
                                             (2.5, 1.0, None, 0.0, None, None), (7, 7, None, 0, None, None)]), 1)
    assert sync["steps"] == 2 and sync["train"] == pytest.approx(1.5) and sync["speedup"] == pytest.approx(1.0)
    assert sync["ideal"] == pytest.approx(2.5 / 1.5)
    assert sync["trainer_idle"] == pytest.approx(0.4) and sync["sampler_idle"] == pytest.approx(0.6)
    # one_step_off: step 1.6 = wait 0.1 + weights 0.0 + train 1.5, gen 1.0 in the background
    off = step.summary("one_step_off", rows("one_step_off", [(99, 9, 9, 0, 0, 0), (1.6, 1.0, 0.1, 0.0, 0.0625, 0.375),
                                                             (5, 1, 4, 0, 0.8, 0.8)]), 1)
    assert off["steps"] == 1 and off["train"] == pytest.approx(1.5) and off["speedup"] == pytest.approx(2.5 / 1.6)
    assert off["ideal"] == pytest.approx(2.5 / 1.5) and off["trainer_idle"] == 0.0625


def test_stretch_makes_a_call_last_at_least_the_set_time():
    start = time.perf_counter()
    assert step.stretch(lambda x: x + 1, 0.2)(1) == 2
    assert time.perf_counter() - start >= 0.2
    f = lambda: None  # noqa: E731
    assert step.stretch(f, 0.0) is f


def test_one_step_off_config_splits_the_devices(tmp_path):
    args = cli.build_parser().parse_args(["bench", "step", "--model", "tiny", "--prompts", "4", "--n", "2",
                                          "--mode", "sync", "one_step_off"])
    assert args.mode == ["sync", "one_step_off"]
    cfg = step.build_config(args, str(tmp_path), "one_step_off")
    validate(cfg, 8)
    split = run_split(cfg)
    assert [d.id for d in split.rollout] == [0, 1, 2, 3] and [d.id for d in split.trainer] == [4, 5, 6, 7]
    assert cfg.rollout.tensor_parallel_size == 1 and cfg.rollout.data_parallel_size == 1
    assert step.build_config(args, str(tmp_path)).trainer.mode == "sync"


def test_summary_of_an_async_run_takes_generation_from_the_sampler_idle_share():
    # step 2.0 = wait 0.2 + weights 0.1 + train 1.7; the replicas ran segments 75 % of it: gen 1.5
    rows_ = rows("async", [(99, None, 9, 0, 0, 0), (2.0, None, 0.2, 0.1, 0.1, 0.25), (5, None, 4, 0, 0.8, 0.8)])
    s = step.summary("async", rows_, 1)
    assert s["gen"] == pytest.approx(1.5) and s["train"] == pytest.approx(1.7)
    assert s["speedup"] == pytest.approx(3.2 / 2.0) and s["ideal"] == pytest.approx(3.2 / 1.7)
    args = cli.build_parser().parse_args(["bench", "step", "--model", "tiny", "--mode", "async", "--max-staleness",
                                          "2", "--engine-step-ms", "5"])
    cfg = step.build_config(args, "/tmp/unused", "async")
    assert cfg.trainer.mode == "async" and cfg.async_.max_staleness == 2 and args.engine_step_ms == 5


def test_steps_that_compiled_a_sampler_program_are_left_out():
    # the row at index 2 compiled (5 -> 7 programs): a resumed rollout's new prefill bucket
    rows_ = rows("one_step_off", [(99, 9, 9, 0, 0, 0), (1.6, 1.0, 0.1, 0.0, 0.0, 0.0), (8.0, 6.0, 6.5, 0.0, 0.0, 0.0),
                                  (1.8, 1.0, 0.3, 0.0, 0.0, 0.0), (5, 1, 4, 0, 0.8, 0.8)])
    for r, programs in zip(rows_, [5, 5, 7, 7, 7]):
        r["sampler_programs"] = programs
    s = step.summary("one_step_off", rows_, 1)
    assert s["steps"] == 2 and s["step"] == pytest.approx(1.7) and s["train"] == pytest.approx(1.5)


@pytest.mark.parametrize("mode,bypass", [("sync", False), ("one_step_off", True), ("async", True)])
def test_each_mode_runs_with_its_default_correction(mode, bypass):
    args = cli.build_parser().parse_args(["bench", "step", "--model", "tiny", "--mode", mode])
    assert step.build_config(args, "/tmp/unused", mode).algorithm.rollout_correction.bypass_mode is bypass
