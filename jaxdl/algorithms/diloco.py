"""DiLoCo: distributed low-communication training (Douillard et al. 2023,
"DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv:2311.08105, Algorithm 1).

Every worker starts an outer step from the shared parameters theta and takes
H = --inner-steps steps of the run's --optimizer (the inner optimizer) on its
own mean gradient, with its own optimizer state. After every H-th step the
workers' differences from theta are averaged, weighted by b_m / B, into the
outer gradient, which the outer optimizer applies:

    Delta = sum_m (b_m / B) (theta - theta_m)
    theta <- theta + OuterOpt(Delta)      (--outer-optimizer, --outer-lr,
                                           --outer-momentum)
    theta_m <- theta                      (every worker)

Each worker keeps its own inner optimizer state across outer steps, as the
paper does (only the parameters restart from theta). Batch-norm statistics
are averaged at the outer step, as local_sgd's are. Every worker holds theta
and the outer optimizer's state and applies the same outer update to the
same all-reduced average, so they stay identical without a server.

The paper's recipe, used where the run leaves the flags unset: AdamW inner,
outer SGD with Nesterov momentum, outer lr 0.7, momentum 0.9. The paper's
inner AdamW (lr 4e-4, weight decay 0.1, H = 500) trains language models
over ~88k steps; for jaxdl's small image runs the inner lr is 3e-3 with the
paper's weight decay 0.1, and H defaults to 10 (the default digits run at 4
workers takes ~11 steps an epoch). Over the default 10 epochs that reached
0.969-0.975 test accuracy at 4 workers (seeds 0-2; bsp: 0.989) and 0.953 at
8 (seed 0); H = 5 to 8 ended at 0.94-0.98, and H = 4 at 0.87, its outer
momentum driving the loss up late in the run; inner lr 1e-3 trained slower
over 2 epochs. At 16 workers the default run has 20 steps, two outer steps,
and ends at 0.67-0.86 by the seed.
With H = 1, inner SGD without momentum, outer SGD at lr 1 without momentum,
it is synchronous data-parallel SGD.

With --compress, a worker sends its own outer gradient compressed with
error feedback, c_m = C(theta - theta_m + e_m), keeping e_m <- theta -
theta_m + e_m - c_m (theta, which every worker holds, is the reference);
Delta = sum_m (b_m / B) c_m. The messages are all-gathered, as AR-SGD's
(jaxdl.algorithms.ar_sgd); batch-norm statistics are averaged whole.

The evaluated model is theta (the last outer step's) with the workers' mean
batch-norm statistics: inner steps after the last outer step are not in it.

Versions read: an inner step reads the worker's own model; an outer step
reads every worker's model after the same inner step (a barrier).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import optax
from jax import lax

from jaxdl.algorithms import ar_sgd
from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.families import Collective
from jaxdl.settings import Settings, above, at_least, between, one_of, setting

# (outer lr, outer momentum) -> the outer optimizer, which descends on Delta.
OUTER_OPTIMIZERS: dict[str, Callable[[float, float], optax.GradientTransformation]] = {
    "nesterov": lambda lr, momentum: optax.sgd(lr, momentum or None, nesterov=True),
    "sgd": lambda lr, momentum: optax.sgd(lr, momentum or None),
    "adam": lambda lr, momentum: optax.adam(lr, b1=momentum),
}

# The inner optimizer where the run names none: the paper's AdamW with its
# weight decay, at an lr that trains the small default models.
INNER_RECIPE = {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1}
INNER_RULE = ("unset: adamw, lr 3e-3, weight decay 0.1 (the paper's inner AdamW; its lr 4e-4 "
              "is for its language models); they hold for adamw only")


def inner_recipe(num_workers: int) -> dict:
  """DiLoCo's inner optimizer where the user sets none (any M)."""
  del num_workers
  return dict(INNER_RECIPE)


