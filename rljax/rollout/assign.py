"""Which rollout replica runs which prompt group, and the results back in request order.

A group is the n samples of one prompt: it goes to one replica whole, so its samples
share the prompt's KV pages there. Groups are balanced by expected tokens with greedy
longest-processing-time (largest group first, to the least loaded replica; ties go to
the lower group index, then the lower replica index), whose largest load is at most
4/3 - 1/(3 R) of the best possible one (Graham, 1969).

SPMD: the assignment is a pure function of the groups' sizes, which every process holds
(prompt lengths and sampling params of the shared batch), so every process knows where
every group runs without talking, and `merge_in_order` gives every process the same
order. Agent episodes stay on the replica of the group they started in for their whole
life (`Assignment.episode_replicas`): their later turns hit that replica's prefix cache.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=Hashable)


@dataclass(frozen=True)
class Group:
    """One prompt's samples, sized for balancing.

    prompt_len: tokens of the prompt (computed once, shared by the samples).
    num_samples: n, samples of the prompt.
    max_response_len: the most tokens one sample may generate.
    estimate: expected tokens when the caller knows better (e.g. mean response lengths
        of earlier steps); must be the same on every process.
    """

    prompt_len: int
    num_samples: int
    max_response_len: int
    estimate: int | None = None

    @property
    def expected_tokens(self) -> int:
        if self.estimate is not None:
            return self.estimate
        return self.prompt_len + self.num_samples * self.max_response_len


@dataclass(frozen=True)
class Assignment:
    """replica_of[g]: the replica of group g, for groups in request order."""

    replica_of: tuple[int, ...]
    num_replicas: int

    @property
    def per_replica(self) -> tuple[tuple[int, ...], ...]:
        """Per replica, its groups' indices in request order (the order it queues them)."""
        out: list[list[int]] = [[] for _ in range(self.num_replicas)]
        for group, replica in enumerate(self.replica_of):
            out[replica].append(group)
        return tuple(tuple(groups) for groups in out)

    def loads(self, groups: Sequence[Group]) -> list[int]:
        """Expected tokens per replica."""
        out = [0] * self.num_replicas
        for group, replica in zip(groups, self.replica_of):
            out[replica] += group.expected_tokens
        return out

    def episode_replicas(self, episode_groups: Mapping[E, int]) -> dict[E, int]:
        """Episode id -> the replica of the group it started in, for every turn of it."""
        return {episode: self.replica_of[group] for episode, group in episode_groups.items()}


def assign_groups(groups: Sequence[Group], num_replicas: int) -> Assignment:
    """Greedy longest-first balance of `groups` over `num_replicas` (module docstring)."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    order = sorted(range(len(groups)), key=lambda g: (-groups[g].expected_tokens, g))
    heap = [(0, r) for r in range(num_replicas)]  # (load, replica): least loaded, lowest index first
    replica_of = [0] * len(groups)
    for g in order:
        load, replica = heapq.heappop(heap)
        replica_of[g] = replica
        heapq.heappush(heap, (load + groups[g].expected_tokens, replica))
    return Assignment(tuple(replica_of), num_replicas)


def merge_in_order(per_replica_results: Sequence[Sequence[T]], assignment: Assignment) -> list[T]:
    """Results in request order: `per_replica_results[r][j]` is the result of group
    `assignment.per_replica[r][j]`."""
    expected = assignment.per_replica
    if len(per_replica_results) != len(expected):
        raise ValueError(f"{len(per_replica_results)} replicas returned results, {len(expected)} were assigned")
    out: list = [None] * len(assignment.replica_of)
    for replica, (results, groups) in enumerate(zip(per_replica_results, expected)):
        if len(results) != len(groups):
            raise ValueError(f"replica {replica} returned {len(results)} results for {len(groups)} groups")
        for group, result in zip(groups, results):
            out[group] = result
    return out
