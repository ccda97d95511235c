"""Multi-turn agent rollouts with token-in-token-out trajectories.

- `protocol`: the sampler API the loop calls (`AsyncSampler`, `TurnRequest`, `TurnOutput`).
- `loop`: the per-episode state machine, `AgentLoop`, `run_episodes`, `collect_metrics`.
- `chat_deltas`: prompt and observation-delta rendering (the boundary convention lives there).
- `trajectory`: the token buffer, `Trajectory`, `pack_trajectories`.
- `parser`: tool-call formats (hermes/qwen, llama3_json) in a registry.
- `tools`: the `Tool` interface, calculator, python sandbox, YAML registry.
- `environment`: the user-simulator / environment interface.
- `config`: `AgentConfig`.
- `rollout_adapter`: `RolloutSamplerAdapter` for `rljax.rollout.Sampler`.

The names below are imported from their module on first use (`from rljax.agent import
AgentLoop` works as usual): importing the package, or one light module of it such as
`rljax.agent.config`, loads neither the loop nor the tools and their sandbox.
"""

from __future__ import annotations

from rljax.lazy import lazy_exports

# public name -> the module under rljax.agent that defines it
_EXPORTS: dict[str, str] = {
    "ChatFormatter": "chat_deltas", "ChatTemplateError": "chat_deltas",
    "AgentConfig": "config", "EnvironmentConfig": "config",
    "Environment": "environment", "EnvStep": "environment",
    "AgentLoop": "loop", "Episode": "loop", "EpisodeState": "loop", "collect_metrics": "loop",
    "run_episodes": "loop",
    "ToolCall": "parser", "ToolCallParser": "parser", "get_tool_parser": "parser",
    "register_tool_parser": "parser",
    "AsyncSampler": "protocol", "TurnOutput": "protocol", "TurnRequest": "protocol",
    "RolloutSamplerAdapter": "rollout_adapter",
    "Trajectory": "trajectory", "TrajectoryBuilder": "trajectory", "pack_trajectories": "trajectory",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
