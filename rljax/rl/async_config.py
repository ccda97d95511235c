"""The RL loop's scheduling: `trainer.mode` (`RLTrainerConfig`, the shared `trainer:`
section plus the mode) and the `async:` section (`AsyncConfig`), and how the devices
split between the trainer and the rollout replicas in the asynchronous modes
(`split_devices`).

    sync          generate, then train, on the same devices (the trainer's mesh covers them all)
    one_step_off  the rollout replicas sample step k+1's prompts on their own devices while the
                  trainer trains on step k's batch (`rljax.rl.async_producer.OneStepOffProducer`)
    async         the rollout replicas sample a stream of prompt groups on their own devices, taking
                  new weights between segments of engine steps (in-flight groups continue under them:
                  partial rollouts); a group is trained at most `async.max_staleness` versions after
                  the oldest version that sampled any of its tokens (`rljax.rl.async_stream`)

`async` is a Python keyword, so the section's field is `async_`; YAML files and overrides
write `async:` (an alias, `rljax.config.alias`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from rljax.config import ConfigError, Devices, NonNegFloat, NonNegSteps, Steps
from rljax.train.run_sections import TrainerConfig

Mode = Literal["sync", "one_step_off", "async"]
OnStale = Literal["wait", "drop"]


@dataclass(frozen=True)
class RLTrainerConfig(TrainerConfig):
    """The loop: steps, micro-batches, checkpoints, validation, logging (verl: `trainer`),
    and how rollouts and updates are scheduled (`mode`)."""

    # sync: each step samples with its own weights, then trains (on-policy); one_step_off: step k+1's
    # prompts are sampled by the weights of step k on the rollout devices while step k trains, so a
    # batch is at most one version old; async: the rollout devices sample a stream of groups, taking new
    # weights between segments, each group trained within async.max_staleness versions (docs/async.md)
    mode: Mode = "sync"


@dataclass(frozen=True)
class AsyncConfig:
    """What the asynchronous modes (`trainer.mode` other than sync) need."""

    # devices of each process that run the rollout replicas (the rest train); 0: half of each process's
    rollout_devices: Devices = 0
    # seconds the trainer waits for a rollout (or for the sampler to go idle before a weight update)
    # before it stops with an error naming the stalled batch; 0: wait forever
    timeout_s: NonNegFloat = 1800.0
    # trainer.mode=async: a group is trained at most this many policy versions after the oldest version
    # that sampled any of its tokens; also bounds admission (at most (version + max_staleness + 1) x
    # data.batch_size groups ever admitted at a version). 0: every batch on-policy, as trainer.mode=sync
    max_staleness: NonNegSteps = 1
    # trainer.mode=async, a group still sampling when the batch it must join is formed: wait (the batch
    # waits for it) or drop (it is aborted and counted in async/dropped_groups)
    on_stale: OnStale = "wait"
    # trainer.mode=async: engine steps the rollout replicas run between two decision points (weight
    # installs, admissions, finished groups handed over); a smaller segment takes new weights sooner
    segment_steps: Steps = 16


@dataclass(frozen=True)
class DeviceSplit:
    """The devices of the trainer's mesh and of the rollout replicas (process-major, then
    by id; disjoint). `sync`: both are every device."""

    trainer: tuple
    rollout: tuple


def split_devices(devices: Sequence, mode: str, rollout_devices: int) -> DeviceSplit:
    """Each process's first `rollout_devices` devices (by id; 0: half of them) sample, the
    others train; `sync`: every device does both. A pure function of the device list, so
    every process computes the same split, and each process keeps devices of both kinds
    (a rollout replica stays on its host). Raises ConfigError naming `async.rollout_devices`
    when a process would be left without devices of either kind."""
    ordered = tuple(sorted(devices, key=lambda d: (d.process_index, d.id)))
    if mode == "sync":
        return DeviceSplit(ordered, ordered)
    by_process: dict[int, list] = {}
    for d in ordered:
        by_process.setdefault(d.process_index, []).append(d)
    trainer, rollout = [], []
    for process, local in by_process.items():
        k = rollout_devices or len(local) // 2
        if not 0 < k < len(local):
            raise ConfigError(f"async.rollout_devices={rollout_devices}: process {process} has {len(local)} devices; "
                              f"trainer.mode={mode} needs at least one for the rollout and one for the trainer")
        rollout += local[:k]
        trainer += local[k:]
    return DeviceSplit(tuple(trainer), tuple(rollout))


def check_mode(cfg) -> None:
    """What an asynchronous `trainer.mode` needs of the rest of an `RLConfig` (run by
    `RLConfig.check`): rollout replicas (`rollout.tensor_parallel_size >= 1`), and no
    reward model or verifier (their forwards run on the trainer's mesh)."""
    mode = cfg.trainer.mode
    if mode == "sync":
        return
    if not cfg.rollout.tensor_parallel_size:
        raise ConfigError(f"trainer.mode={mode}: the sampler needs devices of its own; set "
                          "rollout.tensor_parallel_size >= 1 (devices per rollout replica)")
    if mode == "async":
        check_async(cfg)
    if cfg.reward.reward_model.enable or cfg.reward.verifier.enable:
        raise ConfigError(f"trainer.mode={mode}: reward.reward_model / reward.verifier run on the trainer's devices "
                          "while it trains; use trainer.mode=sync")


def check_async(cfg) -> None:
    """What `trainer.mode: async` does not combine with (one line naming the key)."""
    alg = cfg.algorithm
    from rljax.algos.registry import get_adv_estimator

    refused = [(cfg.agent is not None, "agent: agent episodes"),
               (alg.filter_groups.enable, "algorithm.filter_groups.enable: DAPO's dynamic sampling"),
               (cfg.actor.router_replay, "actor.router_replay: the experts the sampler routed to"),
               (get_adv_estimator(alg.adv_estimator).needs_greedy_baseline,
                f"algorithm.adv_estimator={alg.adv_estimator}: a greedy rollout per batch")]
    for bad, what in refused:
        if bad:
            raise ConfigError(f"trainer.mode=async: {what} needs whole batches sampled by one version; "
                              "use trainer.mode=one_step_off or sync")


def check_processes(cfg, processes: int, local_devices: int) -> None:
    """What an asynchronous `trainer.mode` needs of a run of several `processes` with
    `local_devices` each: as many devices for the rollout as for the trainer on every
    process (the weights cross in one program over both sets, pairing each trainer device
    with a rollout device of its process: `rljax.rollout.cross_transfer`)."""
    if processes == 1 or cfg.trainer.mode == "sync":
        return
    if cfg.trainer.mode == "async" and cfg.data.val_files:
        raise ConfigError(f"data.val_files: trainer.mode=async validates on the trainer's devices, which a run of "
                          f"{processes} processes cannot sample on; validate with `rljax eval` on a checkpoint, or "
                          "use trainer.mode=one_step_off")
    k = cfg.async_.rollout_devices or local_devices // 2
    if 2 * k != local_devices:
        raise ConfigError(f"async.rollout_devices={cfg.async_.rollout_devices}: a run of {processes} processes in "
                          f"trainer.mode={cfg.trainer.mode} gives half of each process's {local_devices} devices to the "
                          "rollout (the weight transfer pairs each trainer device with a rollout device); set it to 0")


def device_counts(cfg, num_devices: int, num_processes: int) -> tuple[int, int]:
    """(trainer devices, rollout devices) of `split_devices` on `num_devices` devices
    spread evenly over `num_processes` processes (`sync`: every device for both)."""
    mode = cfg.trainer.mode
    if mode == "sync":
        return num_devices, num_devices
    local = num_devices // num_processes
    k = cfg.async_.rollout_devices or local // 2
    if not 0 < k < local:
        raise ConfigError(f"async.rollout_devices={cfg.async_.rollout_devices}: each process has {local} devices; "
                          f"trainer.mode={mode} needs at least one for the rollout and one for the trainer")
    return (local - k) * num_processes, k * num_processes


def run_split(cfg) -> DeviceSplit:
    """`split_devices` of this run's devices (`jax.devices()`) under `cfg`'s mode."""
    import jax

    return split_devices(jax.devices(), cfg.trainer.mode, cfg.async_.rollout_devices)
