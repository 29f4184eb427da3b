"""Optimizers (any optax optimizer by name) and learning-rate schedules."""
from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable

import optax

from jaxdl.errors import ConfigError, positive
from jaxdl.registry import Registry

OPTIMIZERS: Registry[Callable[..., optax.GradientTransformation]] = Registry("optimizer")

# optax's optimizers that update from gradients alone and take a schedule as
# their learning rate (polyak_sgd needs the loss value; sm3 and rprop want a float).
_OPTAX_NAMES = (
    "sgd", "adam", "adamw", "nadam", "nadamw", "lamb", "lars", "lion",
    "rmsprop", "adagrad", "adadelta", "adabelief", "adafactor", "adamax",
    "adamaxw", "amsgrad", "radam", "yogi", "novograd", "adan",
    "fromage", "sign_sgd", "signum", "optimistic_gradient_descent")

for _name in _OPTAX_NAMES:
  if hasattr(optax, _name):
    _fn = getattr(optax, _name)
    OPTIMIZERS.register(_name, f"optax.{_name}")(_fn)

_SET_BY_FLAGS = ("learning_rate", "momentum", "nesterov", "weight_decay")


def parse_opt_args(optimizer: str, opt_args: str) -> dict[str, Any]:
  """Parses --opt-args and checks each key against the optimizer's signature."""
  params = inspect.signature(OPTIMIZERS.get(optimizer)).parameters
  try:
    kwargs = json.loads(opt_args)
  except json.JSONDecodeError as e:
    raise ConfigError("opt_args", opt_args, f"a JSON object ({e.msg})") from None
  if not isinstance(kwargs, dict):
    raise ConfigError("opt_args", opt_args, "a JSON object such as '{\"b2\": 0.98}'")
  allowed = [p for p in params if p not in _SET_BY_FLAGS]
  for key in kwargs:
    if key not in allowed:
      raise ConfigError("opt_args", opt_args,
                        f"keys among optax.{optimizer}'s {', '.join(allowed)}"
                        " (learning rate, momentum, nesterov and weight decay have flags)")
  return kwargs


# The optimizer's defaults where neither the user nor the algorithm sets them.
LR, MOMENTUM = 0.05, 0.9
DEFAULTS = {"optimizer": "sgd", "lr": LR, "momentum": MOMENTUM, "weight_decay": 0.0}


def check(cfg) -> None:
  """The optimizer section's own ranges (an OptimConfig), and its optimizer's name."""
  positive("lr", cfg.lr, allow_none=True)
  positive("warmup_steps", cfg.warmup_steps, zero=True)
  positive("weight_decay", cfg.weight_decay, zero=True, allow_none=True)
  positive("momentum", cfg.momentum, zero=True, allow_none=True)
  if cfg.momentum is not None and not cfg.momentum < 1:
    raise ConfigError("momentum", cfg.momentum, "a number in [0, 1), or unset")
  if not 0 < cfg.lr_decay <= 1:
    raise ConfigError("lr_decay", cfg.lr_decay, "a factor in (0, 1]")
  if not all(m > 0 for m in cfg.lr_milestones):  # (NaN too)
    raise ConfigError("lr_milestones", cfg.lr_milestones, "epochs > 0")
  if cfg.optimizer is not None:
    OPTIMIZERS.get(cfg.optimizer)  # an unknown name first, whatever the algorithm


def with_defaults(cfg, defaults: dict | None = None):
  """`cfg` with its unset optimizer, lr, momentum and weight decay filled:
  from `defaults` (an algorithm's rule for its worker count,
  AlgorithmSpec.optim_defaults), else DEFAULTS.

  Defaults that name an optimizer are a recipe for it: where the user names
  another, none of them hold (an lr tuned for adamw is not one for sgd). A
  momentum is sgd's alone (others take theirs through --opt-args): it stays
  unset for another optimizer.
  """
  defaults = dict(defaults or {})
  if cfg.optimizer not in (None, defaults.get("optimizer", cfg.optimizer)):
    defaults = {}
  defaults = {**DEFAULTS, **defaults}
  if (cfg.optimizer or defaults["optimizer"]) != "sgd":
    del defaults["momentum"]
  return dataclasses.replace(cfg, **{k: v for k, v in defaults.items()
                                     if getattr(cfg, k) is None})


def make_schedule(cfg, total_steps: int, steps_per_epoch: int,
                  updates_per_step: int = 1) -> optax.ScalarOrSchedule:
  """Warmup (linear from 0) followed by the chosen decay, over `total_steps`.

  A constant rate without warmup stays a float, so the optimizer keeps no step
  counter for it. `updates_per_step`: how many times the optimizer updates in
  a training step (a parameter server applies M pushes a step): its count is
  divided by it, so that the schedule follows training steps and epochs.
  """
  warmup = min(cfg.warmup_steps, total_steps)
  if cfg.schedule == "constant" and not warmup:
    return cfg.lr
  if updates_per_step != 1:
    per_step = make_schedule(cfg, total_steps, steps_per_epoch)
    return lambda count: per_step(count / updates_per_step)
  rest = max(total_steps - warmup, 1)
  if cfg.schedule == "constant":
    main = optax.constant_schedule(cfg.lr)
  elif cfg.schedule == "cosine":
    main = optax.cosine_decay_schedule(cfg.lr, rest)
  elif cfg.schedule == "linear":
    main = optax.linear_schedule(cfg.lr, 0.0, rest)
  elif cfg.schedule == "step":
    boundaries = {max(round(m * steps_per_epoch) - warmup, 1): cfg.lr_decay
                  for m in cfg.lr_milestones}
    main = optax.piecewise_constant_schedule(cfg.lr, boundaries)
  else:
    raise ConfigError("schedule", cfg.schedule, "one of constant, cosine, step, linear")
  if not warmup:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup), main], [warmup])


def make_optimizer(cfg, total_steps: int, steps_per_epoch: int,
                   updates_per_step: int = 1) -> optax.GradientTransformation:
  """The optax optimizer that `cfg` names, with its schedule and weight decay
  (`updates_per_step`: see make_schedule; unset fields: DEFAULTS)."""
  cfg = with_defaults(cfg)
  fn = OPTIMIZERS.get(cfg.optimizer)
  params = inspect.signature(fn).parameters
  kwargs = parse_opt_args(cfg.optimizer, cfg.opt_args)
  kwargs["learning_rate"] = make_schedule(cfg, total_steps, steps_per_epoch, updates_per_step)
  if cfg.optimizer == "sgd":
    kwargs.update(momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  elif cfg.nesterov:
    raise ConfigError("nesterov", True, "only with --optimizer sgd (others: --opt-args)")
  if "weight_decay" in params:
    kwargs["weight_decay"] = cfg.weight_decay
    return fn(**kwargs)
  if cfg.weight_decay:
    return optax.chain(optax.add_decayed_weights(cfg.weight_decay), fn(**kwargs))
  return fn(**kwargs)
