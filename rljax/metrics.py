"""How a step metric combines over parts of a step: rollouts (DAPO dynamic
sampling), rollout replicas, micro-batches.

A metric is a float under a name; its name says how it reduces. `REDUCTIONS` declares it
for every metric family that is combined, as fnmatch patterns, first match wins:

    mean   a mean, fraction or rate over the part's samples: the weighted mean of the
           parts' values, weights = the number of samples (or prompts) each part's value
           is over:  sum_i w_i v_i / sum_i w_i
    sum    a count or total: sum_i v_i
    max    a maximum: max_i v_i
    min    a minimum: min_i v_i

A part that does not report a metric is left out of that metric's reduction (it had
nothing the metric describes, e.g. no sample with a reward extra); producers whose metric
is a fraction of all samples report it in every part (0 when nothing happened), so that
leaving a part out never changes the fraction. A name no pattern matches is a `KeyError`:
a new metric family is declared here, or by its producer with `declare_reduction`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

Reduction = Literal["mean", "sum", "max", "min"]

REDUCTIONS: list[tuple[str, Reduction]] = [
    # statistics named by their last component
    ("*/mean", "mean"),
    ("*/max", "max"),
    ("*/min", "min"),
    # reward functions, reward model, verifier (`rljax.rewards`, `rljax.rl.model_rewards`)
    ("reward/errors", "sum"),  # samples whose reward function raised
    ("reward/timeouts", "sum"),  # samples whose reward function timed out
    ("reward/overlong_frac", "mean"),  # fraction of samples past the overlong threshold
    ("verifier/parse_failures", "sum"),  # verdicts that could not be parsed
    # agent episodes (`rljax.agent.loop.collect_metrics`, `rljax.rl.agent_rollout`)
    ("agent/tool_use_rate", "mean"),  # fraction of episodes with at least one tool call
    ("agent/termination/*", "mean"),  # fraction of episodes that ended for this reason
    ("agent/tool_errors/*", "sum"),  # failed tool calls by kind, and their total
    ("agent/tool_calls_by_name/*", "sum"),  # executed calls per tool
    ("agent/timing_s/*", "sum"),  # seconds summed over episodes
    ("agent/observation_truncated", "sum"),  # observations cut to fit the budget
    ("agent/turns_closed_by_loop", "sum"),  # turns the loop closed for the model
    # wall-clock timers (`rljax.rl.step_metrics.Timer`)
    ("timing_s/*", "sum"),
]


def declare_reduction(pattern: str, reduction: Reduction) -> None:
    """Declare how metrics named like `pattern` (fnmatch) reduce; checked before the
    built-in patterns, so a producer can also refine one of them."""
    if reduction not in get_args(Reduction):
        raise ValueError(f"reduction of {pattern!r}: expected one of {list(get_args(Reduction))}, got {reduction!r}")
    REDUCTIONS.insert(0, (pattern, reduction))


def reduction_of(name: str) -> Reduction:
    """The reduction declared for the metric `name` (first matching pattern of `REDUCTIONS`)."""
    for pattern, reduction in REDUCTIONS:
        if fnmatch.fnmatchcase(name, pattern):
            return reduction
    raise KeyError(f"metric {name!r} declares no reduction (mean, sum, max or min): add it to "
                   "rljax.metrics.REDUCTIONS or call rljax.metrics.declare_reduction")


def reduce_metrics(parts: Sequence[Mapping[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """One metrics dict from the metrics of several parts of a step, each metric by its
    declared reduction (see the module docstring); `weights[i]` is the number of samples
    (or prompts) part i's means are over. Parts of weight 0 are left out. Keys keep their
    first-seen order."""
    if len(parts) != len(weights):
        raise ValueError(f"{len(parts)} metric parts but {len(weights)} weights")
    live = [(part, float(w)) for part, w in zip(parts, weights) if w > 0]
    names = list(dict.fromkeys(name for part, _ in live for name in part))
    out: dict[str, float] = {}
    for name in names:
        values = [(float(part[name]), w) for part, w in live if name in part]
        reduction = reduction_of(name)
        if reduction == "mean":
            out[name] = sum(v * w for v, w in values) / sum(w for _, w in values)
        elif reduction == "sum":
            out[name] = sum(v for v, _ in values)
        elif reduction == "max":
            out[name] = max(v for v, _ in values)
        else:
            out[name] = min(v for v, _ in values)
    return out


__all__ = ["REDUCTIONS", "Reduction", "declare_reduction", "reduce_metrics", "reduction_of"]
