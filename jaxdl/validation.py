"""The one validation of a run's config, before anything is written.

`validate(config)` asks every owner to check its own fields: the number
limits every field shares (here), the data, the model, the optimizer, the
cluster and the distributed setup (their modules), the partition policy, the
algorithm (its spec), the engine that runs it (its class) and the model
parallelism. It returns a `Plan`: the config with what the validation chose
(the algorithm's spec, the engine, the optimizer's filled section, each
worker's batch size), so that nothing is checked or chosen twice.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from jaxdl import (algorithms, cluster, data, distributed, engines, models, optim, parallel,
                   rundir)
from jaxdl.algorithms import ALGORITHMS, AlgorithmSpec
from jaxdl.algorithms.compression import parse_compress
from jaxdl.config import TASK_PREFIX, OptimConfig, RunConfig, field_types, settings_types
from jaxdl.errors import ConfigError, positive
from jaxdl.partition import Policy

INT_LIMIT = 2**31
"""Every integer field (a count, a period, a bound) is below this in
magnitude: JAX's integers are int32 (x64 off), in which a step count or a
worker's index past it would wrap."""
SEED_LIMIT = 2**32
"""Seeds are in [0, SEED_LIMIT): jax.random.key keeps a seed's low 32 bits
(x64 off; 2**32 gives seed 0's key), and numpy's generators take no negative seed."""
FLOAT_LIMIT = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max
"""Every number field is at most this in magnitude: JAX computes in float32,
in which a larger rate, time or factor (or an infinite one) is infinite. (NaN
fails each field's own range.)"""


@dataclasses.dataclass(frozen=True)
class Plan:
  """A validated config and what its validation chose.

  Attributes:
    config: the run's config, as given.
    spec: the algorithm's registry entry.
    engine: the name of the engine that runs it (--engine, or auto's choice).
    optim: the optimizer section with every unset field filled (by the
      algorithm's defaults for its M workers, else jaxdl.optim's).
    policy: the partition policy of the global batch.
  """
  config: RunConfig
  spec: AlgorithmSpec
  engine: str
  optim: OptimConfig
  policy: Policy

  @property
  def batch_sizes(self) -> tuple[int, ...]:
    """Each worker's batch size (M of them: asked once the data has bounded M)."""
    return data.batch_sizes(self.config)


def _holds(hint: Any, kind: type) -> bool:
  """Whether a field of type `hint` holds values of `kind` (alone, in a list, or unset)."""
  return hint is kind or any(_holds(a, kind) for a in typing.get_args(hint))


def check_numbers(values: dict[str, Any], hints: dict[str, Any]) -> None:
  """Refuses a value of an integer field (`hints`: each field's type) that
  int32 does not hold (a seed: outside [0, SEED_LIMIT)), and one of a number
  field past float32's range."""
  for field, value in values.items():
    hint, items = hints.get(field), value if isinstance(value, (tuple, list)) else (value,)
    if field in ("seed", "seeds") and _holds(hint, int) and value is not None:  # (--seeds: each)
      if not all(isinstance(v, int) and 0 <= v < SEED_LIMIT for v in items):
        raise ConfigError(field, value, "an integer in [0, 2**32): jax.random.key keeps a "
                          "seed's low 32 bits")
    elif _holds(hint, int) and any(isinstance(v, int) and abs(v) >= INT_LIMIT for v in items):
      raise ConfigError(field, value, "an integer below 2**31 in magnitude (JAX's integers "
                        "are int32)")
    elif _holds(hint, float) and any(isinstance(v, (int, float)) and abs(v) > FLOAT_LIMIT
                                     for v in items):
      raise ConfigError(field, value, f"a number at most {FLOAT_LIMIT:.4g} in magnitude (JAX "
                        "computes in float32)")


