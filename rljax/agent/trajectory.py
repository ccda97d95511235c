"""Token-in-token-out trajectories and their packing into training arrays.

One `TrajectoryBuilder` per episode owns the episode's token buffer:

- ``prompt_ids``: the rendered initial prompt, tokenized once;
- ``response_ids``: everything after the prompt, in order: sampled tokens exactly as the
  sampler returned them (``response_mask`` 1, ``rollout_log_probs`` = sampling log_prob) and
  observation deltas (tool results, user/environment turns, and any end-of-turn token the
  loop had to add), tokenized once from the chat template (mask 0, log_prob 0.0).

Nothing appended is ever decoded and re-encoded. `segments` records each appended span
(``"sampled"`` or ``"observation"``) so tests and debuggers can check every boundary.

Routing replay (mixture-of-experts, `actor.router_replay`): when the sampler records
routing, each turn's record (`TurnRouting`: the turn's prompt + sampled tokens and their
experts ``[len, L, k]``) is kept, and `stitch_routing` builds the trajectory's
``expert_ids`` ``[len(input_ids), L, k]``: every position takes the record of the earliest
turn that computed it (-1 where none did).

`pack_trajectories` turns many trajectories into right-padded numpy arrays following the data
contract of docs/design.md: ``input_ids = prompt_ids + response_ids``, and at every position t
``response_mask[t]`` / ``rollout_log_probs[t]`` describe ``input_ids[t]`` itself (the log_prob
*of* that token given the tokens before it; the training side shifts logits, not these
arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SAMPLED = "sampled"
OBSERVATION = "observation"


@dataclass(frozen=True)
class Segment:
    """A span ``response_ids[start:end]`` appended in one piece."""

    kind: str  # SAMPLED or OBSERVATION
    start: int
    end: int


@dataclass(frozen=True)
class TurnRouting:
    """What one sampler call computed: ``tokens`` = its prompt + its sampled tokens, and
    ``expert_ids`` ``[len(tokens), L, k]`` int32, the experts each of them was routed to per
    layer (-1: not computed, e.g. the last sampled token, never fed back)."""

    tokens: list[int]
    expert_ids: np.ndarray


def _recorded(expert_ids: np.ndarray) -> np.ndarray:
    """``[n]`` bool: positions whose record is complete (every layer's ids >= 0)."""
    return (expert_ids >= 0).reshape(len(expert_ids), -1).all(axis=1)


def stitch_routing(token_ids: Sequence[int], turns: Sequence[TurnRouting]) -> np.ndarray:
    """The trajectory's routing record ``[len(token_ids), L, k]`` int32 from its turns'.

    Rule: position t takes the record of the earliest turn (in call order) that has a
    record >= 0 at t; positions no turn computed stay -1. So a sampled token takes its own
    turn's decode-time record, the initial prompt and an observation take the prefill of the
    first turn whose prompt contained them, and a turn's last sampled token (-1 in its own
    turn) takes the next turn's prefill record.

    Token-in-token-out is checked, never assumed: each turn's tokens must be a prefix of
    `token_ids` and its record as long as its tokens; otherwise `ValueError` (a misaligned
    record would silently replay the wrong experts).
    """
    if not turns:
        raise ValueError("stitch_routing needs at least one turn's record")
    token_ids = np.asarray(token_ids, np.int64)
    shape = np.asarray(turns[0].expert_ids).shape[1:]
    out = np.full((len(token_ids), *shape), -1, np.int32)
    for j, turn in enumerate(turns):
        record = np.asarray(turn.expert_ids)
        n = len(turn.tokens)
        if record.shape != (n, *shape):
            raise ValueError(f"turn {j}: routing record of shape {record.shape} for {n} tokens "
                             f"(expected {(n, *shape)})")
        if n > len(token_ids) or not np.array_equal(np.asarray(turn.tokens, np.int64), token_ids[:n]):
            mismatch = next((i for i, (a, b) in enumerate(zip(turn.tokens, token_ids)) if a != b),
                            min(n, len(token_ids)))
            raise ValueError(f"turn {j}: its prompt + sampled tokens are not a prefix of the trajectory "
                             f"(first difference at position {mismatch}); routing records cannot be aligned")
        take = _recorded(record) & ~_recorded(out[:n])  # what no earlier turn recorded
        out[:n][take] = record[take]
    return out


@dataclass
class Trajectory:
    """The finished record of one episode (see module docstring for the token conventions).

    Attributes:
        prompt_ids, response_ids, response_mask, rollout_log_probs: the token buffer.
        num_turns: assistant turns sampled.
        tool_calls: tool calls executed (including those answered with an error).
        tool_call_counts: executed calls per tool name (unknown names under their own name).
        tool_errors: error counts by kind (``malformed``, ``unknown_tool``, ``bad_arguments``,
            ``exception``, ``timeout``).
        reward: environment step rewards + tool rewards (+ `reward_fn`, when given).
        termination: why the episode ended: ``stop`` (an answer without tool calls),
            ``max_turns``, ``max_response_tokens``, ``max_tokens_per_turn``, ``length`` (the
            sampler stopped on length for another reason, e.g. its context limit),
            ``env_done``, ``overflow`` (an observation did not fit in the budget).
        messages: a text log of the conversation (decoded; for logging and reward functions,
            never used to build tokens).
        segments: appended spans, in order.
        states: the state-machine states the episode went through, in order.
        group_id: the episode's prompt group, passed through.
        metadata: the episode's metadata, passed through.
        metrics: other per-episode counters (``observation_truncated``, timings, ...).
        expert_ids: with routing recorded by the sampler (MoE), ``[len(input_ids), L, k]``
            int32 stitched from the turns' records (`stitch_routing`); None otherwise.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    rollout_log_probs: list[float]
    num_turns: int = 0
    tool_calls: int = 0
    tool_call_counts: dict[str, int] = field(default_factory=dict)
    tool_errors: dict[str, int] = field(default_factory=dict)
    reward: float = 0.0
    reward_info: dict[str, float] = field(default_factory=dict)
    termination: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    group_id: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    expert_ids: np.ndarray | None = None

    @property
    def input_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.response_ids]

    @property
    def num_sampled_tokens(self) -> int:
        return int(sum(self.response_mask))

    @property
    def num_observation_tokens(self) -> int:
        return len(self.response_ids) - self.num_sampled_tokens


class TrajectoryBuilder:
    """The single token buffer of one episode; append-only."""

    def __init__(self, prompt_ids: Sequence[int]):
        self.prompt_ids: list[int] = list(prompt_ids)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.rollout_log_probs: list[float] = []
        self.segments: list[Segment] = []
        self.routing: list[TurnRouting] = []

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def token_buffer(self) -> list[int]:
        """Prompt + response: what the sampler is asked to continue."""
        return [*self.prompt_ids, *self.response_ids]

    def last_token(self) -> int | None:
        if self.response_ids:
            return self.response_ids[-1]
        return self.prompt_ids[-1] if self.prompt_ids else None

    def append_sampled(self, token_ids: Sequence[int], log_probs: Sequence[float]) -> None:
        """Append sampled tokens as sampled: mask 1, their sampling log_probs."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"{len(token_ids)} tokens but {len(log_probs)} log_probs")
        self._append(SAMPLED, token_ids, [1] * len(token_ids), [float(x) for x in log_probs])

    def append_observation(self, token_ids: Sequence[int]) -> None:
        """Append template/observation tokens: mask 0, log_prob 0.0."""
        self._append(OBSERVATION, token_ids, [0] * len(token_ids), [0.0] * len(token_ids))

    def record_routing(self, prompt_ids: Sequence[int], token_ids: Sequence[int], expert_ids: Any) -> None:
        """Keep one turn's routing record (`Completion.expert_ids` ``[P + R, L, k]`` of the
        request `prompt_ids` and its sampled `token_ids`) for `stitch_routing` at `build`."""
        self.routing.append(TurnRouting([*map(int, prompt_ids), *map(int, token_ids)],
                                        np.asarray(expert_ids, np.int32)))

    def _append(self, kind: str, ids: Sequence[int], mask: list[int], lps: list[float]) -> None:
        if not ids:
            return
        start = len(self.response_ids)
        self.response_ids.extend(int(i) for i in ids)
        self.response_mask.extend(mask)
        self.rollout_log_probs.extend(lps)
        self.segments.append(Segment(kind, start, len(self.response_ids)))

    def build(self, **fields: Any) -> Trajectory:
        """Freeze the buffer into a `Trajectory` with the given bookkeeping fields (and the
        stitched routing record when turns recorded one)."""
        expert_ids = stitch_routing(self.token_buffer(), self.routing) if self.routing else None
        return Trajectory(
            prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids),
            response_mask=list(self.response_mask),
            rollout_log_probs=list(self.rollout_log_probs),
            segments=list(self.segments),
            expert_ids=expert_ids,
            **fields,
        )


