"""Field comments: read from the source, shown by `rljax config show`, and the generated
reference `docs/config.md` kept equal to the code."""

import dataclasses
import glob
import os
import typing

import pytest
import yaml

from rljax.cli import main as cli_main
from rljax.commands.config import config_docs, show_yaml, type_text
from rljax.config import Bounds, PositiveInt, field_comments, from_dict, load_config
from rljax.rl.config import RLConfig
from rljax.rollout.config import SamplerConfig
from rljax.train.run_config import RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))


@dataclasses.dataclass(frozen=True)
class Commented:
    plain: int = 1  # on its line
    # above it,
    # on two lines
    above: str = "x"
    spans: tuple[int, ...] = (  # where the field starts
        1, 2)
    bare: float = 0.5
    hash_in_default: str = "#not a comment"
    # a comment a blank line keeps from the next field

    second: int = 2
    # a comment after the last field


def test_field_comments_read_both_styles_from_the_source():
    assert field_comments(Commented) == {
        "plain": "on its line",
        "above": "above it, on two lines",
        "spans": "where the field starts",
        "bare": "",
        "hash_in_default": "",
        "second": "",
    }


def _sections(cls, seen):
    """Every dataclass reachable from `cls` through its fields."""
    if cls in seen:
        return
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        for option in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(option):
                _sections(option, seen)


def test_every_field_of_every_section_has_a_comment():
    seen: set = set()
    for root in (RunConfig, RLConfig, SamplerConfig):
        _sections(root, seen)
    missing = [f"{cls.__module__}.{cls.__name__}.{name}" for cls in seen
               for name, comment in field_comments(cls).items() if not comment]
    assert not missing, missing


def test_docs_config_md_is_generated_from_the_code():
    """Regenerate with `python -m rljax.cli config docs > docs/config.md`."""
    with open(os.path.join(REPO, "docs", "config.md")) as f:
        assert f.read() == config_docs(), "docs/config.md is stale: run `rljax config docs > docs/config.md`"


def test_docs_list_every_key_with_its_type_and_default():
    docs = config_docs()
    for row in ("| `data.batch_size` | `int in [1, 1048576]` | `8` | rows per step, global (RL: prompts, x rollout.n responses) "
                "(alias: train_batch_size) |",
                "| `trainer.algorithm` | `str` | `grpo` |",  # the RL config's default, not TrainerConfig's
                "| `rollout.top_p` | `float in (0, 1]` | `1.0` |",
                "| `agent.overflow` | `truncate \\| end` | `truncate` |",
                "| `agent.max_tokens_per_turn` | `int in [1, 4194304] \\| null` | `null` |",
                "| `dpo.label_smoothing` | `float in [0, 0.5]` | `0.0` |"):
        assert row in docs, row
    keys = {line.split("|")[1].strip().strip("`") for line in docs.splitlines() if line.startswith("| `")}
    assert {"actor.policy_loss.loss_mode", "agent.environment.class_name", "mesh.fsdp", "optim.lr",
            "actor.optim.lr", "warmup_sft.steps", "model.lora.rank"} <= keys


def test_type_text():
    assert type_text(typing.Annotated[int, Bounds(ge=0, lt=2**32)]) == "int in [0, 4294967296)"
    assert type_text(PositiveInt | None) == "int >= 1 | null"
    assert type_text(typing.Annotated[float, Bounds(le=1)]) == "float <= 1"
    assert type_text(tuple[float, float]) == "[float, float]"
    assert type_text(tuple[str, ...]) == "list[str]"
    assert type_text(dict[str, typing.Any]) == "mapping"


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_show_prints_every_key_with_its_comment_and_loads_back(path):
    from rljax.commands.run_kinds import config_class

    cls = config_class(path, [])
    cfg = load_config(cls, path)
    text = show_yaml(cfg)
    assert from_dict(cls, yaml.safe_load(text)) == cfg
    for line in text.splitlines():
        assert " # " in line, line  # every key, sections included, has its comment


def test_config_show_command(capsys):
    path = os.path.join(REPO, "configs", "quickstart.yaml")
    assert cli_main(["config", "show", path, "data.train_batch_size=64", "rollout.n=3"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert data["data"]["batch_size"] == 64 and "train_batch_size" not in data["data"]
    assert data["rollout"]["n"] == 3 and data["trainer"]["algorithm"] == "grpo"
    line = next(line for line in out.splitlines() if line.strip().startswith("batch_size:"))
    assert line.split("#", 1)[1].strip() == "rows per step, global (RL: prompts, x rollout.n responses) " \
                                             "(alias: train_batch_size)"


def test_config_show_reports_a_bad_override(capsys):
    path = os.path.join(REPO, "configs", "quickstart.yaml")
    assert cli_main(["config", "show", path, "rollout.n=0"]) == 2
    assert capsys.readouterr().err.startswith("rljax: error: rollout.n: must be >= 1, got 0\n")


def test_sections_are_frozen():
    from rljax.agent.config import AgentConfig, EnvironmentConfig
    from rljax.data.config import DataConfig
    from rljax.parallel import MeshConfig
    from rljax.rollout.config import KVCacheConfig
    from rljax.train.objectives import DPOConfig, RMConfig
    from rljax.train.optim import OptimConfig
    from rljax.train.run_sections import ModelRunConfig, TrainerConfig

    for cls in (RunConfig, ModelRunConfig, TrainerConfig, DataConfig, OptimConfig, MeshConfig, DPOConfig, RMConfig,
                AgentConfig, EnvironmentConfig, SamplerConfig, KVCacheConfig):
        assert cls.__dataclass_params__.frozen, cls.__name__
