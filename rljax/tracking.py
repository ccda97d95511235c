"""Metric logging: tensorboardX event files, `metrics.jsonl` (one JSON object per step)
and a console progress line, from process 0 only. Metric names follow verl
(`train/loss`, `train/lr`, `perf/throughput`, `timing_s/step`, ...)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import jax

CONSOLE_KEYS = ("train/loss", "train/grad_norm", "train/lr", "perf/throughput", "val/loss")


class Tracker:
    def __init__(self, run_dir: str, loggers: list[str], total_steps: int):
        unknown = set(loggers) - {"console", "tensorboard", "jsonl"}
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {sorted(unknown)}; use console, tensorboard, jsonl")
        self.enabled = jax.process_index() == 0
        self.loggers = set(loggers)
        self.total_steps = total_steps
        self.start = time.time()
        self._tb = None
        self._jsonl = None
        if not self.enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if "tensorboard" in self.loggers:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if "jsonl" in self.loggers:
            self._jsonl = open(os.path.join(run_dir, "metrics.jsonl"), "a")

    def log(self, step: int, metrics: dict) -> None:
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
        done = step / max(self.total_steps, 1)
        bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
        elapsed = time.time() - self.start
        eta = elapsed / max(done, 1e-9) - elapsed if done > 0 else float("nan")
        shown = " ".join(f"{k.removeprefix('train/')}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
        print(f"[{bar}] step {step}/{self.total_steps} {shown} eta {eta:.0f}s", file=sys.stdout, flush=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
