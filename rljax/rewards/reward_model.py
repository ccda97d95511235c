"""A reward model as the reward: scores of ``prompt + response`` token sequences.

`RewardModelScorer` is the interface the RL loop uses; `ScalarHeadScorer` implements it
with `rljax.models.heads.ScalarHeadModel` (a decoder plus a linear score head read at the
last real token, HF's ``*ForSequenceClassification`` with one label).

Sequences are sorted by length, cut into batches of `batch_size` rows, right-padded to the
smallest bucket length that fits (rows padded up to `batch_size` too), and run through one
jitted forward, so a run compiles at most one program per bucket. The model is split into
graph and state once; `update_params` swaps in new weights (e.g. a trained RM) without
recompiling.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from rljax.data.batching import pick_bucket

DEFAULT_BUCKETS: tuple[int, ...] = tuple(2**i for i in range(5, 17))  # 32 .. 65536


@runtime_checkable
class RewardModelScorer(Protocol):
    """Anything that scores token sequences: ``score(sequences) -> float32 [N]``."""

    def score(self, sequences: Sequence[Sequence[int]]) -> np.ndarray: ...


class ScalarHeadScorer:
    """`RewardModelScorer` over a `ScalarHeadModel`.

    `tokenizer` (optional) supplies the pad id and lets `score_texts` / `score_messages`
    tokenize; without it pass `pad_id`. The pad id only fills masked positions, so any id
    in the vocabulary gives the same scores.
    """

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any = None,
        *,
        pad_id: int | None = None,
        batch_size: int = 8,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pad_id is None:
            pad_id = getattr(tokenizer, "pad_token_id", None)
            if pad_id is None:
                pad_id = getattr(tokenizer, "eos_token_id", None)
        self.pad_id = int(pad_id or 0)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self._graphdef, self._state = nnx.split(model)
        graphdef = self._graphdef
        self._traces = 0

        def forward(state, input_ids, attention_mask):
            self._traces += 1  # runs once per trace, i.e. per compiled shape
            return nnx.merge(graphdef, state)(input_ids, attention_mask)

        self._forward = jax.jit(forward)

    def update_params(self, model_or_state: nnx.Module | nnx.State) -> None:
        """Score with new weights of the same architecture from now on."""
        self._state = nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) else model_or_state

    @property
    def num_compiled_programs(self) -> int:
        return self._traces

    def score(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """One float32 score per token sequence (prompt + response ids)."""
        seqs = [np.asarray(s, dtype=np.int32).reshape(-1) for s in sequences]
        for i, s in enumerate(seqs):
            if s.size == 0:
                raise ValueError(f"reward model: sequence {i} is empty")
        scores = np.zeros(len(seqs), dtype=np.float32)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            length = pick_bucket(max(len(seqs[i]) for i in rows), self.buckets)
            ids = np.full((self.batch_size, length), self.pad_id, dtype=np.int32)
            mask = np.zeros((self.batch_size, length), dtype=np.int32)
            for r, i in enumerate(rows):
                ids[r, : len(seqs[i])] = seqs[i]
                mask[r, : len(seqs[i])] = 1
            out = self._forward(self._state, ids, mask)
            if not out.is_fully_addressable:  # a model spanning processes: every process gets every score
                out = multihost_utils.process_allgather(out, tiled=True)
            out = np.asarray(jax.device_get(out), dtype=np.float32)
            scores[rows] = out[: len(rows)]
        return scores

    def score_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Score already-rendered texts (tokenized without adding special tokens)."""
        self._need_tokenizer()
        return self.score([self.tokenizer.encode(t, add_special_tokens=False) for t in texts])

    def score_messages(self, conversations: Sequence[list[dict[str, Any]]], **chat_template_kwargs: Any) -> np.ndarray:
        """Score chats rendered with the tokenizer's chat template (e.g. a policy's
        response re-rendered for an RM with a different tokenizer)."""
        self._need_tokenizer()
        texts = [
            self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=False, **chat_template_kwargs)
            for c in conversations
        ]
        return self.score_texts(texts)

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ValueError("this ScalarHeadScorer has no tokenizer; pass token ids to score()")
