"""The rollout producer of `trainer.mode: async`: the rollout replicas sample a stream of
prompt groups on their own devices while the trainer trains, taking new weights between
segments of engine steps; groups in flight continue under the new weights (partial
rollouts), and a group is trained at most `async.max_staleness` versions after the
oldest version that sampled any of its tokens.

Versions: `v_k` holds k learner steps; the trainer trains batch k under `v_k` and
publishes `v_(k+1)` (`publish`: copied onto the rollout devices on the trainer's
thread). The producer's thread runs one loop; every decision in it is taken at a
segment boundary from the producer's own state, never from the clock, so a run is the
same whatever the timing (waits change when, never what):

    admit     whole prompt batches while (groups admitted - dropped) < (v + max_staleness + 1) x B
              (B = data.batch_size; v the installed version): prompt batch j samples with
              `sampling_params(j)`, its prompt i on stream base + i, as `trainer.mode: sync` does
    segment   every replica's engine runs `async.segment_steps` steps (`Sampler.step`); groups
              whose n samples all finished join the finished list, in (segment, group id) order
    form      batch f from B finished groups, oldest version first (then finish order). A group
              still sampling that batch f+1 would take beyond the bound ((f + 1) - its oldest
              version > max_staleness) is at risk: `on_stale: wait` forms batch f only once it
              has finished (it joins f), `drop` aborts it (`async/dropped_groups`)
    install   v+1, once the trainer published it, when the producer is a whole formed batch ahead
              of it (f >= v + 2) or has nothing else to do (f >= v + 1, no work): every sequence in
              flight re-prefills prompt + tokens so far under v+1 and goes on with the budget it
              has left; each token keeps the version and log-prob it was sampled with

`max_staleness: 0` admits batch v only under `v_v` and forms it from all of its groups:
every batch is sampled by one version and trained under it, as in `trainer.mode: sync`.

Checkpoints: at every install the producer records a snapshot (`snapshot(version)`): the
formed but untrained batches (scored), the finished groups, the groups in flight (prompt,
tokens so far, their versions and log-probs; their random keys follow from (seed, stream,
sample, position)), the counters and the data position. A checkpoint after step k holds
the snapshot taken at the install of `v_(k+1)`; a resumed run installs the restored
`v_(k+1)` into the sampler, re-submits the groups in flight from their tokens so far, and
goes on exactly as the uninterrupted run does from that install.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rljax.rl.async_producer import RolloutTimeout, rollout_from_json, rollout_to_json
from rljax.rl.main_thread import MainThreadCalls
from rljax.rl.producer import Prompts
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.params import Completion, GenerationRequest, PartialRequest, SamplingParams

# (completions with request_index = row of `prompts`, prompts) -> the scored batch
ScoreFn = Callable[[list[Completion], Prompts], ScoredRollout]
# (name, this process's value) -> every process's value, in process order
ExchangeFn = Callable[[str, Any], list[Any]]


@dataclass
class _Group:
    """One prompt and its n samples, numbered `gid` in admission order (prompt batch j,
    row i: gid = j * B + i)."""

    gid: int
    batch: int
    row: dict[str, Any]  # its prompt row: column -> value
    params: SamplingParams
    replica: int
    future: concurrent.futures.Future | None = None
    completions: list[Completion] | None = None
    finish: tuple[int, int] | None = None  # (segment, gid): the finished list's order
    resume: PartialRequest | None = None  # restored from a checkpoint, not yet re-submitted

    def oldest(self) -> int:
        return min(v for c in self.completions for v in c.policy_versions)

    def to_json(self, partial: PartialRequest | None) -> dict:
        return {"gid": self.gid, "batch": self.batch, "row": self.row, "params": self.params.to_json(),
                "replica": self.replica, "finish": None if self.finish is None else list(self.finish),
                "completions": None if self.completions is None else [_completion_json(c) for c in self.completions],
                "partial": None if partial is None else partial.to_json()}

    @staticmethod
    def from_json(d: dict) -> "_Group":
        g = _Group(d["gid"], d["batch"], d["row"], SamplingParams.from_json(d["params"]), d["replica"])
        g.finish = None if d["finish"] is None else tuple(d["finish"])
        g.completions = None if d["completions"] is None else [Completion(**c) for c in d["completions"]]
        g.resume = None if d["partial"] is None else PartialRequest.from_json(d["partial"])
        return g


def _completion_json(c: Completion) -> dict:
    return {"request_index": c.request_index, "sample_index": c.sample_index,
            "prompt_token_ids": [int(t) for t in c.prompt_token_ids], "token_ids": [int(t) for t in c.token_ids],
            "log_probs": [float(x) for x in c.log_probs], "finish_reason": c.finish_reason,
            "policy_versions": [int(v) for v in c.policy_versions]}


class StreamProducer:
    """`trainer.mode: async` (module docstring). The trainer calls `collect(k)` for batch
    k, `publish(params, k + 1)` after training it, `snapshot(k + 1)` to save after step k;
    the producer's thread does everything else.

    `replicas`: the run's `ReplicatedRollout` (manual samplers, one process);
    `next_prompts()` the data's next prompt batch and `data_state()` its position (called
    on the producer's thread only); `score` scores a formed batch; `sampling_params(j)`
    prompt batch j's params.

    Several processes: each steps its own replicas; at every segment boundary and install
    the processes `exchange` what their replicas finished and hold (through the
    coordination service, `rljax.hostsync.exchange_objects`), so every process takes the
    same decisions and forms the same batches (each scores the whole batch)."""

    def __init__(self, replicas, next_prompts: Callable[[], Prompts], data_state: Callable[[], Any], score: ScoreFn,
                 sampling_params: Callable[[int], SamplingParams], batch_size: int, total_batches: int,
                 max_staleness: int, on_stale: str, segment_steps: int, timeout_s: float = 0.0,
                 main_thread: MainThreadCalls | None = None, exchange: ExchangeFn | None = None):
        self.replicas = replicas
        self.next_prompts, self.data_state, self.score = next_prompts, data_state, score
        self.sampling_params = sampling_params
        self.B, self.total_batches = batch_size, total_batches
        self.max_staleness, self.on_stale, self.segment_steps = max_staleness, on_stale, segment_steps
        self.timeout_s = timeout_s
        self.main_thread = main_thread
        self.exchange = exchange or (lambda name, value: [value])
        # the producer thread's state
        self.groups: dict[int, _Group] = {}
        self.in_flight: list[int] = []  # every process's groups sampling (this process's have a future)
        self._oldest: dict[int, int] = {}  # group in flight -> the oldest version among its tokens so far
        self.finished: list[int] = []
        self.version = 0  # installed in the replicas
        self.prompt_batches = 0  # prompt batches admitted
        self.dropped = 0
        self.formed = 0  # batches formed
        self.segments = 0
        self._batch_drops = self._batch_waits = 0  # of the batch being formed
        # shared with the trainer's thread
        self._cv = threading.Condition()
        self._batches: dict[int, concurrent.futures.Future] = {}  # formed batches not yet trained
        self._published: dict[int, Any] = {}  # version -> handed-off states
        self._snapshots: dict[int, concurrent.futures.Future] = {}
        self._busy: list[tuple[float, float | None]] = []  # when the replicas ran segments
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ---- the trainer's side --------------------------------------------------------------

    def start(self, version: int, snapshot: dict | None = None) -> None:
        """Begin at `version` (the replicas hold its weights), from a checkpoint's
        snapshot when resuming."""
        self.version = version
        if snapshot is not None:
            self._restore(snapshot)
        self._thread = threading.Thread(target=self._run, name="rljax-stream-producer", daemon=True)
        self._thread.start()

    def collect(self, index: int) -> ScoredRollout:
        """Formed batch `index` (blocks; RolloutTimeout after `async.timeout_s`)."""
        rollout = self._wait(self._future(self._batches, index), f"batch {index}")
        return ScoredRollout(list(rollout.samples), dict(rollout.metrics), list(rollout.records))

    def publish(self, params, version: int) -> dict[str, float]:
        """The learner's weights after `version` steps, copied onto the rollout devices now
        (the trainer may donate its buffers next); the producer installs them when due."""
        states, report = self.replicas.hand_off(params)
        with self._cv:
            self._published[version] = states
            for v in [v for v in self._batches if v < version]:  # trained
                del self._batches[v]
            self._cv.notify_all()
        return {"memory/update_weights_GiB": report.metrics()["memory/update_weights_GiB"]}

    def snapshot(self, version: int) -> dict:
        """The producer's state at the install of `version` (blocks until it happened)."""
        return self._wait(self._future(self._snapshots, version), f"the install of policy version {version}")

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] (`time.perf_counter`) during which the replicas ran segments."""
        now = time.perf_counter()
        with self._cv:
            spans = list(self._busy)
        return sum(max(0.0, min(t1, end if end is not None else now) - max(t0, start)) for start, end in spans)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _future(self, table: dict, key: int) -> concurrent.futures.Future:
        with self._cv:
            return table.setdefault(key, concurrent.futures.Future())

    def _wait(self, future: concurrent.futures.Future, what: str):
        timeout = self.timeout_s or None
        try:
            if self.main_thread is not None and self.main_thread.on_owner:
                self.main_thread.serve([future], timeout_s=timeout)
            return future.result(timeout=timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):
            raise RolloutTimeout(f"{what} is not ready after async.timeout_s={self.timeout_s:g} s (a stalled "
                                 f"sampler or reward; the sampler holds policy version {self.version})") from None

    # ---- the producer's thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop:
                self._admit()
                work = bool(self.in_flight)
                if work:
                    self._segment()
                while self._form():
                    pass
                if self.formed >= self.total_batches and not self.in_flight and self.version >= self.total_batches:
                    self._idle()
                    continue
                if self.formed >= self.version + 2 or (not self.in_flight and self.formed >= self.version + 1):
                    states = self._await_published(self.version + 1)
                    if states is not None:
                        self._install(self.version + 1, states)
                elif not self.in_flight:
                    raise RuntimeError(f"the async producer has nothing to sample and batch {self.formed} is not "
                                       f"formed (version {self.version}, {len(self.finished)} finished groups)")
        except BaseException as e:  # noqa: BLE001 - every waiter of the trainer raises it
            with self._cv:
                for table in (self._batches, self._snapshots):
                    for future in table.values():
                        if not future.done():
                            future.set_exception(e)
                self._error = e
                self._cv.notify_all()

    def _admit(self) -> None:
        s, B = self.max_staleness, self.B
        while (self.prompt_batches * B - self.dropped < min((self.version + s + 1) * B, self.total_batches * B)):
            j = self.prompt_batches
            prompts = self.next_prompts()
            params = self.sampling_params(j)
            shares = self.replicas.assign(prompts, params.n).per_replica
            replica_of = {i: r for r, rows in enumerate(shares) for i in rows}
            requests: dict[int, list[tuple[GenerationRequest, _Group]]] = {}
            for i in range(len(prompts["prompt_ids"])):
                gid = j * B + i
                row = {key: column[i] for key, column in prompts.items()}
                g = _Group(gid, j, row, dataclasses.replace(params, stream=params.stream + i), replica_of[i])
                self.groups[gid] = g
                requests.setdefault(g.replica, []).append(
                    (GenerationRequest(list(row["prompt_ids"]), g.params, request_id=gid), g))
            for r, pairs in requests.items():
                self._submit(r, pairs)
            self.prompt_batches += 1

    def _submit(self, replica: int, pairs: list[tuple[GenerationRequest, _Group]]) -> None:
        """Queue groups on `replica` when this process owns it; every process lists them in flight."""
        local = replica in self.replicas.samplers
        futures = self.replicas.samplers[replica].submit_many([r for r, _ in pairs]) if local else [None] * len(pairs)
        for (_, g), future in zip(pairs, futures):
            g.future, g.resume = future, None
            self.in_flight.append(g.gid)

    def _segment(self) -> None:
        start = time.perf_counter()
        with self._cv:
            self._busy.append((start, None))
        busy = {r for r in self.replicas.local if any(self.groups[g].replica == r for g in self.in_flight)}
        on_threads([lambda r=r: self.replicas.samplers[r].step(self.segment_steps) for r in sorted(busy)])
        with self._cv:
            self._busy[-1] = (start, time.perf_counter())
            del self._busy[:-16]
        self.segments += 1
        done = {gid: [_completion_json(c) for c in self.groups[gid].future.result()] for gid in self.in_flight
                if self.groups[gid].future is not None and self.groups[gid].future.done()}
        oldest = {gid: min(v for s in p.samples for v in s.policy_versions)
                  for gid, p in self._partials().items() if p.num_generated}
        reports = self.exchange(f"segment/{self.segments}", (done, oldest))
        for gid in sorted(gid for finished, _ in reports for gid in finished):
            g = self.groups[gid]
            g.completions = [Completion(**c) for finished, _ in reports if gid in finished for c in finished[gid]]
            g.future, g.finish = None, (self.segments, gid)
            self.in_flight.remove(gid)
            self.finished.append(gid)
        self._oldest = {gid: v for _, part in reports for gid, v in part.items() if gid in self.in_flight}

    def _partials(self) -> dict[int, PartialRequest]:
        """This process's groups in flight: their tokens so far, by group id."""
        return {int(p.request_id): p for r in self.replicas.local for p in self.replicas.samplers[r].unfinished()}

    def _form(self) -> bool:
        """Form the next batch if it can be (module docstring); True if it did."""
        f, s = self.formed, self.max_staleness
        if f >= self.total_batches or len(self.finished) < self.B:
            return False
        at_risk = [gid for gid in self.in_flight if (f + 1) - self._oldest.get(gid, self.version) > s]
        if at_risk and self.on_stale == "wait":
            self._batch_waits = max(self._batch_waits, len(at_risk))
            return False
        for gid in at_risk:  # drop (each process aborts its own)
            if self.groups[gid].future is not None:
                self.groups[gid].future.cancel()
            self.in_flight.remove(gid)
            del self.groups[gid]
        self.dropped += len(at_risk)
        self._batch_drops += len(at_risk)
        order = sorted(self.finished, key=lambda gid: (self.groups[gid].oldest(), self.groups[gid].finish))
        over = [gid for gid in order if f - self.groups[gid].oldest() > s]  # beyond the bound already: never trained
        for gid in over:
            order.remove(gid)
            self.finished.remove(gid)
            del self.groups[gid]
        self.dropped += len(over)
        self._batch_drops += len(over)
        if len(order) < self.B:
            return False
        chosen = sorted(order[: self.B])
        rollout = self._score([self.groups[gid] for gid in chosen])
        spanning = [len(set(c.policy_versions)) > 1 for gid in chosen for c in self.groups[gid].completions]
        rollout.metrics["async/partial_rollout_fraction"] = float(np.mean(spanning))
        rollout.metrics["async/dropped_groups"] = float(self._batch_drops)
        rollout.metrics["async/waited_groups"] = float(self._batch_waits)
        self._batch_drops = self._batch_waits = 0
        for gid in chosen:
            self.finished.remove(gid)
            del self.groups[gid]
        self.formed += 1
        future = self._future(self._batches, f)
        future.set_result(rollout)
        return True

    def _score(self, groups: list[_Group]) -> ScoredRollout:
        prompts = {key: [g.row[key] for g in groups] for key in groups[0].row}
        completions = [dataclasses.replace(c, request_index=i) for i, g in enumerate(groups) for c in g.completions]
        return self.score(completions, prompts)

    def _await_published(self, version: int):
        with self._cv:
            while version not in self._published and not self._stop:
                self._cv.wait(timeout=1.0)
            return None if self._stop else self._published.pop(version)

    def _idle(self) -> None:
        with self._cv:
            while not self._stop:
                self._cv.wait(timeout=1.0)

    def _install(self, version: int, states) -> None:
        """Install `version`: every group in flight is taken out of its engine with its
        tokens so far and submitted again as a resumed request (its next step re-prefills
        prompt + tokens under the new weights), exactly what a run resumed from this
        install's snapshot does."""
        partials = self._all_partials(f"install/{version}")
        for gid in self.in_flight:
            if self.groups[gid].future is not None:
                self.groups[gid].future.cancel()
        self.replicas.install(states, version)
        self.version = version
        self._resubmit([(self.groups[gid], partials[gid]) for gid in self.in_flight])
        self._snapshot(version, partials)

    def _all_partials(self, name: str) -> dict[int, PartialRequest]:
        """Every process's groups in flight, their tokens so far (the same on every process)."""
        local = {gid: p.to_json() for gid, p in self._partials().items()} if self.in_flight else {}
        return {gid: PartialRequest.from_json(p) for part in self.exchange(name, local) for gid, p in part.items()}

    def _snapshot(self, version: int, partials: dict[int, PartialRequest]) -> None:
        snap = self._take_snapshot(partials)
        with self._cv:
            future = self._snapshots.setdefault(version, concurrent.futures.Future())
            future.set_result(snap)
            for v in [v for v in self._snapshots if v < version - 2]:
                del self._snapshots[v]

    # ---- checkpoints ---------------------------------------------------------------------

    def _take_snapshot(self, partials: dict[int, PartialRequest]) -> dict:
        with self._cv:
            batches = {i: f.result() for i, f in self._batches.items() if f.done() and i >= self.version}
        return {
            "version": self.version, "prompt_batches": self.prompt_batches, "dropped": self.dropped,
            "formed": self.formed, "segments": self.segments,
            "batch_drops": self._batch_drops, "batch_waits": self._batch_waits,
            "batches": {str(i): rollout_to_json(r) for i, r in sorted(batches.items())},
            "finished": [self.groups[g].to_json(None) for g in self.finished],
            "in_flight": [self.groups[g].to_json(partials[g]) for g in self.in_flight],
            "data_state": self.data_state(),
        }

    def _restore(self, snap: dict) -> None:
        if snap["version"] != self.version:
            raise RuntimeError(f"the checkpoint's rollout stream was taken at policy version {snap['version']}, "
                               f"the restored weights are version {self.version}")
        self.prompt_batches, self.dropped = snap["prompt_batches"], snap["dropped"]
        self.formed, self.segments = snap["formed"], snap["segments"]
        self._batch_drops, self._batch_waits = snap["batch_drops"], snap["batch_waits"]
        for i, data in snap["batches"].items():
            self._future(self._batches, int(i)).set_result(rollout_from_json(data))
        for d in snap["finished"]:
            g = _Group.from_json(d)
            self.groups[g.gid] = g
            self.finished.append(g.gid)
        groups = [_Group.from_json(d) for d in snap["in_flight"]]
        for g in groups:
            self.groups[g.gid] = g
        self._resubmit([(g, g.resume) for g in groups])

    def _resubmit(self, groups: list[tuple[_Group, PartialRequest]]) -> None:
        """Submit groups again from their tokens so far, each replica's in group-id order."""
        self.in_flight = []
        by_replica: dict[int, list[tuple[GenerationRequest, _Group]]] = {}
        for g, partial in sorted(groups, key=lambda pair: pair[0].gid):
            by_replica.setdefault(g.replica, []).append(
                (GenerationRequest(list(g.row["prompt_ids"]), g.params, request_id=g.gid, resume=partial), g))
        for r, pairs in sorted(by_replica.items()):
            self._submit(r, pairs)
        self.in_flight.sort()
        self._oldest = {g.gid: min(v for s in partial.samples for v in s.policy_versions)
                        for g, partial in groups if partial is not None and partial.num_generated}