def check_target(target: float | None, metric: str = "test_accuracy",
                 field: str = "target") -> None:
  """A target score: unset, an accuracy in (0, 1], or another metric's
  positive value (`field`: the flag that set it)."""
  t = target
  if t is None:
    return
  if metric == "test_accuracy" and not (math.isfinite(t) and 0 < t <= 1):
    raise ConfigError(field, t, "an accuracy in (0, 1], or unset" +
                      (" (95% of SGD's)" if field == "target" else ""))
  if not (math.isfinite(t) and t > 0):
    raise ConfigError(field, t, f"a {metric.replace('_', ' ')} > 0, or unset" +
                      (" (105% of SGD's)" if field == "target" else ""))


def _check_run_fields(c: dict[str, Any]) -> None:
  """The training loop's and the output's own fields (the runner's)."""
  for field in ("out", "config", "replay", "data_dir"):
    if c[field] is not None:
      rundir.check_path(field, c[field])
  for field in ("epochs", "log_every", "keep_checkpoints"):
    positive(field, c[field])
  for field in ("steps", "target_accuracy", "price_per_device_hour"):
    positive(field, c[field], allow_none=True)  # (the target's range: by its metric, later)
  for field in ("eval_every", "checkpoint_every"):
    positive(field, c[field], zero=True)
  if c["resume"] and c["overwrite"]:
    raise ConfigError("overwrite", True, "not together with --resume")


def _check_data_and_model(c: dict[str, Any]) -> None:
  """The data's and the model's own fields (`c`: the config's flat fields)."""
  for field in ("batch_size", "workers"):
    positive(field, c[field])
  positive("image_size", c["image_size"], allow_none=True)
  task = c["dataset"].startswith(TASK_PREFIX)
  if c["model"].startswith(TASK_PREFIX) and not task:
    raise ConfigError("model", c["model"], "a name from `jaxdl list` (task:NAME is set by "
                      "--dataset task:NAME)")
  if not task:
    data.check_name(c["dataset"])
    data.check_image_size(c["dataset"], c["image_size"])
    models.check_model(c["model"])
  models.check_compute_dtype(c["compute_dtype"], c["model"])


def filled_optim(config: RunConfig, spec: AlgorithmSpec) -> OptimConfig:
  """The run's optimizer section with every unset field filled: by the
  algorithm's defaults for its M workers (AlgorithmSpec.optim_defaults),
  else jaxdl.optim's; its --opt-args checked against the optimizer."""
  rule = spec.optim_defaults and spec.optim_defaults(config.algorithm.workers)
  filled = optim.with_defaults(config.optim, rule)
  optim.parse_opt_args(filled.optimizer, filled.opt_args)
  return filled


def validate(config: RunConfig) -> Plan:
  """Every field of `config` that can be checked without data, checked by
  its owner; the Plan of what the checks chose. A ConfigError names the
  first field refused. A script's or a registered task (--dataset task:NAME)
  is resolved before (jaxdl.build.resolve_task).

  Args:
    config: the run's config.

  Returns:
    The Plan: the config, its algorithm's spec, its engine's name, its
    filled optimizer section and its partition policy.
  """
  c = config.flat()
  check_numbers(c, field_types() | settings_types(c["algorithm"]))
  _check_run_fields(c)
  _check_data_and_model(c)
  optim.check(config.optim)
  distributed.check(config.distributed)
  cluster.check(config.cluster)
  parse_compress(c["compress"])
  parse_compress(c["compress_pull"], "compress_pull")
  if c["batch_sizes"] is not None or c["worker_speeds"] is not None:
    data.batch_sizes(config)  # (equal batches: M of them, once the data has bounded M)
  policy = Policy.of(config)
  spec = ALGORITHMS.get(config.algorithm.algorithm)
  engine = engines.choose(spec, config)
  algorithms.check(spec, config)
  engines.check(engine, config, spec)
  parallel.check(config)
  optimizer = filled_optim(config, spec)  # --opt-args, once the algorithm's recipe is known
  return Plan(config, spec, engine, optimizer, policy)
