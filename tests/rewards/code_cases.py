"""Generated code-reward cases: (completion, ground truth) pairs covering right, wrong,
partially right, crashing, float-tolerance, whitespace and call-based (``fn_name``)
answers, for the parity test against verl's ``prime_code`` and for the benchmark.

`cases(seed)` builds every problem's tests from `random.Random(seed)` and pairs each
with all of its completions; the expected score is never given here (the parity test
asks verl).
"""

from __future__ import annotations

import json
import random


def fence(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code.strip()}\n```\nDone."


# ---- stdin / stdout problems ------------------------------------------------------------------

SUM = {
    "right": "a, b = map(int, input().split())\nprint(a + b)",
    "stdin_read": "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
    "main_guard": "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
                  "if __name__ == \"__main__\":\n    main()",
    "sys_exit": "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)",
    "module_stdin": "a, b = map(int, stdin.readline().split())\nprint(a + b)",
    "iterate_stdin": "import sys\nfor line in sys.stdin:\n    a, b = map(int, line.split())\n    print(a + b)",
    "trailing_space": "a, b = map(int, input().split())\nprint(str(a + b) + '   ')",
    "wrong": "a, b = map(int, input().split())\nprint(a * b)",
    "partial": "a, b = map(int, input().split())\nprint(a + b if a < 50 else a - b)",
    "crash": "a, b = map(int, input().split())\nraise ValueError('no')",
    "syntax_error": "a, b = map(int, input().split()\nprint(a + b)",
    "exit_builtin": "a, b = map(int, input().split())\nprint(a + b)\nexit()",
    "stdout_name": "from sys import stdout\na, b = map(int, input().split())\nstdout.write(str(a + b) + '\\n')",
    "stderr_only": "import sys\na, b = map(int, input().split())\nprint(a + b, file=sys.stderr)",
    "open_zero": "a, b = map(int, open(0).read().split())\nprint(a + b)",
    "global_stmt": "total = 0\ndef add(x):\n    global total\n    total += x\na, b = map(int, input().split())\nadd(a)\nadd(b)\nprint(total)",
    "name_error": "a, b = map(int, input().split())\nprint(c)",
}


def sum_tests(rng: random.Random, n: int) -> dict:
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n)]
    return {"inputs": [f"{a} {b}\n" for a, b in pairs], "outputs": [f"{a + b}\n" for a, b in pairs]}


DIVIDE = {
    "ten_digits": "a, b = map(int, input().split())\nprint(f'{a / b:.10f}')",
    "six_digits": "a, b = map(int, input().split())\nprint(f'{a / b:.6f}')",
    "two_digits": "a, b = map(int, input().split())\nprint(f'{a / b:.2f}')",
    "repr": "a, b = map(int, input().split())\nprint(a / b)",
    "floor": "a, b = map(int, input().split())\nprint(a // b)",
    "pair_coarse": "a, b = map(int, input().split())\nprint(f'{a / b:.6f} {b / a:.6f}')",
    "pair_exact": "a, b = map(int, input().split())\nprint(f'{a / b:.10f} {b / a:.10f}')",
    "negative": "a, b = map(int, input().split())\nprint(f'{-a / b:.7f}')",
}


def divide_tests(rng: random.Random, n: int, pair: bool = False, negative: bool = False) -> dict:
    pairs = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(n)]

    def out(a, b):
        if pair:
            return f"{a / b:.10f} {b / a:.10f}\n"
        return f"{(-a if negative else a) / b:.10f}\n"

    return {"inputs": [f"{a} {b}\n" for a, b in pairs], "outputs": [out(a, b) for a, b in pairs]}


LINES = {
    "right": "n = int(input())\nfor i in range(1, n + 1):\n    print(i)",
    "one_line": "n = int(input())\nprint(*range(1, n + 1))",
    "trailing_spaces": "n = int(input())\nfor i in range(1, n + 1):\n    print(str(i) + '  ')",
    "leading_spaces": "n = int(input())\nfor i in range(1, n + 1):\n    print('  ' + str(i))",
    "blank_lines": "n = int(input())\nfor i in range(1, n + 1):\n    print(i)\n    print()",
    "crlf": "import sys\nn = int(input())\nsys.stdout.write(''.join(f'{i}\\r\\n' for i in range(1, n + 1)))",
    "missing_last": "n = int(input())\nfor i in range(1, n):\n    print(i)",
    "joined_list": "n = int(input())\nprint('\\n'.join(map(str, range(1, n + 1))), end='')",
}


def lines_tests(rng: random.Random, n: int, blank_expected: bool = False) -> dict:
    ks = [rng.randint(1, 6) for _ in range(n)]
    sep = "\n\n" if blank_expected else "\n"
    return {"inputs": [f"{k}\n" for k in ks], "outputs": [sep.join(str(i) for i in range(1, k + 1)) + "\n" for k in ks]}


WORDS = {
    "right": "print(' '.join(input().split()[::-1]))",
    "double_space": "print('  '.join(input().split()[::-1]))",
    "not_reversed": "print(' '.join(input().split()))",
    "as_list_output": "print(input().split()[::-1])",
}


def words_tests(rng: random.Random, n: int) -> dict:
    words = ["ab", "cd", "ef", "gh", "ij", "kl"]
    rows = [[rng.choice(words) for _ in range(rng.randint(2, 4))] for _ in range(n)]
    return {"inputs": [" ".join(r) + "\n" for r in rows], "outputs": [" ".join(r[::-1]) + "\n" for r in rows]}


# ---- call-based problems -----------------------------------------------------------------------

ADD = {
    "right": "def add(a, b):\n    return a + b",
    "solution_class": "class Solution:\n    def add(self, a, b):\n        return a + b",
    "as_float": "def add(a, b):\n    return float(a + b)",
    "as_string": "def add(a, b):\n    return str(a + b)",
    "wrong": "def add(a, b):\n    return a - b",
    "partial": "def add(a, b):\n    return a + b if a % 2 == 0 else 0",
    "raises": "def add(a, b):\n    raise RuntimeError('x')",
    "missing": "def plus(a, b):\n    return a + b",
    "as_tuple": "def add(a, b):\n    return (a + b,)",
    # wrong as a call; as a program on the input lines (verl's per-test runs) it prints the sum
    "partial_prints": "import sys\ndef add(a, b):\n    return a + b if a % 2 == 0 else 0\n"
                      "xs = [int(t) for t in sys.stdin.read().split()]\nif xs:\n    print(sum(xs) if xs[0] < 40 else 0)",
}


def add_tests(rng: random.Random, n: int) -> dict:
    pairs = [(rng.randint(0, 50), rng.randint(0, 50)) for _ in range(n)]
    return {"fn_name": "add", "inputs": [f"{a}\n{b}" for a, b in pairs], "outputs": [json.dumps(a + b) for a, b in pairs]}


SORT = {
    "right": "def srt(xs):\n    return sorted(xs)",
    "tuple": "def srt(xs):\n    return tuple(sorted(xs))",
    "set": "def srt(xs):\n    return set(xs)",
    "reversed": "def srt(xs):\n    return sorted(xs, reverse=True)",
    "in_place_none": "def srt(xs):\n    xs.sort()",
    "wrapped": "def srt(xs):\n    return [sorted(xs)]",
}


def sort_tests(rng: random.Random, n: int, wrap: bool = False) -> dict:
    lists = [[rng.randint(0, 9) for _ in range(rng.randint(1, 5))] for _ in range(n)]
    outs = [json.dumps([sorted(xs)] if wrap else sorted(xs)) for xs in lists]
    return {"fn_name": "srt", "inputs": [json.dumps(xs) for xs in lists], "outputs": outs}


PAIRS = {
    "lists": "def pairs(n):\n    return [[i, i + 1] for i in range(n)]",
    "tuples": "def pairs(n):\n    return [(i, i + 1) for i in range(n)]",
}


def pairs_tests(rng: random.Random, n: int, wrap: bool) -> dict:
    ks = [rng.randint(1, 4) for _ in range(n)]
    outs = [json.dumps([[[i, i + 1] for i in range(k)]] if wrap else [[i, i + 1] for i in range(k)]) for k in ks]
    return {"fn_name": "pairs", "inputs": [str(k) for k in ks], "outputs": outs}


COUNT = {
    "int_keys": "def count(xs):\n    out = {}\n    for x in xs:\n        out[x] = out.get(x, 0) + 1\n    return out",
    "str_keys": "def count(xs):\n    out = {}\n    for x in xs:\n        out[str(x)] = out.get(str(x), 0) + 1\n    return out",
    "counter": "from collections import Counter\ndef count(xs):\n    return Counter(xs)",
    "list_of_dict": "def count(xs):\n    out = {}\n    for x in xs:\n        out[x] = out.get(x, 0) + 1\n    return [out]",
}


def count_tests(rng: random.Random, n: int) -> dict:
    lists = [[rng.randint(1, 3) for _ in range(rng.randint(1, 5))] for _ in range(n)]
    outs = []
    for xs in lists:
        c: dict = {}
        for x in xs:
            c[str(x)] = c.get(str(x), 0) + 1
        outs.append(json.dumps(c))
    return {"fn_name": "count", "inputs": [json.dumps(xs) for xs in lists], "outputs": outs}


# ---- more than ten tests ----------------------------------------------------------------------

MANY = {
    "right": "n = int(input())\nprint(n * n)",
    "fails_eleventh": "n = int(input())\nprint(n * n if n != 1010 else 0)",
    "fails_first_and_eleventh": "n = int(input())\nprint(n * n if n not in (1000, 1010) else 0)",
    "fails_even": "n = int(input())\nprint(n * n if n % 2 else -1)",
}


def many_tests() -> dict:
    ns = list(range(1000, 1012))
    return {"inputs": [f"{k}\n" for k in ns], "outputs": [f"{k * k}\n" for k in ns]}


def cases(seed: int = 0) -> list[tuple[str, str, object]]:
    """(name, completion, ground truth) for every problem instance and completion."""
    rng = random.Random(seed)
    out: list[tuple[str, str, object]] = []

    def add(prefix, completions, gt, as_json=True):
        for name, code in completions.items():
            out.append((f"{prefix}/{name}", fence(code), json.dumps(gt) if as_json else gt))

    for k in range(4):
        add(f"sum{k}", SUM, sum_tests(rng, 3), as_json=k % 2 == 0)
        add(f"divide{k}", {n: c for n, c in DIVIDE.items() if not n.startswith(("pair", "negative"))},
            divide_tests(rng, 3))
        add(f"lines{k}", LINES, lines_tests(rng, 3, blank_expected=k == 2))
        add(f"words{k}", WORDS, words_tests(rng, 3))
        add(f"add{k}", ADD, add_tests(rng, 3))
        add(f"sort{k}", SORT, sort_tests(rng, 3, wrap=k == 2))
    add("divide_pair", {n: c for n, c in DIVIDE.items() if n.startswith("pair")}, divide_tests(rng, 3, pair=True))
    add("divide_negative", {"negative": DIVIDE["negative"]}, divide_tests(rng, 3, negative=True))
    add("pairs", PAIRS, pairs_tests(rng, 3, wrap=False))
    add("pairs_wrapped", PAIRS, pairs_tests(rng, 3, wrap=True))
    add("count", COUNT, count_tests(rng, 3))
    add("many", MANY, many_tests())
    # format variants of one right answer
    sum_gt = json.dumps(sum_tests(rng, 2))
    right = SUM["right"]
    out += [
        ("format/no_fence", right, sum_gt),
        ("format/plain_fence", fence(right, tag=""), sum_gt),
        ("format/two_blocks_last_right", fence(SUM["wrong"]) + "\nBetter:\n" + fence(right), sum_gt),
        ("format/two_blocks_last_wrong", fence(right) + "\nOr:\n" + fence(SUM["wrong"]), sum_gt),
        ("format/unclosed", "```python\n" + right + "\n", sum_gt),
        ("format/empty", "", sum_gt),
    ]
    return out
