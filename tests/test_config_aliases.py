"""Aliases (`data.train_batch_size` for `data.batch_size`) resolve when a config is loaded:
the config and its saved file carry one key, an override under either name holds on a
reload (a resumed run), and the two names with different values are one clear error."""

import dataclasses

import pytest
import yaml

from rljax.config import ConfigError, alias, load_config, save_config
from rljax.rl.config import RLConfig
from rljax.train.run_config import RunConfig


def _saved(tmp_path, cls, overrides):
    path = str(tmp_path / "config.yaml")
    save_config(load_config(cls, None, overrides), path)
    return path


@pytest.mark.parametrize("cls", [RunConfig, RLConfig])
def test_saved_config_carries_one_key(tmp_path, cls):
    path = _saved(tmp_path, cls, ["data.train_batch_size=16"])
    with open(path) as f:
        data = yaml.safe_load(f)["data"]
    assert data["batch_size"] == 16 and "train_batch_size" not in data


@pytest.mark.parametrize("saved_with,override", [
    ("data.train_batch_size=16", "data.train_batch_size=32"),
    ("data.train_batch_size=16", "data.batch_size=32"),
    ("data.batch_size=16", "data.train_batch_size=32"),
    ("data.batch_size=16", "data.batch_size=32"),
])
def test_override_of_either_name_holds_on_reload(tmp_path, saved_with, override):
    path = _saved(tmp_path, RLConfig, [saved_with])
    assert load_config(RLConfig, path).data.batch_size == 16
    assert load_config(RLConfig, path, [override]).data.batch_size == 32


@pytest.mark.parametrize("override", ["data.batch_size=32", "data.train_batch_size=32"])
def test_override_replaces_a_file_that_has_both_names(tmp_path, override):
    """A config file that sets both names (to the same value) still takes the override."""
    path = tmp_path / "config.yaml"
    path.write_text("data: {batch_size: 16, train_batch_size: 16}\n")
    assert load_config(RunConfig, str(path)).data.batch_size == 16
    assert load_config(RunConfig, str(path), [override]).data.batch_size == 32


def test_both_names_with_different_values_is_an_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("data: {batch_size: 8, train_batch_size: 16}\n")
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, str(path))
    assert str(info.value) == ("data.batch_size=8 and data.train_batch_size=16: two names of one setting with "
                               "different values; set one")


def test_alias_is_general_field_metadata():
    """Any section can declare an alias; a null under one name yields to the other."""
    from rljax.config import from_dict

    @dataclasses.dataclass(frozen=True)
    class Section:
        steps: int = dataclasses.field(default=1, metadata=alias("total_steps"))  # steps

    @dataclasses.dataclass(frozen=True)
    class Root:
        section: Section = dataclasses.field(default_factory=Section)  # a section

    assert from_dict(Root, {"section": {"total_steps": 5}}).section.steps == 5
    assert from_dict(Root, {"section": {"total_steps": 5, "steps": 5}}).section.steps == 5
    assert from_dict(Root, {"section": {"total_steps": None, "steps": 4}}).section.steps == 4
    with pytest.raises(ConfigError, match=r"^section\.steps=4 and section\.total_steps=5: "):
        from_dict(Root, {"section": {"total_steps": 5, "steps": 4}})
    with pytest.raises(ConfigError, match=r"^unknown config key 'section\.total_step'"):
        load_config(Root, None, ["section.total_step=3"])
    assert load_config(Root, None, ["section.total_steps=3"]).section.steps == 3
