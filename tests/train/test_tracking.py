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


def test_console_has_no_eta_before_a_step_is_timed(tmp_path, capsys):
    tracker = Tracker(str(tmp_path), ["console"], total_steps=4)
    tracker.log(0, {"val-core/synthetic/arithmetic/acc/mean@1": 0.25})  # step-0 validation
    tracker.log(1, {"critic/score/mean": 0.5})
    tracker.log(2, {"critic/score/mean": 0.6})
    tracker.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and not any("nan" in line for line in lines)
    assert "eta" not in lines[0] and "val acc/mean@1 (synthetic/arithmetic)=0.25" in lines[0]
    assert "eta" in lines[1] and "eta" in lines[2]
