"""A reward function loaded from a Python file, as verl's ``custom_reward_function``
(in an RL config, under ``reward``)::

    reward:
      custom_reward_function:
        path: /path/to/my_reward.py
        name: compute_score          # default
        reward_kwargs: {alpha: 0.5}  # optional, passed to every call as keyword arguments

`FileRewardFn` holds the path, not the function, so it pickles to reward worker
processes (spawn / forkserver), each of which imports the file once. A custom function
runs there in every ``reward.mode`` (it may hang or call ``os._exit``) unless
``reward.trust_custom_reward: true`` runs it inline (`rljax.rewards.manager`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

_MODULES: dict[str, ModuleType] = {}


class CustomRewardError(ValueError):
    """The custom reward file or function cannot be loaded."""


def load_module_from_path(path: str) -> ModuleType:
    """Import a Python file by path (once per process); errors name the file."""
    path = os.path.abspath(os.path.expanduser(path))
    if path in _MODULES:
        return _MODULES[path]
    if not os.path.isfile(path):
        raise CustomRewardError(f"custom_reward_function.path: no such file {path!r}")
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    module_name = f"rljax_custom_reward_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CustomRewardError(f"custom_reward_function.path: cannot import {path!r} (not a Python file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets the module's own objects pickle by reference
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise CustomRewardError(f"custom_reward_function.path: importing {path!r} failed: {type(e).__name__}: {e}") from e
    _MODULES[path] = module
    return module


def load_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """The callable `name` of the file `path`."""
    module = load_module_from_path(path)
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise CustomRewardError(
            f"custom_reward_function.name: {path!r} has no function {name!r}; it defines {public}"
        )
    if not callable(fn):
        raise CustomRewardError(f"custom_reward_function.name: {name!r} in {path!r} is not callable")
    return fn


@dataclass(frozen=True)
class FileRewardFn:
    """Picklable reward function ``name`` of file ``path``, called with verl's keyword
    arguments plus `reward_kwargs`."""

    path: str
    name: str = "compute_score"
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.path.abspath(os.path.expanduser(self.path)))

    def load(self) -> Callable[..., Any]:
        return load_function(self.path, self.name)

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
    ) -> Any:
        return self.load()(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
            **{**self.reward_kwargs, **kwargs},
        )


def custom_reward_fn_from_config(config: Mapping[str, Any] | None) -> FileRewardFn | None:
    """`FileRewardFn` for a ``custom_reward_function`` config block (None when it has no
    path); loads it once here so a missing file or function fails at startup."""
    if not config or not config.get("path"):
        return None
    unknown = set(config) - {"path", "name", "reward_kwargs"}
    if unknown:
        raise CustomRewardError(f"custom_reward_function: unknown key(s) {sorted(unknown)}; expected path, name, reward_kwargs")
    fn = FileRewardFn(str(config["path"]), str(config.get("name") or "compute_score"), dict(config.get("reward_kwargs") or {}))
    fn.load()
    return fn
