"""Rollout replicas in the RL loop: one sampler per replica, weights handed off each step,
a rollout's prompts spread over the replicas and the scored results gathered in order.

    step's prompts (identical on every process)
        ─► contiguous runs of groups per replica (a pure function of the prompts: `assign_groups`)
        ─► each process runs its local replicas' rollouts (one thread each: sample + score)
        ─► scored slices gathered from every process (`allgather_objects`)
        ─► concatenated in replica order = prompt order: every process holds the same `ScoredRollout`

A replica's programs run on its own devices (`rollout.tensor_parallel_size` of them,
inside one process unless `rollout.allow_cross_host_replicas`), so its scheduler answers to
no one; the only cross-process steps are the weight hand-off (one program over all
devices, every process calls it with the same arguments) and the gather of the results.
A request's sampling noise depends on its stream (step, prompt index) only, so the number
of replicas changes no token (docs/design.md, "SPMD discipline").
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Sequence

import jax
from flax import nnx

from rljax.hostsync import allgather_objects
from rljax.metrics import reduce_metrics
from rljax.rl.main_thread import MainThreadCalls
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.assign import Assignment, Group, assign_groups
from rljax.rollout.handoff import HandOffCache, HandOffReport, timed_hand_off
from rljax.rollout.params import SamplingParams
from rljax.rollout.replicas import ReplicaLayout
from rljax.rollout.sampler import Sampler

# (sampler, prompts, params, group offset) -> the scored samples of those prompts
ReplicaRolloutFn = Callable[[Sampler, dict, SamplingParams, int], ScoredRollout]


def select(prompts: dict[str, list], indices: Sequence[int]) -> dict[str, list]:
    """The rows `indices` of a column-wise prompt batch."""
    return {key: [column[i] for i in indices] for key, column in prompts.items()}


def merge_rollouts(parts: Sequence[ScoredRollout], sizes: Sequence[int]) -> ScoredRollout:
    """One rollout from per-replica parts (samples and records concatenated in the given
    order). Metrics combine by their declared reductions (`rljax.metrics.reduce_metrics`):
    means weighted by the parts' numbers of prompts (`sizes`; every prompt has the same
    number of samples), counts summed, maxima and minima kept."""
    samples = [s for part in parts for s in part.samples]
    records = [r for part in parts for r in part.records]
    return ScoredRollout(samples, reduce_metrics([part.metrics for part in parts], sizes), records)


class ReplicatedRollout:
    """The rollout replicas of a run: `layout` over every device, a sampler for each
    replica this process owns, built by `make_sampler(decoder)` on the replica's copy
    of the weights."""

    def __init__(self, decoder: nnx.Module, layout: ReplicaLayout, make_sampler: Callable[[nnx.Module], Sampler],
                 max_response_len: int):
        self.layout = layout
        self.max_response_len = max_response_len
        self.graphdef, params = nnx.split(decoder)
        self.local = layout.local_replicas()
        self.hand_off_cache = HandOffCache()  # unchanged leaves (LoRA's base) are handed off once
        states, self.last_hand_off = timed_hand_off(params, layout, self.local, self.hand_off_cache)
        self.samplers = {}
        for r, state in zip(self.local, states):
            with jax.set_mesh(layout.replicas[r]):  # a replica's programs live on its devices, not the run's mesh
                self.samplers[r] = make_sampler(nnx.merge(self.graphdef, state))
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, len(self.local)), thread_name_prefix="rljax-replica")
        self.main_thread = MainThreadCalls()  # what a rollout must run on the calling thread (inline rewards)

    def update_params(self, params: nnx.State) -> HandOffReport:
        """Hand the policy's parameters (training layout) to every replica, in device
        memory. Every process must call it (the reshard is one program over all)."""
        states, report = timed_hand_off(params, self.layout, self.local, self.hand_off_cache)
        for r, state in zip(self.local, states):
            self.samplers[r].update_params(state)
        self.last_hand_off = report
        return report

    def hand_off(self, params: nnx.State) -> tuple[list[nnx.State], HandOffReport]:
        """The policy's parameters copied onto every local replica's devices (one state per
        local replica, in `self.local` order), not yet in use: `install` puts them in."""
        states, report = timed_hand_off(params, self.layout, self.local, self.hand_off_cache)
        self.last_hand_off = report
        return states, report

    def install(self, states: list[nnx.State], version: int) -> None:
        """Make handed-off `states` the replicas' weights from their next engine step on,
        stamping the tokens they sample with `version` (`Sampler.update_params`)."""
        for r, state in zip(self.local, states):
            self.samplers[r].update_params(state, version=version)

    def assign(self, prompts: dict[str, list], n: int) -> Assignment:
        """Prompt groups -> replicas, contiguous runs balanced by expected tokens (prompt +
        n x response budget): a pure function of the prompts, the same on every process."""
        groups = [Group(len(p), n, self.max_response_len) for p in prompts["prompt_ids"]]
        return assign_groups(groups, self.layout.num_replicas)

    def run(self, rollout_fn: ReplicaRolloutFn, prompts: dict[str, list], params: SamplingParams,
            offset: int = 0) -> ScoredRollout:
        """`rollout_fn` over the prompts (groups numbered from `offset`), each replica's run of
        them on its sampler; every process returns the same rollout, in prompt order."""
        shares = self.assign(prompts, params.n).per_replica
        futures = {r: self._pool.submit(rollout_fn, self.samplers[r], select(prompts, shares[r]), params,
                                        offset + shares[r][0])
                   for r in self.local if shares[r]}
        if self.main_thread.on_owner:
            self.main_thread.serve(futures.values())
        else:  # a producer's thread: the owner serves the rollout's main-thread calls while it waits for it
            concurrent.futures.wait(futures.values())
        local: dict[int, ScoredRollout | str] = {}
        for r, future in futures.items():
            try:
                local[r] = future.result()
            except Exception as e:  # every process must reach the gather, or the others wait forever
                local[r] = f"{type(e).__name__}: {e}"
                if jax.process_count() == 1:
                    raise
        gathered: dict[int, ScoredRollout | str] = {}
        for part in allgather_objects(local):  # a replica spanning processes answers from each: the same
            gathered.update(part)
        failed = {r: v for r, v in gathered.items() if isinstance(v, str)}
        if failed:
            r, message = min(failed.items())
            raise RuntimeError(f"rollout replica {r} failed: {message}")
        order = [r for r in range(self.layout.num_replicas) if shares[r]]
        return merge_rollouts([gathered[r] for r in order], [len(shares[r]) for r in order])

    def stats(self) -> dict:
        return {r: sampler.stats() for r, sampler in self.samplers.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for sampler in self.samplers.values():
            sampler.close()

