"""The environment / user-simulator interface for multi-turn interaction without tools.

When an episode has an `Environment`, every assistant turn goes to `Environment.step`
instead of the tool-call parser: the environment answers with observation messages (usually
one ``{"role": "user", ...}`` message from a simulated user or a game), a reward for that
step, and whether the episode is over. Observation messages are appended to the trajectory
exactly like tool results: rendered once as a chat-template delta, masked 0.

Lifecycle per episode: construct (one instance per episode) -> ``await reset()`` (initial
messages, appended after the episode's own messages to form the prompt) -> ``await step(text)``
per assistant turn -> ``await close()`` (always, also on errors).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple


class EnvStep(NamedTuple):
    """What `Environment.step` returns; unpacks as ``(messages, reward, done)``."""

    messages: list[dict[str, Any]]
    reward: float
    done: bool


class Environment(ABC):
    """A per-episode interactive environment (user simulator, game, verifier dialogue)."""

    @abstractmethod
    async def reset(self) -> list[dict[str, Any]]:
        """Initial messages of the conversation (may be empty)."""

    @abstractmethod
    async def step(self, assistant_text: str) -> EnvStep | tuple[list[dict[str, Any]], float, bool]:
        """React to the decoded assistant turn (stop token removed)."""

    async def close(self) -> None:
        """Free resources; called once at the end of the episode."""
        return None
