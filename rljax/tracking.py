"""Metric logging: tensorboardX event files, `metrics.jsonl` (one JSON object per step)
and a console progress line, from process 0 only. Metric names follow verl
(`actor/grad_norm`, `actor/lr`, `perf/throughput`, `timing_s/step`, ...; the supervised
loop's `train/loss`, `train/lr`); `docs/runs.md` lists them."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from rljax.distributed import is_coordinator

# (metric, console label): what a user watches, in this order; validation accuracy
# (`val-core/{data_source}/acc/mean@k`) follows when a step computed it.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"), ("response_length/mean", "resp_len"), ("train/loss", "loss"),
    ("actor/loss", "loss"), ("actor/pg_loss", "pg_loss"), ("train/grad_norm", "grad_norm"),
    ("actor/grad_norm", "grad_norm"), ("train/lr", "lr"), ("actor/lr", "lr"),
    ("perf/throughput", "tok/s/dev"), ("val/loss", "val_loss"),
)
VALIDATION_PREFIX = "val-core/"
# timer name -> what the console calls the phase (`Tracker.phase`)
PHASES = {
    "gen": "rollout (sampling and scoring)", "old_log_prob": "old log-probs", "ref": "reference log-probs",
    "values": "values", "adv": "advantages", "update_critic": "update (critic)", "update_actor": "update (actor)",
    "update_weights": "weights to the sampler", "train": "update",
}


def console_line(step: int, total_steps: int, metrics: dict[str, float], seconds_per_step: float | None) -> str:
    """`[####----] step 10/200 score=0.41 resp_len=9.2 loss=... val acc/mean@1 (synthetic/arithmetic)=0.52
    3.1 s/step eta 9m48s`. Rate and eta only once a step has been timed (never `nan`)."""
    done = step / max(total_steps, 1)
    bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
    parts = [f"[{bar}] step {step}/{total_steps}"]
    parts += [f"{label}={metrics[k]:.4g}" for k, label in CONSOLE_KEYS if k in metrics]
    for key in sorted(k for k in metrics if k.startswith(VALIDATION_PREFIX) and "/acc/mean@" in k):
        source, _, name = key.removeprefix(VALIDATION_PREFIX).rpartition("/acc/")
        parts.append(f"val acc/{name} ({source})={metrics[key]:.4g}")
    if seconds_per_step is not None:
        left = max(total_steps - step, 0) * seconds_per_step
        parts.append(f"{seconds_per_step:.3g} s/step eta {_duration(left)}")
    return " ".join(parts)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _drop_after(path: str, step: int) -> None:
    """Rewrite metrics.jsonl keeping the lines of steps 1..`step` (and step 0's
    validation, when `step` > 0); a line that does not parse (a write cut short) goes too."""
    kept = []
    with open(path) as f:
        for line in f:
            try:
                logged = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if step > 0 and logged <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


class Tracker:
    """Writes each step's metrics to the enabled loggers. Files open at the first `log`.

    A run that continues from a checkpoint calls `start_at(step)` first: what an earlier
    attempt logged after that step is dropped (those steps run again), so `metrics.jsonl`
    holds each step once and TensorBoard purges the replayed points; `start_at(0)` (a
    run that starts over) drops the whole earlier history. Without `start_at` the files
    are appended to."""

    _live: list[Tracker] = []  # trackers not yet closed (an RL run's SFT warm-up runs in a folder inside it)

    def __init__(self, run_dir: str, loggers: list[str], total_steps: int):
        unknown = set(loggers) - {"console", "tensorboard", "jsonl"}
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {sorted(unknown)}; use console, tensorboard, jsonl")
        self.enabled = is_coordinator()
        self.loggers = set(loggers)
        self.total_steps = total_steps
        self.run_dir = run_dir
        self._first: tuple[int, float] | None = None  # (step, time) of the first trained step's console line
        self._phase_shown = False  # a phase line is on the console (a TTY), to be overwritten
        self._start: int | None = None  # set by start_at
        self._opened = False
        self._tb = None
        self._jsonl = None
        Tracker._live.append(self)
        if self.enabled:
            os.makedirs(run_dir, exist_ok=True)
            if "console" in self.loggers:
                print(f"rljax: run folder {os.path.abspath(run_dir)}", file=sys.stdout, flush=True)

    def start_at(self, step: int) -> None:
        """The run continues after `step` (0: from scratch); call before the first `log`."""
        if self._opened:
            raise RuntimeError("Tracker.start_at: called after the first log")
        self._start = int(step)

    def _open(self) -> None:
        self._opened = True
        if not self.enabled:
            return
        if "tensorboard" in self.loggers:
            from tensorboardX import SummaryWriter

            # TensorBoard discards earlier events at steps >= purge_step
            purge = None if self._start is None else self._start + 1 if self._start else 0
            self._tb = SummaryWriter(os.path.join(self.run_dir, "tensorboard"), purge_step=purge)
        if "jsonl" in self.loggers:
            path = os.path.join(self.run_dir, "metrics.jsonl")
            if self._start is not None and os.path.exists(path):
                _drop_after(path, self._start)
            self._jsonl = open(path, "a")

    def log(self, step: int, metrics: dict) -> None:
        if not self._opened:
            self._open()
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        if self._tb is not None:
            for k, v in clean.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self._jsonl.flush()
        if "console" in self.loggers:
            self._console(step, clean)

    def _console(self, step: int, metrics: dict) -> None:
        now = time.time()
        if step == 0 or self._first is None or step <= self._first[0]:
            # the rate counts the steps after the first one this process trained: that one
            # compiled the step's programs (step 0's validation trains nothing)
            self._first = None if step == 0 else (step, now)
            rate = None
        else:
            rate = (now - self._first[1]) / (step - self._first[0])
        self._clear_phase()
        print(console_line(step, self.total_steps, metrics, rate), file=sys.stdout, flush=True)

    def phase(self, step: int, name: str) -> None:
        """Step `step` entered phase `name` (a `timing_s/` name: gen, old_log_prob, ...).
        On a terminal one status line shows it, overwritten by the next; elsewhere (a log
        file) only the first step's phases are printed, as it compiles each program."""
        if not (self.enabled and "console" in self.loggers) or name not in PHASES:
            return
        label = PHASES[name]
        if sys.stdout.isatty():
            print(f"\r\033[K  step {step}/{self.total_steps}: {label}...", end="", file=sys.stdout, flush=True)
            self._phase_shown = True
        elif self._first is None:
            print(f"  step {step}/{self.total_steps}: {label} (compiles on first use)...", file=sys.stdout, flush=True)

    def _clear_phase(self) -> None:
        if self._phase_shown:
            print("\r\033[K", end="", file=sys.stdout, flush=True)
            self._phase_shown = False

    def summary(self, step: int) -> str:
        """Where a finished run's outputs are, and the commands to run next."""
        run = os.path.relpath(self.run_dir) if not os.path.isabs(self.run_dir) else self.run_dir
        lines = [f"rljax: finished at step {step}/{self.total_steps}",
                 f"  checkpoints  {os.path.join(run, 'checkpoints')}"]
        if "jsonl" in self.loggers:
            lines.append(f"  metrics      {os.path.join(run, 'metrics.jsonl')}   (plots: rljax plot {run})")
        if "tensorboard" in self.loggers:
            lines.append(f"  tensorboard  tensorboard --logdir {os.path.join(run, 'tensorboard')}")
        out = f"{run.rstrip(os.sep)}-hf"
        lines += ["next:", f"  rljax export {run} --out {out}",
                  f"  rljax generate --model {out} --prompt \"...\""]
        return "\n".join(lines)

    def finish(self, step: int) -> None:
        """Print `summary` (process 0, console logger on), unless this run is a phase of
        one still going (an RL run's SFT warm-up)."""
        inside = any(os.path.abspath(self.run_dir).startswith(os.path.abspath(other.run_dir) + os.sep)
                     for other in Tracker._live if other is not self)
        if self.enabled and "console" in self.loggers and not inside:
            self._clear_phase()
            print(self.summary(step), file=sys.stdout, flush=True)

    def close(self) -> None:
        if self in Tracker._live:
            Tracker._live.remove(self)
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
