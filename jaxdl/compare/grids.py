"""The built-in grids (`jaxdl compare --grid NAME`), and grids defined in
Python files (`--experiment PATH`)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import traceback
from pathlib import Path

from jaxdl import rundir
from jaxdl.cadence import AT_THE_END
from jaxdl.compare.grid import DEFAULT_RUN, Grid, Variant
from jaxdl.errors import ConfigError

# IPDPS'21 Table III's columns (BSP, ASP, SSP s=3/10, EASGD tau=4/8, GoSGD
# p=1/0.1/0.01, AD-PSGD) and LC-ASGD Table 3's (SGD, SSGD, ASGD, DC-ASGD,
# LC-ASGD); AR-SGD stands for the all-reduce family. DC-ASGD is DC-ASGD-a at
# lambda0 = 2 (Zheng et al.'s CIFAR setting): DC-ASGD-c's lambda g*g*(w - w_bak)
# at lambda 0.04 is too small to matter with this model's gradients.
IPDPS21_VARIANTS = tuple(map(Variant.parse, (
    "bsp", "asp", "ssp_s3", "ssp_s10", "easgd_tau4", "easgd_tau8", "gosgd_p1", "gosgd_p0.1",
    "gosgd_p0.01", "ad_psgd")))
DC_ASGD_A = Variant("dc_asgd", (("dc_adaptive", True), ("dc_lambda", 2.0)), name="dc_asgd")
# Its cells take a second or two: a checkpoint at the end of each, not one
# an epoch (an interrupted cell runs again; --checkpoint-every sets it).
DEFAULT_GRID = Grid(variants=(Variant("sgd"), IPDPS21_VARIANTS[0], Variant("ar_sgd"),
                              *IPDPS21_VARIANTS[1:], DC_ASGD_A, Variant("lc_asgd")),
                    run=(*DEFAULT_RUN, ("checkpoint_every", AT_THE_END)))

# The ASU seed's strategies on the mesh engine, a worker's batch the same in
# each: one device (sgd: every table's baseline), data parallel (2 workers),
# GPipe (2 stages, 4 micro-batches), model parallel (2 stages, 1) and tensor
# parallel (2 devices); the ViT, whose uniform blocks each cuts and splits.
_STAGES = (("parallelism", "pipeline"), ("stages", 2))
STRATEGY_VARIANTS = (
    Variant("sgd"), Variant("ar_sgd", name="data"),
    Variant("sgd", (*_STAGES, ("microbatches", 4)), name="gpipe"),
    Variant("sgd", (*_STAGES, ("microbatches", 1)), name="model"),
    Variant("sgd", (("parallelism", "tensor"), ("tensor_parallel", 2)), name="tensor"))
STRATEGIES_GRID = Grid(variants=STRATEGY_VARIANTS, workers=(2,), timing_networks=(), run=(
    ("dataset", "digits"), ("model", "vit"), ("engine", "mesh"), ("batch_size", 32),
    ("lr", 0.05), ("schedule", "constant"), ("epochs", 5.0), ("seed", 0)))
# Communicating less: synchronous (ar_sgd), asynchronous (asp), DiLoCo (an
# outer step every 8 inner steps, its outer Nesterov; plain SGD inside, as
# the grid's others), and messages compressed with error feedback (ar_sgd
# with top-k 1% and PowerSGD rank 2, asp's push with top-k 1%), at 4, 8 and
# 16 workers on a fast (56 Gb/s) and a slow (1 Gb/s) network; the default
# grid's task and compute time, 10 epochs.
COMMUNICATION_VARIANTS = (
    Variant("sgd"), Variant("ar_sgd"), Variant("asp"),
    Variant("diloco", (("inner_steps", 8),), name="diloco_h8"),
    Variant("ar_sgd", (("compress", "topk:0.01"),), name="ar_sgd_topk"),
    Variant("ar_sgd", (("compress", "powersgd:2"),), name="ar_sgd_powersgd"),
    Variant("asp", (("compress", "topk:0.01"),), name="asp_topk"))
COMMUNICATION_GRID = Grid(variants=COMMUNICATION_VARIANTS, networks=("56gbps", "1gbps"),
                          timing_networks=(), run=tuple({**dict(DEFAULT_RUN),
                                                         "epochs": 10.0}.items()))
# Communicating less without a server: GoSGD (p = 0.1) and AD-PSGD, whole
# and with compressed messages (top-k 1%, and 10% for GoSGD: differences
# from pairwise references, jaxdl.algorithms.pairwise), on the communication
# grid's task and networks; sgd sets the target. At 4 and 8 workers: each
# worker holds 2 M references, and compressed AD-PSGD, which exchanges after
# every step, takes 2-3 minutes a cell at 16 on 2 cores (--workers 16 runs it).
GOSSIP_VARIANTS = (
    Variant("sgd"), Variant("gosgd"),
    Variant("gosgd", (("compress", "topk:0.01"),), name="gosgd_topk"),
    Variant("gosgd", (("compress", "topk:0.1"),), name="gosgd_topk10"),
    Variant("ad_psgd"), Variant("ad_psgd", (("compress", "topk:0.01"),), name="ad_psgd_topk"))
GOSSIP_GRID = COMMUNICATION_GRID.replace(variants=GOSSIP_VARIANTS, workers=(4, 8))
# One of 4 workers 4 times slower, compute (0.05 s a batch at speed 1)
# dominating the 10 Gb/s link: the stragglers' and SSP's experiments
# (experiments/stragglers.py, experiments/ssp_bound.py).
ONE_SLOW_WORKER_RUN = (
    ("dataset", "digits"), ("model", "mlp"), ("engine", "sim"), ("batch_sizes", (8, 8, 8, 8)),
    ("worker_speeds", (1.0, 1.0, 1.0, 0.25)), ("compute_time", 0.05), ("jitter", 0.1),
    ("optimizer", "sgd"), ("lr", 0.05), ("momentum", 0.0), ("schedule", "constant"),
    ("epochs", 3.0), ("seed", 0))
GRIDS = {"default": DEFAULT_GRID, "strategies": STRATEGIES_GRID,
         "communication": COMMUNICATION_GRID, "gossip": GOSSIP_GRID}
"""The grids `jaxdl compare --grid NAME` runs."""
GRID_DOCS = {
    "default": "a miniature IPDPS'21 + LC-ASGD comparison on digits (mlp, 5 epochs, sim "
               "engine, 10gbps; timing at 56gbps; a checkpoint at each cell's end): sgd "
               "(1 worker) and bsp, ar_sgd, asp, ssp_s3, ssp_s10, easgd_tau4, easgd_tau8, "
               "gosgd_p1, gosgd_p0.1, gosgd_p0.01, ad_psgd, dc_asgd (DC-ASGD-a, lambda0 2), "
               "lc_asgd at 4, 8 and 16 workers",
    "strategies": "the ASU seed's: one device, data parallel on 2 workers, GPipe and model "
                  "parallel on 2 stages, tensor parallel on 2 devices; the ViT on digits, "
                  "--engine mesh, which needs 2 devices: on a CPU, "
                  "XLA_FLAGS=--xla_force_host_platform_device_count=2",
    "communication": "communicating less: ar_sgd, asp, diloco with H = 8, ar_sgd with top-k "
                     "1% and PowerSGD rank 2, asp with top-k 1%, at 4, 8, 16 workers on 56 "
                     "and 1 Gb/s; --engine sim",
    "gossip": "the same without a server: gosgd with p = 0.1, whole and with top-k 1% and "
              "10%, ad_psgd, whole and with top-k 1%, at 4 and 8 workers"}
"""What each of GRIDS compares (`jaxdl compare --help`)."""


_LOADED: dict[str, Grid] = {}


def load_experiment(path: str) -> Grid:
  """The `GRID` that a Python file (e.g. experiments/ipdps21.py) defines; a
  file is run once per process (what it registers is registered once)."""
  key = str(rundir.check_path("experiment", path).resolve())
  if key in _LOADED:
    return _LOADED[key]
  if not Path(path).is_file():
    raise ConfigError("experiment", path, "a Python file that defines GRID")
  # Read as Python whatever its suffix (spec_from_file_location wants ".py").
  loader = importlib.machinery.SourceFileLoader("jaxdl_experiment", path)
  spec = importlib.util.spec_from_loader("jaxdl_experiment", loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # as an import does: a dataclass in it looks itself up
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except Exception as e:  # a syntax error, or any exception the file raises
    raise ConfigError("experiment", path, f"a file that runs: {_where(e, path)}") from None
  finally:
    del sys.modules[spec.name]
  grid = getattr(module, "GRID", None)
  if not isinstance(grid, Grid):
    raise ConfigError("experiment", path, "a file that defines GRID = jaxdl.compare.Grid(...)")
  _LOADED[key] = grid
  return grid


def _where(error: Exception, path: str) -> str:
  """``SyntaxError at line 3: '(' was never closed``: the error, and its line in `path`."""
  line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
  if line is None:
    here = [f.lineno for f in traceback.extract_tb(error.__traceback__)
            if Path(f.filename).resolve() == Path(path).resolve()]
    line = here[-1] if here else None
  message = (error.msg if isinstance(error, SyntaxError) else str(error)).splitlines()
  at = f" at line {line}" if line else ""
  return f"{type(error).__name__}{at}: {message[0] if message else ''}"
