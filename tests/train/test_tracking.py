"""The console line shows what an RL user watches (score, response length, validation
accuracy when a step computed it) and never prints `nan` for the eta."""

from rljax.tracking import Tracker, console_line


def test_console_line_shows_rl_metrics_and_validation():
    metrics = {"critic/score/mean": 0.4123, "response_length/mean": 9.25, "train/loss": 0.01,
               "val-core/synthetic/arithmetic/acc/mean@1": 0.5234, "val-core/synthetic/arithmetic/acc/pass@1": 0.5,
               "timing_s/gen": 3.0}
    line = console_line(10, 200, metrics, seconds_per_step=3.0)
    assert "step 10/200" in line and "score=0.4123" in line and "resp_len=9.25" in line
    assert "val acc/mean@1 (synthetic/arithmetic)=0.5234" in line
    assert "3 s/step eta 9m30s" in line  # 190 steps left x 3 s
    assert "timing_s" not in line and "pass@1" not in line


def test_the_eta_leaves_out_the_first_trained_step_which_compiles(tmp_path, capsys, monkeypatch):
    clock = iter([0.0, 100.0, 101.0, 102.0])  # validation at 0, step 1 took 100 s (compiling), then 1 s a step
    monkeypatch.setattr("rljax.tracking.time.time", lambda: next(clock))
    tracker = Tracker(str(tmp_path), ["console"], total_steps=10)
    tracker.log(0, {"val-core/synthetic/arithmetic/acc/mean@1": 0.25})  # step-0 validation
    tracker.log(1, {"critic/score/mean": 0.5})
    tracker.log(2, {"critic/score/mean": 0.6})
    tracker.log(3, {"critic/score/mean": 0.7})
    tracker.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"rljax: run folder {tmp_path}"
    assert len(lines) == 5 and not any("nan" in line for line in lines)
    assert "eta" not in lines[1] and "val acc/mean@1 (synthetic/arithmetic)=0.25" in lines[1]
    assert "eta" not in lines[2]  # step 1: nothing timed yet but compilation
    assert lines[3].endswith("1 s/step eta 0m08s") and lines[4].endswith("1 s/step eta 0m07s")


def test_phases_show_on_the_first_step_and_the_end_says_where_things_are(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    run = tmp_path / "runs" / "demo"
    tracker = Tracker(str(run), ["console", "jsonl"], total_steps=2)
    tracker.phase(1, "gen")
    tracker.phase(1, "step")  # the whole step: not a phase
    tracker.log(1, {"critic/score/mean": 0.5})
    tracker.phase(2, "gen")  # later steps: no phase lines in a log file
    tracker.log(2, {"critic/score/mean": 0.6})
    tracker.finish(2)
    tracker.close()
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  step 1/2: rollout (sampling and scoring) (compiles on first use)..."
    assert sum("rollout (sampling" in line for line in out) == 1
    assert out[4:] == [
        "rljax: finished at step 2/2",
        f"  checkpoints  {run / 'checkpoints'}",
        f"  metrics      {run / 'metrics.jsonl'}   (plots: rljax plot {run})",
        "next:",
        f"  rljax export {run} --out {run}-hf",
        f"  rljax generate --model {run}-hf --prompt \"...\"",
    ]


def test_a_run_inside_a_run_says_nothing_at_its_end(tmp_path, capsys):
    """The SFT warm-up of an RL run finishes while the RL run goes on: only the outer
    run prints where things are."""
    outer = Tracker(str(tmp_path / "rl"), ["console"], total_steps=2)
    inner = Tracker(str(tmp_path / "rl" / "warmup_sft"), ["console"], total_steps=1)
    inner.finish(1)
    inner.close()
    outer.finish(2)
    outer.close()
    out = capsys.readouterr().out
    assert out.count("rljax: finished") == 1 and "finished at step 2/2" in out and "warmup_sft-hf" not in out
