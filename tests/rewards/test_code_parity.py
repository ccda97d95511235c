"""Code rewards against verl's ``prime_code`` (the reference, used in this test only).

verl's ``verl/utils/reward_score/prime_code/`` (three files: ``__init__``,
``testing_util``, ``utils``; standard library and numpy only, so nothing is stubbed) is
read from the wheel at ``$RLJAX_VERL_WHEEL`` into a temporary folder and imported there
as a package of its own, without the rest of verl. Each generated case
(`tests.rewards.code_cases`) is scored by verl's ``compute_score(completion, ground_truth,
continuous=True)`` (what verl's ``default_compute_score`` calls for these data sources)
and by rljax's registered scorer; the scores must be equal.

Not covered here, and different by design (docs/rewards.md, "Code rewards"): time limits
(verl gives every test 5 s in one process for the all-pass check, then 10 s per test in a
process of its own; rljax runs every test in its own process under one limit), state
shared between the tests of verl's single all-pass run, a module outside the standard
library (verl's process has every installed package, rljax's sandbox only the standard
library), and a call result whose ``==`` is its own (a class instance: verl calls its
``__eq__``, rljax fails it).
"""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from rljax.rewards import get_reward_fn
from rljax.rewards.code import CodeRewardSettings
from rljax.rewards.code_runner import SandboxLimits
from tests.rewards.code_cases import cases

WHEEL = os.environ.get("RLJAX_VERL_WHEEL")
REQUIRE_BWRAP = bool(os.environ.get("CI") or os.environ.get("RLJAX_REQUIRE_BWRAP"))
FILES = ("__init__.py", "testing_util.py", "utils.py")


def _verl_prime_code(folder):
    if not WHEEL or not os.path.isfile(WHEEL):
        return None
    package = folder / "verl_prime_code_reference"
    package.mkdir()
    with zipfile.ZipFile(WHEEL) as z:
        for name in FILES:
            (package / name).write_bytes(z.read(f"verl/utils/reward_score/prime_code/{name}"))
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("verl_prime_code_reference")
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    module = _verl_prime_code(tmp_path_factory.mktemp("verl"))
    if module is None:
        pytest.skip("verl's wheel is absent (`pip download --no-deps verl==0.9.1`, then RLJAX_VERL_WHEEL=<the wheel>)")
    return module


@pytest.mark.slow
def test_code_scores_match_verl_prime_code(verl, capfd):
    all_cases = cases(seed=0)
    assert len(all_cases) >= 200
    settings = CodeRewardSettings(limits=SandboxLimits(os_sandbox="required" if REQUIRE_BWRAP else "auto"))
    fn = get_reward_fn("apps")
    with ThreadPoolExecutor(2) as pool:
        ours = list(pool.map(lambda c: fn("apps", c[1], c[2], None, settings=settings)["score"], all_cases))
    theirs = []
    for name, completion, gt in all_cases:
        score, _ = verl.compute_score(completion, gt, continuous=True)
        theirs.append(float(score))
    capfd.readouterr()  # verl prints its errors
    differ = [(c[0], t, o) for c, t, o in zip(all_cases, theirs, ours) if t != o]
    assert not differ, f"{len(differ)} of {len(all_cases)} differ (name, verl, rljax): {differ}"
    # the cases exercise every outcome: all pass, none pass, and partial scores
    assert {0.0, 1.0} <= set(theirs) and any(0 < s < 1 for s in theirs)
