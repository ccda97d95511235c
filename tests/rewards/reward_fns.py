"""Reward functions that misbehave, loaded by path (FileRewardFn) in worker processes."""

import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Dispatch on the response text: the behaviour under test is chosen per item."""
    if solution_str == "raise":
        raise RuntimeError("boom")
    if solution_str == "hang":
        while True:
            time.sleep(1)
    if solution_str == "die":
        os._exit(3)
    if solution_str == "nan":
        return float("nan")
    if solution_str == "-inf":
        return {"score": float("-inf"), "acc": 0.0}
    if solution_str == "1e308":  # finite in float64, inf in float32
        return 1e308
    if solution_str == "unstoppable":  # swallows whatever interrupts it: only killing its process stops it
        while True:
            try:
                time.sleep(1)
            except BaseException:  # noqa: BLE001
                pass
    if solution_str == "nodict":
        return {"acc": 1.0}
    if solution_str.startswith("sleep:"):
        time.sleep(float(solution_str.split(":")[1]))
    bonus = kwargs.get("bonus", 0.0)
    return {"score": float(solution_str == ground_truth) + bonus, "acc": float(solution_str == ground_truth),
            "pid": os.getpid()}