def pack_trajectories(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    pad_to_multiple_of: int = 1,
    max_length: int | None = None,
) -> dict[str, np.ndarray]:
    """Right-padded training arrays (docs/design.md, data contract) from trajectories.

    Returns a dict of numpy arrays, B = len(trajectories), T = longest prompt+response rounded
    up to a multiple of `pad_to_multiple_of` (bucketed shapes keep the number of compiled
    programs small):

    - ``input_ids`` [B, T] int32: prompt + response, then `pad_token_id`;
    - ``attention_mask`` [B, T] int32: 1 on real tokens, 0 on padding;
    - ``positions`` [B, T] int32: 0..len-1 on real tokens, 0 on padding;
    - ``response_mask`` [B, T] int32: 1 on sampled tokens only (0 on prompt, observations, pad);
    - ``rollout_log_probs`` [B, T] float32: log_prob of ``input_ids[t]`` at sampling time on
      sampled tokens, 0.0 elsewhere;
    - ``token_level_rewards`` [B, T] float32: the trajectory reward on its last sampled token
      (the last response token if none was sampled), 0 elsewhere;
    - ``scores`` [B] float32, ``prompt_lengths`` / ``response_lengths`` / ``num_turns`` [B]
      int32, ``group_ids`` [B] int32 (the trajectory's ``group_id``, its index when unset).

    A trajectory longer than `max_length` raises `ValueError` (never silently truncated).
    """
    if not trajectories:
        raise ValueError("pack_trajectories needs at least one trajectory")
    if pad_to_multiple_of < 1:
        raise ValueError("pad_to_multiple_of must be >= 1")
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    longest = max(lengths)
    if max_length is not None and longest > max_length:
        raise ValueError(f"a trajectory has {longest} tokens > max_length={max_length}")
    T = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    if max_length is not None:
        T = min(T, max_length)
    B = len(trajectories)
    input_ids = np.full((B, T), pad_token_id, dtype=np.int32)
    attention_mask = np.zeros((B, T), dtype=np.int32)
    positions = np.zeros((B, T), dtype=np.int32)
    response_mask = np.zeros((B, T), dtype=np.int32)
    logps = np.zeros((B, T), dtype=np.float32)
    rewards = np.zeros((B, T), dtype=np.float32)
    for b, traj in enumerate(trajectories):
        if not (len(traj.response_ids) == len(traj.response_mask) == len(traj.rollout_log_probs)):
            raise ValueError(f"trajectory {b}: response arrays have different lengths")
        p, n = len(traj.prompt_ids), lengths[b]
        input_ids[b, :n] = traj.prompt_ids + traj.response_ids
        attention_mask[b, :n] = 1
        positions[b, :n] = np.arange(n)
        response_mask[b, p:n] = traj.response_mask
        logps[b, p:n] = traj.rollout_log_probs
        sampled = np.flatnonzero(np.asarray(traj.response_mask, dtype=np.int32))
        if n > p:
            last = p + (int(sampled[-1]) if sampled.size else n - p - 1)
            rewards[b, last] = traj.reward
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "positions": positions,
        "response_mask": response_mask,
        "rollout_log_probs": logps,
        "token_level_rewards": rewards,
        "scores": np.asarray([t.reward for t in trajectories], dtype=np.float32),
        "prompt_lengths": np.asarray([len(t.prompt_ids) for t in trajectories], dtype=np.int32),
        "response_lengths": np.asarray([len(t.response_ids) for t in trajectories], dtype=np.int32),
        "num_turns": np.asarray([t.num_turns for t in trajectories], dtype=np.int32),
        "group_ids": np.asarray(
            [i if t.group_id is None else t.group_id for i, t in enumerate(trajectories)],
            dtype=np.int32,
        ),
    }
