"""The `reward:` section of `RLConfig`: the rule rewards and how they run, DAPO's overlong
shaping, a custom function, and the model rewards (a reward model, a generative
verifier) added to or replacing them (verl: `reward_model`, `custom_reward_function`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from rljax.config import (
    Bounds,
    FieldError,
    NonNegFloat,
    NonNegSteps,
    NonNegTokens,
    OpenUnitFloat,
    Pages,
    PositiveFloat,
    PositiveInt,
    Rows,
    Threads,
    Tokens,
)
from rljax.train.run_sections import float_dtype_problem


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl: `reward_model.overlong_buffer`)."""

    enable: bool = False  # penalise responses that reach into the last `len` tokens of the budget
    len: Tokens = 16  # tokens of the buffer, at most rollout.response_length
    penalty_factor: NonNegFloat = 1.0  # the penalty at the full budget (linear from 0 over the buffer)


@dataclass
class CustomRewardFunction:
    """verl's `custom_reward_function`: the function `name` of the Python file `path`,
    called with `reward_kwargs` added to every call (`rljax.rewards.custom`)."""

    path: str = ""  # a Python file; empty: no custom function (the built-in scorers by data_source)
    name: str = "compute_score"  # the function in it
    reward_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments added to every call

    def check(self) -> None:
        if self.reward_kwargs and not self.path:
            raise FieldError("reward_kwargs", "set, but custom_reward_function.path is empty (no custom function)")
        if self.path and not os.path.isfile(os.path.expanduser(self.path)):
            raise FieldError("path", f"no such file {self.path!r}")


def check_model_dir(section, name: str = "path") -> None:
    """An enabled model section's folder must be there (checked again when it is loaded)."""
    path = getattr(section, name)
    if not section.enable or path == "policy":
        return
    if not path:
        raise FieldError(name, "required when enabled (an HF folder)")
    if not os.path.isdir(path):
        raise FieldError(name, f"no such directory {path!r}")


@dataclass
class RewardModelConfig:
    """A trained reward model as the reward (verl's `reward_model.enable`): an HF
    `*ForSequenceClassification` folder with one label (what `rljax export` writes for
    an `rm` run) scores the exact `prompt + response` token ids of every sample.

    `combine`: `replace` (the RM score times `weight` is the reward; rule-based scores
    are still computed where a rule applies, for their metrics) or `add` (rule score +
    `weight` x RM score). Where no rule reward applies (a data_source with no registered
    function and no custom function) the rule score counts as 0 instead of an error."""

    enable: bool = False  # score with the reward model
    path: str = ""  # HF folder of the exported reward model
    dtype: str = "float32"  # parameter and compute dtype
    batch_size: Rows = 16  # rows per forward (padded up to it; lengths to powers of two)
    combine: Literal["replace", "add"] = "replace"  # the RM score replaces the rule score | is added to it
    weight: float = 1.0  # multiplies the RM score

    def check(self) -> None:
        check_model_dir(self)
        problem = float_dtype_problem(self.dtype)
        if problem:
            raise FieldError("dtype", problem)


@dataclass
class VerifierConfig:
    """A generative verifier as the reward: a causal LM grades each (question, response,
    ground truth) with greedy decoding in rljax's sampler; the parsed verdict is the score
    (`rljax.rewards.verifier`). Applied after the reward model, combined the same way.

    `path`: an HF causal-LM folder, or `policy` (the current policy grades itself).
    Tokenizer: the folder's own if it has one, else the policy's."""

    enable: bool = False  # grade with the verifier
    path: str = "policy"  # HF causal-LM folder, or "policy"
    dtype: str = "float32"  # parameter and compute dtype
    prompt_template: str = ""  # str.format over {question} {answer} {ground_truth}; "": the default
    system_prompt: str = ""  # the grading conversation's system message; "": none
    parse: Literal["yes_no", "score"] = "yes_no"  # Yes/No -> 1/0 | "Score: x" in [0, 1]
    failure_score: float = 0.0  # an unparseable verdict (counted in verifier/parse_failures)
    max_tokens: Tokens = 32  # verdict length
    max_model_len: NonNegTokens = 0  # grading prompt + verdict; 0: data.max_prompt_length + rollout.response_length + 512
    max_num_seqs: Rows = 64  # grading sequences decoding together
    num_pages: Pages = 0  # KV pages of its sampler; 0: sized by kv_cache_memory_fraction
    kv_cache_memory_fraction: OpenUnitFloat = 0.1  # fraction of free device memory for its KV pool
    combine: Literal["replace", "add"] = "replace"  # the verdict replaces the score so far | is added to it
    weight: float = 1.0  # multiplies the verdict

    def check(self) -> None:
        check_model_dir(self)
        problem = float_dtype_problem(self.dtype)
        if problem:
            raise FieldError("dtype", problem)
        if self.num_pages == 1:
            raise FieldError("num_pages", "0 (automatic) or >= 2 (page 0 is reserved), got 1")


