"""The `rollout:` section of `RLConfig`: how responses are sampled during RL (verl:
`actor_rollout_ref.rollout`). `RLConfig.sampler_config` turns it into the engine's own
`rljax.rollout.config.SamplerConfig` and `RLConfig.sampling_params` into the requests'
`SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from rljax.config import (
    Bounds,
    Devices,
    FieldError,
    NonNegFloat,
    OpenUnitFloat,
    Pages,
    Repeats,
    Rows,
    Seed,
    Tokens,
    UnitFloat,
)
from rljax.rollout.config import Attention
from rljax.train.run_sections import float_dtype_problem

TopK = Annotated[int, Bounds(ge=-1, le=2**24)]  # -1 / 0: off


@dataclass
class ValKwargs:
    """Sampling of the validation responses (verl: `rollout.val_kwargs`)."""

    n: Annotated[int, Bounds(ge=1, le=65536)] = 1  # responses per validation prompt
    temperature: NonNegFloat = 0.0  # 0: greedy
    top_p: OpenUnitFloat = 1.0  # nucleus mass kept; 1: off
    top_k: TopK = 0  # most likely tokens kept; -1 / 0: off


@dataclass
class RolloutConfig:
    """Training-time sampling and the sampler's sizes."""

    n: Annotated[int, Bounds(ge=1, le=65536)] = 4  # responses per prompt (the group of GRPO and relatives)
    temperature: NonNegFloat = 1.0  # softmax temperature (also applied to the trainer's log-probs)
    top_p: OpenUnitFloat = 1.0  # nucleus mass kept; 1: off
    top_k: TopK = 0  # most likely tokens kept; -1 / 0: off
    min_p: UnitFloat = 0.0  # drop tokens below min_p x the top probability; 0: off
    response_length: Tokens = 64  # max sampled tokens per response (verl: data.max_response_length)
    max_num_seqs: Rows = 64  # sequences decoding together (the largest decode batch)
    max_num_batched_tokens: Annotated[int, Bounds(ge=1, le=2**26)] = 2048  # tokens per prefill step (padded rows x chunk length)
    page_size: Tokens = 16  # tokens per KV-cache page
    num_pages: Pages = 0  # pages in the KV pool (page 0 reserved); 0: sized by kv_cache_memory_fraction
    # fraction of free device memory given to the KV pool (verl: gpu_memory_utilization, of total memory)
    kv_cache_memory_fraction: OpenUnitFloat = 0.3
    enable_prefix_caching: bool = True  # reuse cached pages across requests (agent turns)
    # decode steps per sampler call (an on-device loop; a row stops early at its max_tokens): more amortise
    # dispatch and host transfers, fewer hand a finished sequence's slot to a waiting one sooner
    num_scheduler_steps: Repeats = 4
    # running decodes ride along with prefill chunks (new prompts, agent turns) in one call instead of
    # waiting for them; each call then runs num_scheduler_steps decode steps for every row
    mixed_steps: bool = False
    # the sampler's paged attention: auto (the TPU ragged kernel on a TPU, blocked on a CPU, else
    # reference) | reference (jnp gather + mask) | blocked (jnp decode over blocks of pages, up to the
    # longest live row) | pallas (GPU decode kernel) | pallas_tpu (TPU ragged kernel: decode, prefill and
    # mixed steps)
    attention: Attention = "auto"
    # devices per rollout replica (heads / MLP split over them; verl: tensor_model_parallel_size);
    # 0: one sampler on the training mesh and its layout (no hand-off, zero copy)
    tensor_parallel_size: Devices = 0
    # rollout replicas, each with its own weights, KV pool and scheduler; 0: devices / tensor_parallel_size
    data_parallel_size: Devices = 0
    allow_cross_host_replicas: bool = False  # let one replica span processes (its scheduler then runs in lock-step)
    # same-shaped replicas in a process compile each program once and load it onto their own devices
    # (CPU, GPU; on a TPU an executable is compiled for its chips, so each replica compiles its own)
    share_programs: bool = True
    # dtype the replicas hold the weights in, cast inside the hand-off (bfloat16: half the bytes moved and
    # held); null: the model's compute_dtype. Not used at tensor_parallel_size 0 (the trainer's arrays as they are)
    weight_dtype: str | None = None
    seed: Seed = 0  # seed of every request (streams by step and prompt: rljax.rl.scoring)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)  # validation sampling

    def check(self) -> None:
        if self.data_parallel_size and not self.tensor_parallel_size:
            raise FieldError("data_parallel_size", "needs rollout.tensor_parallel_size >= 1 (0 samples on the "
                             "training mesh, one replica)")
        if self.weight_dtype is not None and (problem := float_dtype_problem(self.weight_dtype)):
            raise FieldError("weight_dtype", problem)
        if self.num_pages == 1:
            raise FieldError("num_pages", "0 (automatic) or >= 2 (page 0 is reserved), got 1")
