"""Rollout replicas in the RL loop: one sampler per replica, weights handed off each step,
a rollout's prompts spread over the replicas and the scored results gathered in order.

    step's prompts (identical on every process)
        ─► contiguous runs of groups per replica (a pure function of the prompts: `assign_groups`)
        ─► each process runs its local replicas' rollouts (one thread each: sample + score)
        ─► scored slices gathered from every process (`allgather_objects`), on the main thread
        ─► concatenated in replica order = prompt order: every process holds the same `ScoredRollout`

A replica's programs run on its own devices (`rollout.tensor_parallel_size` of them,
inside one process unless `rollout.allow_cross_host_replicas`), so its scheduler answers to
no one; the only cross-process steps are the weight hand-off (one program over all
devices, every process calls it with the same arguments; with `transfer`, first one
program over the trainer's and the rollout's devices, `rljax.rollout.cross_transfer`)
and the gather of the results.

Both are collectives, so they run on the main thread, where every process makes its
cross-process calls in the same order. A rollout running in a producer's background thread
(`trainer.mode: one_step_off`) hands its gather to the main thread (`MainThreadCalls`),
which runs it while it waits for that rollout: every process reaches that wait at the same
point of its loop. When the main thread waits with a deadline (`async.timeout_s`), the
gather first waits for every process to arrive until that deadline
(`rljax.hostsync.wait_for_processes`): a process whose sampler or reward stalled never
arrives, and the others stop with an error naming it instead of entering a collective
that would never end.

A request's sampling noise depends on its stream (step, prompt index) only, so the number
of replicas changes no token (docs/design.md, "SPMD discipline").
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh

from rljax.hostsync import allgather_objects, wait_for_processes
from rljax.metrics import reduce_metrics
from rljax.rl.main_thread import MainThreadCalls
from rljax.rl.scoring import PendingScores, ScoredRollout
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
    pending = [part.pending for part in parts if part.pending is not None]
    if pending and len(pending) != len(parts):
        raise ValueError("merge_rollouts: some parts are scored by every source, others are not")
    return ScoredRollout(samples, reduce_metrics([part.metrics for part in parts], sizes), records,
                         PendingScores.concat(pending) if pending else None)


def outcomes(futures: dict[int, concurrent.futures.Future]) -> dict[int, object]:
    """Each replica's result, or its error as a string: every process must reach the
    gather that follows, or the others wait forever (one process: the error is raised)."""
    out: dict[int, object] = {}
    for r, future in futures.items():
        try:
            out[r] = future.result()
        except Exception as e:
            out[r] = f"{type(e).__name__}: {e}"
            if jax.process_count() == 1:
                raise
    return out


def succeeded(gathered: dict[int, object]) -> dict[int, object]:
    """`gathered` (replica -> result or error string), or a RuntimeError naming the first
    replica that failed."""
    failed = {r: v for r, v in gathered.items() if isinstance(v, str)}
    if failed:
        r, message = min(failed.items())
        raise RuntimeError(f"rollout replica {r} failed: {message}")
    return gathered


class ReplicatedRollout:
    """The rollout replicas of a run: `layout` over the rollout devices, a sampler for each
    replica this process owns, built by `make_sampler(decoder)` on the replica's copy
    of the weights. `transfer` carries weights from the decoder's devices onto the rollout
    devices first (several processes, disjoint device sets; `rljax.rollout.handoff`).
    `weight_dtype`: the dtype the replicas hold floating-point weights in (cast inside the
    hand-off; None: the trainer's)."""

    def __init__(self, decoder: nnx.Module, layout: ReplicaLayout, make_sampler: Callable[[nnx.Module], Sampler],
                 max_response_len: int, transfer: Callable[[list], list] | None = None, weight_dtype=None):
        self.layout = layout
        self.max_response_len = max_response_len
        self.transfer = transfer
        self.weight_dtype = weight_dtype
        self.graphdef, params = nnx.split(decoder)
        self.local = layout.local_replicas()
        self.hand_off_cache = HandOffCache()  # unchanged leaves (LoRA's base) are handed off once
        self._gathers = 0  # gathers made with a deadline: names each one's meeting point, alike on every process
        self._futures: dict = {}  # the replicas' rollouts in flight or last run
        states, self.last_hand_off = timed_hand_off(params, layout, self.local, self.hand_off_cache, transfer,
                                                    weight_dtype)
        self.states = dict(zip(self.local, states))  # each local replica's current weights
        self.followers: list[dict[int, Sampler]] = []  # more samplers on the replicas' weights (`follow`)
        self.samplers = {}
        for r, state in zip(self.local, states):
            with jax.set_mesh(layout.replicas[r]):  # a replica's programs live on its devices, not the run's mesh
                self.samplers[r] = make_sampler(nnx.merge(self.graphdef, state))
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, len(self.local)), thread_name_prefix="rljax-replica")
        self.main_thread = MainThreadCalls()  # what a rollout must run on the calling thread (inline rewards)

    def update_params(self, params: nnx.State) -> HandOffReport:
        """Hand the policy's parameters (training layout) to every replica, in device
        memory. Every process must call it, on its main thread, with no rollout running
        (the transfer and the reshard are programs over all processes)."""
        states, report = self.hand_off(params)
        for r, state in zip(self.local, states):
            self.samplers[r].update_params(state)
        self._follow(states)
        return report

    def hand_off(self, params: nnx.State) -> tuple[list[nnx.State], HandOffReport]:
        """The policy's parameters copied onto every local replica's devices (one state per
        local replica, in `self.local` order), not yet in use: `install` puts them in."""
        states, report = timed_hand_off(params, self.layout, self.local, self.hand_off_cache, self.transfer,
                                        self.weight_dtype)
        self.last_hand_off = report
        return states, report

    def install(self, states: list[nnx.State], version: int) -> None:
        """Make handed-off `states` the replicas' weights from their next engine step on,
        stamping the tokens they sample with `version` (`Sampler.update_params`)."""
        for r, state in zip(self.local, states):
            self.samplers[r].update_params(state, version=version)
        self._follow(states)

    def _follow(self, states: list[nnx.State]) -> None:
        self.states = dict(zip(self.local, states))
        for samplers in self.followers:
            for r, state in zip(self.local, states):
                samplers[r].update_params(state)

    def on_each_replica(self, build: Callable[[int, Mesh], Sampler]) -> dict[int, Sampler]:
        """`build(r, replica mesh)` for each local replica r, under that replica's mesh."""
        out = {}
        for r in self.local:
            with jax.set_mesh(self.layout.replicas[r]):
                out[r] = build(r, self.layout.replicas[r])
        return out

    def model(self, r: int) -> nnx.Module:
        """The policy with local replica r's current weights (on its devices)."""
        return nnx.merge(self.graphdef, self.states[r])

    def follow(self, samplers: dict[int, Sampler]) -> None:
        """From now on, `samplers` (one per local replica) take each hand-off's weights too
        (their owner closes them)."""
        self.followers.append(samplers)

    def generate_everywhere(self, generate: dict[int, Callable[[list], list]], items: list) -> list:
        """`items` cut into contiguous runs, one per replica (a pure function of their
        number), each local run through its replica's `generate` (a list in, one result per
        item out) on the replicas' threads, and the results gathered from every process:
        every process returns all of them, in order. A collective: with several processes,
        call it on the main thread, where every process makes its cross-process calls in
        the same order."""
        n = self.layout.num_replicas
        bounds = [len(items) * r // n for r in range(n + 1)]
        futures = {r: self._pool.submit(generate[r], items[bounds[r]: bounds[r + 1]])
                   for r in self.local if bounds[r + 1] > bounds[r]}
        gathered = succeeded(self.gather(outcomes(futures)))
        return [x for r in range(n) if bounds[r + 1] > bounds[r] for x in gathered[r]]

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
        futures = self._futures = {
            r: self._pool.submit(rollout_fn, self.samplers[r], select(prompts, shares[r]), params, offset + shares[r][0])
            for r in self.local if shares[r]}
        if self.main_thread.on_owner:
            self.main_thread.serve(futures.values())
        else:  # a producer's thread: the owner serves the rollout's main-thread calls while it waits for it
            concurrent.futures.wait(futures.values())
        local = outcomes(futures)
        if jax.process_count() > 1 and not self.main_thread.on_owner:
            gathered = self.main_thread.call(self.gather, local)  # a collective: on the main thread
        else:
            gathered = self.gather(local)
        gathered = succeeded(gathered)
        order = [r for r in range(self.layout.num_replicas) if shares[r]]
        return merge_rollouts([gathered[r] for r in order], [len(shares[r]) for r in order])

    def gather(self, local: dict[int, ScoredRollout | str]) -> dict[int, ScoredRollout | str]:
        """Every process's replica results (`local`: this process's), merged by replica.
        A collective: every process calls it at the same point of its main thread; when
        that thread waits with a deadline (`MainThreadCalls.deadline`), the processes first
        meet (`wait_for_processes`), and one that does not arrive by the deadline is named
        in a `ProcessesTimeout`."""
        deadline = self.main_thread.deadline
        if deadline is not None and jax.process_count() > 1:
            self._gathers += 1
            wait_for_processes(f"rollout-gather/{self._gathers}", deadline - time.monotonic(),
                               f"the gather of rollout results #{self._gathers} (async.timeout_s)")
        gathered: dict[int, ScoredRollout | str] = {}
        for part in allgather_objects(local):  # a replica spanning processes answers from each: the same
            gathered.update(part)
        return gathered

    def stats(self) -> dict:
        return {r: sampler.stats() for r, sampler in self.samplers.items()}

    def close(self) -> None:
        """Stop the replicas. A replica whose rollout is still running (a stalled sampler
        or reward, after a timeout) is not waited for, and its sampler is left open."""
        busy = {r for r, f in self._futures.items() if not f.done()}
        self._pool.shutdown(wait=not busy, cancel_futures=True)
        for r, sampler in self.samplers.items():
            if r not in busy:
                sampler.close()


