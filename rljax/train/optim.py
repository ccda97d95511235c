"""Optimizer: AdamW with a learning-rate schedule and global-norm gradient clipping.

Schedules (`lr_scheduler_type`):
- `constant`: linear warmup from 0 to `lr` over `warmup_steps`, then constant.
- `cosine`: warmup, then cosine decay from `lr` to `min_lr_ratio * lr` at `total_steps`.
- `wsd` (warmup-stable-decay, Hu et al. 2024, MiniCPM): warmup, constant, then linear
  decay to `min_lr_ratio * lr` over the last `decay_ratio` of the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import optax

from rljax.config import FieldError, NonNegFloat, NonNegSteps, PositiveFloat, UnitFloat, check_name


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, its learning-rate schedule and gradient clipping (verl: `actor.optim`)."""

    lr: NonNegFloat = 1e-5  # peak learning rate
    weight_decay: NonNegFloat = 0.01  # AdamW's decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # Adam's (beta1, beta2), each in [0, 1)
    eps: PositiveFloat = 1e-8  # Adam's epsilon
    grad_clip: float = 1.0  # max global gradient norm; <= 0: no clipping
    lr_scheduler_type: str = "constant"  # constant | cosine | wsd (rljax.train.optim)
    warmup_steps: NonNegSteps = 0  # steps of linear warmup from 0 to lr; 0: warmup_steps_ratio's
    warmup_steps_ratio: UnitFloat = 0.0  # warmup as a fraction of the total steps (when warmup_steps is 0)
    min_lr_ratio: UnitFloat = 0.0  # cosine / wsd: the final learning rate, as a fraction of lr
    decay_ratio: UnitFloat = 0.1  # wsd: fraction of the steps spent decaying

    def check(self) -> None:
        """Run by `rljax.config.check_config` (errors are prefixed with this section's key)."""
        problem = check_name(self.lr_scheduler_type, SCHEDULES)
        if problem:
            raise FieldError("lr_scheduler_type", problem)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise FieldError("betas", f"two numbers in [0, 1), got {list(self.betas)}")


def _warmup_steps(config: OptimConfig, total_steps: int) -> int:
    return config.warmup_steps or int(config.warmup_steps_ratio * total_steps)


def _constant(config: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = _warmup_steps(config, total_steps)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, config.lr, max(warmup, 1)), optax.constant_schedule(config.lr)], [warmup]
    ) if warmup else optax.constant_schedule(config.lr)


def _cosine(config: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = _warmup_steps(config, total_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),  # counts the warmup too
        end_value=config.lr * config.min_lr_ratio,
    )


def _wsd(config: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = _warmup_steps(config, total_steps)
    decay = max(int(config.decay_ratio * total_steps), 1)
    stable = max(total_steps - warmup - decay, 0)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, config.lr, max(warmup, 1)),
            optax.constant_schedule(config.lr),
            optax.linear_schedule(config.lr, config.lr * config.min_lr_ratio, decay),
        ],
        [warmup, warmup + stable],
    )


SCHEDULES: dict[str, Callable[[OptimConfig, int], optax.Schedule]] = {
    "constant": _constant,
    "cosine": _cosine,
    "wsd": _wsd,
}


def make_schedule(config: OptimConfig, total_steps: int) -> optax.Schedule:
    if config.lr_scheduler_type not in SCHEDULES:
        raise ValueError(
            f"optim.lr_scheduler_type={config.lr_scheduler_type!r}; choose from {sorted(SCHEDULES)}"
        )
    return SCHEDULES[config.lr_scheduler_type](config, total_steps)


def make_optimizer(config: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW behind global-norm clipping. Skipping non-finite steps is the train step's
    job (it keeps the old params and optimizer state and counts the skip)."""
    schedule = make_schedule(config, total_steps)
    parts = []
    if config.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(
        optax.adamw(schedule, b1=config.betas[0], b2=config.betas[1], eps=config.eps,
                    weight_decay=config.weight_decay)
    )
    return optax.chain(*parts), schedule
