"""Config: flat access, round trips, and one clear error per bad field."""
import json

import pytest

from jaxdl.config import RunConfig, validate
from jaxdl.errors import ConfigError


def test_flat_names_reach_their_sections():
  config = RunConfig.make(dataset="mnist", lr=0.1, workers=4, seed=3)
  assert config.data.dataset == "mnist"
  assert config.optim.lr == 0.1
  assert config.algorithm.workers == 4
  assert config.train.seed == 3
  assert config.replace(lr=0.2).optim.lr == 0.2
  assert config.optim.lr == 0.1  # frozen: replace copies


def test_unknown_field_is_a_config_error():
  with pytest.raises(ConfigError, match="--learning-rate"):
    RunConfig.make(learning_rate=0.1)


def test_round_trips_through_json(tmp_path):
  config = RunConfig.make(lr_milestones=(3.0, 6.0), schedule="step", opt_args='{"b2": 0.9}')
  path = tmp_path / "config.json"
  path.write_text(config.to_json())
  assert RunConfig.load(str(path)) == config
  assert RunConfig.from_dict(config.flat()) == config
  assert json.loads(path.read_text())["optim"]["lr_milestones"] == [3.0, 6.0]


def test_unreadable_config_file_names_the_path(tmp_path):
  with pytest.raises(ConfigError, match="config"):
    RunConfig.load(str(tmp_path / "missing.json"))


def test_default_config_is_valid():
  assert validate(RunConfig()) == RunConfig()


@pytest.mark.parametrize("field,value,fragment", [
    ("workers", 0, "> 0"),
    ("workers", -2, "> 0"),
    ("batch_size", 0, "> 0"),
    ("lr", 0.0, "> 0"),
    ("lr", -0.1, "> 0"),
    ("lr", float("nan"), "> 0"),
    ("steps", 0, "> 0"),
    ("epochs", 0.0, "> 0"),
    ("dataset", "cifar", "digits"),
    ("model", "resnet1000", "resnet18"),
    ("optimizer", "adamm", "adamw"),
    ("algorithm", "bogus", "sgd"),
    ("opt_args", "{not json", "JSON"),
    ("opt_args", '{"momentum_x": 1}', "b1"),
    ("lr_decay", 2.0, "(0, 1]"),
    ("warmup_steps", -1, ">= 0"),
])
def test_bad_values_name_field_value_and_allowed(field, value, fragment):
  optimizer = {"opt_args": "adam"}.get(field, "sgd")
  with pytest.raises(ConfigError) as info:
    validate(RunConfig.make(**{field: value, "optimizer": optimizer}
                            if field != "optimizer" else {field: value}))
  message = str(info.value)
  assert message.startswith("--" + field.replace("_", "-") + "=")
  assert repr(value) in message or str(value) in message
  assert fragment in message
  assert "\n" not in message


def test_sgd_runs_one_worker_only():
  with pytest.raises(ConfigError, match="--workers=4 .*at most 1"):
    validate(RunConfig.make(workers=4))