@dataclasses.dataclass(frozen=True)
class DiLoCoSettings(Settings):
  inner_steps: int = setting(10, symbol="h", allowed=at_least(
      1, note="inner steps between outer steps"))
  """DiLoCo's H: steps of the run's --optimizer each worker takes between outer steps (the paper's 500 is for ~88k-step language-model runs)."""
  outer_optimizer: str = setting("nesterov", allowed=one_of(*OUTER_OPTIMIZERS))
  """DiLoCo's outer optimizer, applied to the averaged parameter delta: nesterov (SGD with Nesterov momentum, the paper's), sgd (heavy-ball momentum; at --outer-lr 1 and --outer-momentum 0, plain model averaging) or adam (b1 = --outer-momentum)."""
  outer_lr: float = setting(0.7, allowed=above(0))
  """DiLoCo's outer learning rate (the paper's 0.7); constant."""
  outer_momentum: float = setting(0.9, allowed=between(0, 1, high_open=True))
  """DiLoCo's outer momentum (the paper's 0.9), in [0, 1)."""


  def outer(self) -> optax.GradientTransformation:
    """The outer optimizer these settings name."""
    return OUTER_OPTIMIZERS[self.outer_optimizer](self.outer_lr, self.outer_momentum)


class DiLoCoState(NamedTuple):
  """One worker's state; `outer_params` and `outer_opt_state` are the same on all."""
  inner: TrainState          # this worker's model, batch-norm statistics, inner optimizer
  outer_params: Any          # theta: the parameters the inner steps started from
  outer_opt_state: optax.OptState
  outbox: Any = ()           # the compression state of its outer gradients (--compress)


def outer_step(outer: optax.GradientTransformation, state: DiLoCoState, share, axis,
               compress: Callable | None = None) -> DiLoCoState:
  """The outer step: theta moves by the outer optimizer on Delta, the mean of
  the workers' differences theta - theta_m (weights b_m / B = `share`; with
  `compress`, (message, outbox) -> (what is sent, outbox), of their
  compressed differences), and every worker restarts from it; batch-norm
  statistics become their mean.

  The mean of the differences, not theta minus the mean model: a coordinate
  that no worker moved has the difference 0 on every worker, so Delta is
  exactly 0 there and no outer optimizer moves it. theta - sum_m (b_m / B)
  theta_m is not 0 there: with weights 1/3 in float32, three equal values
  times 1/3 add up to another value for about 30% of them, and adam turns
  such an ulp into a step of up to 0.8 x the outer lr (BENCHMARKS.md).
  """
  own = jax.tree.map(lambda theta, x: theta - x, state.outer_params, state.inner.params)
  sent, outbox = (own, state.outbox) if compress is None else compress(own, state.outbox)
  delta, model_state = axis.psum(jax.tree.map(lambda x: x * share,
                                              (sent, state.inner.model_state)))
  updates, outer_opt_state = outer.update(delta, state.outer_opt_state, state.outer_params)
  theta = optax.apply_updates(state.outer_params, updates)
  inner = TrainState(theta, model_state, state.inner.opt_state)
  return DiLoCoState(inner, theta, outer_opt_state, outbox)


def evaluated(states: DiLoCoState):
  """theta (worker 0's: all are equal) with the workers' mean batch-norm statistics."""
  return (jax.tree.map(lambda x: x[0], states.outer_params),
          mean_over_workers(states.inner.model_state))


def build(settings: DiLoCoSettings, problem: Problem, num_workers: int) -> Collective:
  period, outer = settings.inner_steps, settings.outer()
  compress = problem.compress_message if problem.compresses else None

  def init(key, worker) -> DiLoCoState:
    inner = problem.init_state(key)
    return DiLoCoState(inner, inner.params, outer.init(inner.params),
                       problem.init_outbox(inner.params, worker))

  def step(state: DiLoCoState, batch, step, axis):
    share = batch.weights.sum()  # b_m / B
    grads, model_state, metrics = problem.gradients(state.inner.params,
                                                    state.inner.model_state, batch, axis)
    grads = jax.tree.map(lambda g: g / share, grads)  # this worker's own mean gradient
    state = state._replace(inner=problem.apply_gradients(state.inner, grads, model_state))
    return lax.cond((step + 1) % period == 0,
                    lambda s: outer_step(outer, s, share, axis, compress),
                    lambda s: s, state), metrics

  # one all-reduce of the model (and statistics) every H steps, as local_sgd's
  return Collective(init=init, step=step, evaluated=evaluated,
                    bytes_per_step=ar_sgd.allreduce_bytes(problem, num_workers) / period,
                    sync="local", period=period)


SPEC = AlgorithmSpec("diloco", "DiLoCo: --inner-steps of the inner optimizer, then the "
                     "averaged delta to an outer optimizer", Collective, build, DiLoCoSettings,
                     optim_defaults=inner_recipe, optim_rule=INNER_RULE)
