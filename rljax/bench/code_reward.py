"""`rljax bench code-reward`: code-reward throughput, samples scored per second.

A batch of `--samples` responses to one stdin problem (the sum of two integers, `--tests`
test cases): half right, a quarter wrong, a quarter hostile (in turn: an infinite loop, a
fork bomb, a memory hog, a stdout flood). The batch is scored through a `RewardManager`
(`--workers` worker processes; each sample's tests in rljax's OS sandbox, with
`--test-timeout`, `--memory-mb` and `--sample-timeout` as its limits), timed from the
call to the last score. Reports samples/s for the whole batch and for each kind alone
(the mean seconds one sample of that kind occupies a worker), and checks every score: a
right answer 1.0, any other 0.0.
"""

from __future__ import annotations

import json
import time

HELP = "Code-reward throughput: samples/s on a batch of right, wrong and hostile answers in the OS sandbox."

RIGHT = "a, b = map(int, input().split())\nprint(a + b)"
WRONG = "a, b = map(int, input().split())\nprint(a - b)"
HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "memory_hog": "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))",
    "stdout_flood": "while True:\n    print('x' * 1000)",
}


def add_arguments(p) -> None:
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--tests", type=int, default=5, help="test cases per sample")
    p.add_argument("--workers", type=int, default=2, help="reward worker processes")
    p.add_argument("--test-timeout", type=float, default=1.0, help="seconds per test")
    p.add_argument("--sample-timeout", type=float, default=3.0, help="seconds per sample, all tests")
    p.add_argument("--memory-mb", type=int, default=256, help="address space per test, MiB")
    p.add_argument("--os-sandbox", default="auto", choices=("auto", "required", "off"))
    p.add_argument("--out", default="bench_results/code_reward.json")


def make_items(kinds: list[str], tests: int) -> list[dict]:
    """Reward items answering with the code of each kind."""
    gt = json.dumps({"inputs": [f"{k} {2 * k + 1}\n" for k in range(tests)],
                     "outputs": [f"{3 * k + 1}\n" for k in range(tests)]})
    code = {"right": RIGHT, "wrong": WRONG, **HOSTILE}
    return [{"data_source": "codecontests", "solution_str": f"```python\n{code[k]}\n```", "ground_truth": gt}
            for k in kinds]


def make_batch(samples: int, tests: int) -> tuple[list[dict], list[str]]:
    """(reward items, kind of each): half right, a quarter wrong, a quarter hostile."""
    hostile = list(HOSTILE)
    kinds = []
    for i in range(samples):
        q = i % 4
        kinds.append("right" if q < 2 else "wrong" if q == 2 else hostile[(i // 4) % len(hostile)])
    return make_items(kinds, tests), kinds


def main(args) -> int:
    from rljax.bench.report import print_table, write_json
    from rljax.rewards import RewardManager
    from rljax.rewards.code import CodeRewardSettings
    from rljax.rewards.code_runner import SandboxLimits

    limits = SandboxLimits(test_timeout_s=args.test_timeout, memory_mb=args.memory_mb,
                           sample_timeout_s=args.sample_timeout, os_sandbox=args.os_sandbox)
    items, kinds = make_batch(args.samples, args.tests)
    rows = []
    with RewardManager(num_workers=args.workers, timeout_s=args.sample_timeout + 10.0,
                       code_settings=CodeRewardSettings(limits=limits)) as manager:
        manager.score(items[:args.workers])  # the sandbox's probe, once per worker
        t0 = time.perf_counter()
        result = manager.score(items)
        seconds = time.perf_counter() - t0
        wrong = [i for i, (k, s) in enumerate(zip(kinds, result.scores)) if float(s) != (1.0 if k == "right" else 0.0)]
        rows.append({"batch": f"all ({args.samples})", "samples": args.samples, "seconds": seconds,
                     "samples_per_s": args.samples / seconds})
        for kind in ["right", "wrong", *HOSTILE]:
            part = make_items([kind] * max(2 * args.workers, 4), args.tests)
            t0 = time.perf_counter()
            manager.score(part)
            dt = time.perf_counter() - t0
            rows.append({"batch": kind, "samples": len(part), "seconds": dt, "samples_per_s": len(part) / dt,
                         "worker_s_per_sample": dt * args.workers / len(part)})
    print_table(rows, ["batch", "samples", "seconds", "samples_per_s", "worker_s_per_sample"])
    write_json(args.out, "code_reward", rows, {"workers": args.workers, "tests": args.tests,
                                               "limits": limits.__dict__, "misscored": wrong})
    if wrong:
        print(f"{len(wrong)} samples scored wrongly: {wrong[:10]}")
        return 1
    return 0
