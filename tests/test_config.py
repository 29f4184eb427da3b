"""Config: flat access, round trips, and one clear error per bad field."""
import json

import pytest

from jaxdl.algorithms.asp import SSPSettings
from jaxdl.algorithms.easgd import EASGDSettings
from jaxdl.algorithms.local_sgd import LocalSGDSettings
from jaxdl.config import RunConfig, recorded
from jaxdl.validation import validate
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
  assert validate(RunConfig()).config == RunConfig()


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
    ("compute_dtype", "float16", "bfloat16"),
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


def test_settings_are_typed_and_set_by_flat_names():
  config = RunConfig.make(algorithm="ssp", staleness_bound=5, workers=4)
  assert config.algorithm.settings == SSPSettings(staleness_bound=5)
  assert config.settings() == SSPSettings(5) and config.settings_dict() == {"staleness_bound": 5}
  assert config.flat()["staleness_bound"] == 5 and "settings" not in config.flat()
  # Unset: the algorithm's defaults.
  assert RunConfig.make(algorithm="ssp").settings() == SSPSettings()
  assert RunConfig().settings_dict() == {}
  # The setting may come before the algorithm in the same call.
  assert RunConfig.make(staleness_bound=5, algorithm="ssp", workers=4) == config
  assert config.replace(staleness_bound=1).settings() == SSPSettings(1)


@pytest.mark.parametrize("algorithm, flat, owners", [
    ("asp", {"staleness_bound": 3}, "ssp"),
    ("sgd", {"communication_period": 2}, "local_sgd, easgd"),
    ("ssp", {"gossip_probability": 0.5}, "gosgd"),
    ("easgd", {"dc_lambda": 0.1}, "dc_asgd"),
])
def test_a_setting_of_another_algorithm_names_the_flag(algorithm, flat, owners):
  with pytest.raises(ConfigError) as info:
    RunConfig.make(algorithm=algorithm, **flat)
  (field, value), = flat.items()
  assert info.value.field == field and info.value.value == value
  message = str(info.value)
  assert message.startswith("--" + field.replace("_", "-") + "=")
  assert f"a setting of {owners}, not of {algorithm}" in message
  with pytest.raises(ConfigError, match="not of " + algorithm):  # replace too
    RunConfig.make(algorithm=algorithm).replace(**flat)


def test_switching_algorithm_keeps_shared_settings_and_drops_the_others():
  local = RunConfig.make(algorithm="local_sgd", communication_period=7, workers=4)
  easgd = local.replace(algorithm="easgd")
  assert easgd.settings() == EASGDSettings(communication_period=7, elasticity=None)
  back = RunConfig.make(algorithm="easgd", communication_period=8, elasticity=0.5,
                        workers=4).replace(algorithm="local_sgd")
  assert back.settings() == LocalSGDSettings(communication_period=8)
  assert "elasticity" not in back.flat()
  ssp = local.replace(algorithm="ssp")  # nothing shared: its defaults
  assert ssp.settings() == SSPSettings() and "communication_period" not in ssp.flat()
  # A setting given with the switch wins over the kept one.
  assert local.replace(algorithm="easgd", communication_period=2).settings() == EASGDSettings(2)


@pytest.mark.parametrize("flat", [
    dict(algorithm="ssp", staleness_bound=0, workers=4),
    dict(algorithm="easgd", communication_period=8, elasticity=0.25, workers=4),
    dict(algorithm="dc_asgd", dc_lambda=2.0, dc_adaptive=True, dc_beta=0.5, workers=4),
    dict(algorithm="lc_asgd", lc_max_delay=6, workers=4),
    dict(algorithm="gosgd", gossip_probability=1, workers=4),
    dict(algorithm="asp", workers=4),
])
def test_settings_round_trip_through_dict_and_json(flat, tmp_path):
  config = RunConfig.make(**flat)
  d = config.to_dict()
  assert d["algorithm"]["settings"] == config.settings_dict()
  assert RunConfig.from_dict(d) == config
  assert RunConfig.from_dict(config.flat()) == config
  path = tmp_path / "config.json"
  path.write_text(config.to_json())
  loaded = RunConfig.load(str(path))
  assert loaded == config and loaded.settings() == config.settings()


# AlgorithmConfig's fields before settings moved into each algorithm.
_OLD_SETTINGS = dict(communication_period=4, staleness_bound=3, elasticity=None,
                     gossip_probability=0.1, dc_lambda=0.04, dc_adaptive=False, dc_beta=0.95,
                     lc_lambda=0.01, lc_max_delay=None)


def _old_layout(config: RunConfig, **settings) -> dict:
  """`config` as a config.json written before settings had their own entry."""
  d = config.to_dict()
  del d["algorithm"]["settings"]
  d["algorithm"].update(_OLD_SETTINGS, **settings)
  return d