@dataclass
class CodeSandboxConfig:
    """How the code data sources (`codecontests`, `apps`, `codeforces`, `taco`) run their
    tests in rljax's OS sandbox (`rljax.rewards.code`): one sandbox per sample, each test
    in a process of its own. A sample's reward call must fit in `reward.timeout_s`, so keep
    `sample_timeout_s` below it."""

    test_timeout_s: PositiveFloat = 5.0  # wall-clock (and CPU) seconds of one test; past it the test fails
    memory_mb: PositiveInt = 512  # address space (RLIMIT_AS) of one test's process, MiB
    sample_timeout_s: PositiveFloat = 8.0  # wall clock of all of one sample's tests; tests not run by then fail
    max_output_bytes: PositiveInt = 1 << 20  # what one test may print (or return); more fails the test
    continuous: bool = True  # not all passed: the share of the first ten tests that pass (verl's default) | 0


@dataclass
class SandboxFusionConfig:
    """A SandboxFusion server that runs the code data sources' tests instead of the OS
    sandbox (verl's `sandbox_fusion_url`): one request per test, verl's `sandbox_fusion`
    semantics (`rljax.rewards.code`)."""

    url: str = ""  # http://host:port (or its /run_code endpoint); empty: tests run in the OS sandbox
    max_concurrency: Threads = 16  # requests in flight at once per reward worker process
    max_retries: Annotated[int, Bounds(ge=0, le=100)] = 2  # retries of a refused connection or HTTP 429/502/503/504
    retry_backoff_s: NonNegFloat = 0.5  # first retry delay, doubled at each retry
    run_timeout_s: PositiveFloat = 10.0  # the server's run_timeout and compile_timeout per test
    memory_limit_mb: PositiveInt = 1024  # the server's memory_limit_MB per test

    def check(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise FieldError("url", f"must start with http:// or https://, got {self.url!r}")


@dataclass
class RewardConfig:
    """How rule rewards are computed (`rljax.rewards.manager.RewardManager`).

    `mode`: `process` runs every reward function in worker processes (a call running past
    `timeout_s` is interrupted in its worker, or the worker killed a second later; a crash
    is a failure); `inline` runs the built-in scorers in the trainer's process (faster;
    `timeout_s` is enforced there with SIGALRM), while a custom function still runs in
    worker processes unless `trust_custom_reward` is true.
    `on_error`: what a failed sample (an exception, a timeout, a dead worker) becomes:
    `zero` scores it 0, counted in `reward/errors` / `reward/timeouts`, one line for the
    first failure of a batch; `fail` stops the run at the first failure with one line
    naming the function and the sample. A reward not finite in float32 (nan, inf, 1e308)
    always stops the run.
    `max_consecutive_failed_steps`: with `on_error: zero`, a reward that fails on every
    sample of that many batches in a row stops the run with an error naming the function
    (0: never)."""

    custom_reward_function: CustomRewardFunction = field(default_factory=CustomRewardFunction)  # verl's key
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # DAPO's overlong shaping
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)  # a trained reward model
    verifier: VerifierConfig = field(default_factory=VerifierConfig)  # a generative verifier
    code: CodeSandboxConfig = field(default_factory=CodeSandboxConfig)  # limits of the code data sources' tests
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)  # code tests on a server instead
    mode: Literal["process", "inline"] = "process"  # where reward functions run (see above)
    timeout_s: PositiveFloat = 10.0  # seconds one reward call may take
    num_workers: Threads = 2  # worker processes (mode=process, or a custom function)
    trust_custom_reward: bool = False  # inline mode: run the custom function in the trainer's process too
    max_consecutive_failed_steps: NonNegSteps = 3  # batches in a row where a reward fails on every sample; 0: never stop
    on_error: Literal["zero", "fail"] = "zero"  # a failed sample (error, timeout) scores 0 and is counted | stops the run

    def check(self) -> None:
        if self.trust_custom_reward and self.mode != "inline":
            raise FieldError("trust_custom_reward", f"only with reward.mode=inline (mode is {self.mode!r}, "
                                                    "where every function runs in worker processes)")