def on_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` at once, one daemon thread each (a replica stuck in a step must not keep
    the interpreter from exiting), and return their results; the first error is raised."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - raised on the calling thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name="rljax-stream-replica")
               for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def off_policy_metrics(rollout_log_probs: np.ndarray, old_log_probs: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """`async/off_policy_kl`: KL(behaviour || proximal) over the batch's response tokens,
    the k3 estimate mean(r - log r - 1) with r = pi_old / pi_behaviour (Schulman's
    approximation; unbiased, never negative), and `async/off_policy_kl_k1`, mean(log
    pi_behaviour - log pi_old). pi_behaviour: the sampler's log-probs as sampled (each token
    under its own version); pi_old: the trainer's under the version being trained."""
    m = np.asarray(mask, bool)
    if not m.any():
        return {"async/off_policy_kl": 0.0, "async/off_policy_kl_k1": 0.0}
    log_r = (np.asarray(old_log_probs, np.float64) - np.asarray(rollout_log_probs, np.float64))[m]
    return {"async/off_policy_kl": float(np.mean(np.exp(log_r) - log_r - 1.0)),
            "async/off_policy_kl_k1": float(np.mean(-log_r))}


def update_off_policy_metrics(update_metrics: dict[str, float]) -> dict[str, float]:
    """`async/off_policy_kl` and `_k1` when the old log-probs are the sampler's (bypass
    mode: no proximal policy is recomputed, so `off_policy_metrics` would read 0). The
    actor's loss measures the same two quantities against the policy it trains,
    `rollout_corr/k3_kl` and `rollout_corr/kl` (`rljax.algos.rollout_correction.
    compute_offpolicy_metrics`), averaged over the update's micro-batches: in its first
    mini-batch that policy is the proximal one. {} where the loss measured nothing (no
    rollout correction)."""
    if "rollout_corr/k3_kl" not in update_metrics:
        return {}
    return {"async/off_policy_kl": update_metrics["rollout_corr/k3_kl"],
            "async/off_policy_kl_k1": update_metrics["rollout_corr/kl"]}