@pytest.mark.parametrize("flat, old, kept", [
    (dict(algorithm="ssp", workers=4), dict(staleness_bound=5, communication_period=9),
     dict(staleness_bound=5)),
    (dict(algorithm="easgd", workers=4), dict(communication_period=8, elasticity=0.5),
     dict(communication_period=8, elasticity=0.5)),
    (dict(algorithm="lc_asgd", workers=4), dict(lc_lambda=0.2, dc_lambda=3.0),
     dict(lc_lambda=0.2, lc_max_delay=None)),
    (dict(algorithm="asp", workers=4), dict(staleness_bound=1), {}),
    (dict(lr=0.3), dict(gossip_probability=0.9), {}),
])
def test_an_old_config_json_keeps_only_its_algorithms_settings(flat, old, kept, tmp_path):
  config = RunConfig.make(**flat, **kept)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(_old_layout(config, **old)))
  loaded = RunConfig.load(str(path))
  assert loaded == config
  assert loaded.settings_dict() == kept
  for name in set(_OLD_SETTINGS) - set(kept):
    assert name not in loaded.flat()


@pytest.mark.parametrize("flat, fragment", [
    (dict(model="transformer", dataset="python_docs"), "float32 for a text model"),
    (dict(algorithm="bsp", parallelism="pipeline", stages=2, workers=2),
     "float32 with --parallelism pipeline"),
    (dict(algorithm="bsp", parallelism="tensor", workers=2),
     "float32 with --parallelism tensor"),
])
def test_bfloat16_is_for_image_models_with_data_parallelism(flat, fragment):
  with pytest.raises(ConfigError) as info:
    validate(RunConfig.make(compute_dtype="bfloat16", **flat))
  assert info.value.field == "compute_dtype" and fragment in str(info.value)
  validate(RunConfig.make(**flat))  # the same config computing in float32 is valid


@pytest.mark.parametrize("flat, field", [
    (dict(algorithm="ssp", staleness_bound="abc"), "staleness_bound"),
    (dict(algorithm="ssp", staleness_bound=-1), "staleness_bound"),
    (dict(algorithm="ssp", staleness_bound=1.5), "staleness_bound"),
    (dict(algorithm="gosgd", gossip_probability=5), "gossip_probability"),
    (dict(algorithm="gosgd", gossip_probability=float("nan")), "gossip_probability"),
    (dict(algorithm="dc_asgd", dc_beta=1.0), "dc_beta"),
    (dict(algorithm="dc_asgd", dc_lambda=-0.1), "dc_lambda"),
    (dict(algorithm="dc_asgd", dc_adaptive="yes"), "dc_adaptive"),
    (dict(algorithm="easgd", communication_period=0), "communication_period"),
    (dict(algorithm="easgd", elasticity=1.5), "elasticity"),
    (dict(algorithm="local_sgd", communication_period=0), "communication_period"),
    (dict(algorithm="lc_asgd", lc_max_delay=0), "lc_max_delay"),
    (dict(algorithm="lc_asgd", lc_lambda=-1.0), "lc_lambda"),
])
def test_bad_settings_are_config_errors_naming_the_field(flat, field):
  value = flat[field]
  with pytest.raises(ConfigError) as info:
    RunConfig.make(**flat)
  assert info.value.field == field
  assert info.value.value == value or info.value.value != info.value.value  # nan
  message = str(info.value)
  assert message.startswith("--" + field.replace("_", "-") + "=") and "\n" not in message
  # The same from a config.json.
  d = RunConfig.make(algorithm=flat["algorithm"]).to_dict()
  d["algorithm"]["settings"][field] = value
  with pytest.raises(ConfigError) as info:
    RunConfig.from_dict(d)
  assert info.value.field == field


def test_a_recorded_config_chooses_anew_what_a_rule_chose(tmp_path):
  """config.json holds the values asp's rule chose for 4 workers (lr 0.05 /
  sqrt(4), momentum max(0, 0.9 - 3/4)); read back, they are chosen anew: the
  same for 4 workers, 2's own for 2, and a value edited in the file is kept."""
  config = RunConfig.make(algorithm="asp", workers=4)
  written = recorded(config, validate(config).optim)
  assert (written["optim"]["lr"], written["optim"]["momentum"]) == pytest.approx((0.025, 0.15))
  assert set(written["defaults_applied"]) == {"optimizer", "lr", "momentum", "weight_decay"}
  path = tmp_path / "config.json"
  path.write_text(json.dumps(written))
  assert RunConfig.load(str(path)) == config  # what no flag set is unset again
  two = validate(RunConfig.load(str(path)).replace(workers=2)).optim
  assert (two.lr, two.momentum) == pytest.approx((0.05 / 2**0.5, 0.4))
  written["optim"]["lr"] = 0.01
  path.write_text(json.dumps(written))
  edited = validate(RunConfig.load(str(path)).replace(workers=2)).optim
  assert (edited.lr, edited.momentum) == pytest.approx((0.01, 0.4))
  # what the user set is the user's, not a rule's
  own = config.replace(lr=0.1)
  assert recorded(own, validate(own).optim)["defaults_applied"].get("lr") is None
