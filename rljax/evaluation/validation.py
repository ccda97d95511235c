"""Validation metrics from per-sample records, named as verl names them.

A record is one sampled response::

    {"data_source": str, "prompt_index": hashable, "score": float,
     "pred": str | None,          # extracted final answer (optional)
     "acc": float, ...}           # any other numeric fields (optional)

Variables: ``reward`` (the score) and every other numeric field (``acc``, ...). When a
record has no ``pred`` but has ``solution_str``, the answer extractor registered for its
data source (`rljax.rewards.get_answer_extractor`) supplies it.

Per prompt with n samples and per variable, with ``ks = [2, 4, 8, ..., n]`` (powers of two
below n, then n; verl's choice):

* ``mean@n``, ``std@n`` (population std, n > 1);
* ``best@k/mean``, ``worst@k/mean``: expected max / min over random k-subsets (exact,
  `expected_max_at_k`; verl bootstraps with replacement instead);
* ``maj@k/mean``: majority vote over ``pred`` (`maj_at_k`), when the prompt has preds;
* ``pass@k`` for k in ``[1] + ks``: the unbiased estimator (`pass_at_k`), for 0/1 variables.

Each metric is averaged over the prompts of a data source and reported as
``{section}/{data_source}/{variable}/{metric}``. As in verl's ``_validate``, the section is
``val-core`` for the core variable (``acc`` if present, else ``reward``) and the metrics
``mean@n_max``, ``maj@n_max/mean``, ``best@n_max/mean`` (and our ``pass@n_max``), where
n_max is the largest n of that variable; everything else is ``val-aux``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from numbers import Real
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from rljax.evaluation.pass_at_k import expected_max_at_k, expected_min_at_k, pass_at_k
from rljax.evaluation.voting import maj_at_k

RESERVED_KEYS = frozenset({"data_source", "prompt_index", "score", "pred", "solution_str", "ground_truth", "extra_info"})
CORE_PREFIXES = ("mean", "maj", "best", "pass")


def sample_sizes(n: int) -> list[int]:
    """verl's k values for n samples: 2, 4, 8, ... (< n), then n."""
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n > 1 else []


def _is_binary(values: np.ndarray) -> bool:
    return bool(np.isin(values, (0.0, 1.0)).all())


def prompt_metrics(
    values: Iterable[float], preds: list[Hashable | None] | None = None, *, n_resamples: int = 1000, seed: int = 0
) -> dict[str, float]:
    """The metrics of one variable over one prompt's n samples (see the module docstring)."""
    v = np.asarray(list(values), dtype=np.float64)
    n = v.size
    if n == 0:
        return {}
    out: dict[str, float] = {f"mean@{n}": float(v.mean())}
    binary = _is_binary(v)
    if binary:
        out["pass@1"] = pass_at_k(n, int(v.sum()), 1)
    if n > 1:
        out[f"std@{n}"] = float(v.std())
    for k in sample_sizes(n):
        out[f"best@{k}/mean"] = expected_max_at_k(v, k)
        out[f"worst@{k}/mean"] = expected_min_at_k(v, k)
        if preds is not None:
            out[f"maj@{k}/mean"] = maj_at_k(preds, v, k, n_resamples=n_resamples, seed=seed)
        if binary:
            out[f"pass@{k}"] = pass_at_k(n, int(v.sum()), k)
    return out


def _metric_n(name: str) -> int:
    return int(name.split("@")[-1].split("/")[0])


def _numeric(value: Any) -> bool:
    return isinstance(value, (Real, np.number, bool, np.bool_)) and math.isfinite(float(value))


def _pred_of(record: Mapping[str, Any], extract_answers: bool) -> tuple[bool, Hashable | None]:
    if "pred" in record:
        return True, record["pred"]
    if extract_answers and "solution_str" in record:
        from rljax.rewards import get_answer_extractor

        extractor = get_answer_extractor(str(record["data_source"]))
        if extractor is not None:
            return True, extractor(str(record["solution_str"]))
    return False, None


def validation_metrics(
    records: Iterable[Mapping[str, Any]],
    *,
    extract_answers: bool = True,
    missing_value: float | None = 0.0,
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """Flat ``{"val-core/<ds>/acc/mean@n": ..., ...}`` (see the module docstring).

    A numeric field that some records of a data source lack (or hold as None / NaN) —
    typically ``acc`` of a sample whose reward function failed or timed out — counts as
    `missing_value` (0.0: a failed sample is not correct); ``missing_value=None`` raises
    instead.
    """
    records = list(records)
    by_source: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for i, r in enumerate(records):
        for key in ("data_source", "prompt_index", "score"):
            if key not in r:
                raise ValueError(f"validation record {i} lacks {key!r}; it has {sorted(r)}")
        by_source[str(r["data_source"])].append(r)

    metrics: dict[str, float] = {}
    for ds, rows in by_source.items():
        fields = sorted({str(k) for r in rows for k, v in r.items() if k not in RESERVED_KEYS and _numeric(v)})
        # prompt -> variable -> values, and prompt -> preds
        values: dict[Hashable, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        preds: dict[Hashable, list[Hashable | None]] = defaultdict(list)
        has_pred: dict[Hashable, bool] = defaultdict(bool)
        for r in rows:
            prompt = r["prompt_index"]
            values[prompt]["reward"].append(float(r["score"]))
            for key in fields:
                value = r.get(key)
                if _numeric(value):
                    values[prompt][key].append(float(value))
                elif missing_value is None:
                    raise ValueError(f"data_source {ds!r}, prompt {prompt!r}: a record lacks numeric field {key!r}")
                else:
                    values[prompt][key].append(float(missing_value))
            found, pred = _pred_of(r, extract_answers)
            preds[prompt].append(pred)
            has_pred[prompt] = has_pred[prompt] or found

        per_metric: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for prompt, variables in values.items():
            prompt_preds = preds[prompt] if has_pred[prompt] else None
            for var, vals in variables.items():
                for name, value in prompt_metrics(vals, prompt_preds, n_resamples=n_resamples, seed=seed).items():
                    per_metric[var][name].append(value)
        core_var = "acc" if "acc" in per_metric else "reward"
        for var, names in per_metric.items():
            n_max = max(_metric_n(name) for name in names)
            for name, vals in names.items():
                core = var == core_var and name.startswith(CORE_PREFIXES) and _metric_n(name) == n_max
                metrics[f"{'val-core' if core else 'val-aux'}/{ds}/{var}/{name}"] = float(np.mean(vals))
    return dict(sorted(metrics.items()))
