"""Multi-turn agent rollouts with token-in-token-out trajectories.

- `protocol`: the sampler API the loop calls (`AsyncSampler`, `TurnRequest`, `TurnOutput`).
- `loop`: the per-episode state machine, `AgentLoop`, `run_episodes`, `collect_metrics`.
- `chat`: prompt and observation-delta rendering (the boundary convention lives there).
- `trajectory`: the token buffer, `Trajectory`, `pack_trajectories`.
- `parser`: tool-call formats (hermes/qwen, llama3_json) in a registry.
- `tools`: the `Tool` interface, calculator, python sandbox, YAML registry.
- `environment`: the user-simulator / environment interface.
- `config`: `AgentConfig`.
- `rollout_adapter`: `RolloutSamplerAdapter` for `rljax.rollout.Sampler` (imported lazily).
"""

from rljax.agent.chat import ChatFormatter, ChatTemplateError
from rljax.agent.config import AgentConfig, EnvironmentConfig
from rljax.agent.environment import Environment, EnvStep
from rljax.agent.loop import AgentLoop, Episode, EpisodeState, collect_metrics, run_episodes
from rljax.agent.parser import ToolCall, ToolCallParser, get_tool_parser, register_tool_parser
from rljax.agent.protocol import AsyncSampler, TurnOutput, TurnRequest
from rljax.agent.rollout_adapter import RolloutSamplerAdapter
from rljax.agent.trajectory import Trajectory, TrajectoryBuilder, pack_trajectories

__all__ = [
    "AgentConfig", "AgentLoop", "AsyncSampler", "ChatFormatter", "ChatTemplateError",
    "TurnOutput", "EnvStep", "Environment", "EnvironmentConfig", "Episode", "EpisodeState",
    "TurnRequest", "RolloutSamplerAdapter", "ToolCall", "ToolCallParser", "Trajectory", "TrajectoryBuilder",
    "collect_metrics", "get_tool_parser", "pack_trajectories", "register_tool_parser",
    "run_episodes",
]
