"""Which rollout replica runs which prompt group, and the results back in request order.

A group is the n samples of one prompt: it goes to one replica whole, so its samples
share the prompt's KV pages there. Each replica takes a contiguous run of groups, and the
runs are cut to make the largest expected-token load as small as any contiguous split
can (binary search on that load, each candidate checked by a greedy left-to-right fill).
Contiguous runs keep a replica's rollout a plain slice of the batch, numbered from its
first group (request streams and group ids follow the prompt's index: the layout changes
no token); in RL every group has n samples of the same response budget, so expected
tokens differ only by prompt lengths and the best contiguous split is within one group
of the mean (the looser, non-contiguous greedy was not worth a second numbering).

SPMD: the assignment is a pure function of the groups' sizes, which every process holds
(prompt lengths and sampling params of the shared batch), so every process knows where
every group runs without talking, and the replicas' results concatenated in replica
order are the groups in request order, on every process. An agent episode runs inside its group's rollout, so it stays on one replica for its
whole life and its later turns hit that replica's prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


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



def _fill(sizes: Sequence[int], cap: int, num_replicas: int) -> list[int] | None:
    """Left-to-right fill with at most `cap` tokens per replica: each group's replica, or
    None if `num_replicas` do not suffice."""
    replica_of, replica, load = [], 0, 0
    for size in sizes:
        if load + size > cap and load > 0:
            replica, load = replica + 1, 0
        if replica >= num_replicas or size > cap:
            return None
        replica_of.append(replica)
        load += size
    return replica_of


def assign_groups(groups: Sequence[Group], num_replicas: int) -> Assignment:
    """Contiguous runs of `groups` per replica with the smallest possible largest load
    (module docstring); deterministic (the fill at the optimal cap, earliest replicas first)."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    sizes = [g.expected_tokens for g in groups]
    if not sizes:
        return Assignment((), num_replicas)
    low, high = max(sizes), sum(sizes)  # the optimum lies in [largest group, everything on one]
    while low < high:
        middle = (low + high) // 2
        if _fill(sizes, middle, num_replicas) is None:
            low = middle + 1
        else:
            high = middle
    return Assignment(tuple(_fill(sizes, low, num_replicas)), num_replicas)
