"""Learning-rate schedules against hand-computed values."""

import math

import pytest

from rljax.train.optim import OptimConfig, make_schedule


def lr_at(step, **kw):
    return float(make_schedule(OptimConfig(lr=1.0, **kw), total_steps=100)(step))


def test_constant_with_warmup():
    # linear 0 -> 1 over 10 steps, then flat
    assert lr_at(0, warmup_steps=10) == 0.0
    assert lr_at(5, warmup_steps=10) == pytest.approx(0.5)
    assert lr_at(10, warmup_steps=10) == 1.0 and lr_at(99, warmup_steps=10) == 1.0


def test_cosine_with_min_lr_ratio():
    kw = dict(lr_scheduler_type="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    # halfway through the 90 decay steps: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55
    assert lr_at(55, **kw) == pytest.approx(0.55, abs=1e-6)
    assert lr_at(100, **kw) == pytest.approx(0.1)
    assert lr_at(30, **kw) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 20 / 90)) / 2, abs=1e-6)


def test_warmup_stable_decay():
    kw = dict(lr_scheduler_type="wsd", warmup_steps=10, decay_ratio=0.2, min_lr_ratio=0.0)
    # warmup 0-10, stable 10-80, linear decay to 0 over 80-100
    assert lr_at(5, **kw) == pytest.approx(0.5)
    assert lr_at(50, **kw) == 1.0 and lr_at(80, **kw) == 1.0
    assert lr_at(90, **kw) == pytest.approx(0.5)
    assert lr_at(100, **kw) == pytest.approx(0.0)


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="optim.lr_scheduler_type='linear'"):
        make_schedule(OptimConfig(lr_scheduler_type="linear"), 10)
