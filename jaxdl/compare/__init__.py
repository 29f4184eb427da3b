"""`jaxdl compare`: a grid of runs (algorithms x workers x networks), one run
directory per cell under one comparison directory, run in parallel processes.

A grid is a frozen `Grid` (grid.py): its `variants` (an algorithm with
settings, named like ``ssp_s3``, ``easgd_tau4``, ``gosgd_p0.1``), worker
counts, networks and the run flags every cell shares; grids.py holds the
built-in ones and loads those of experiment files. args.py reads the command
line, sweep.py its ``--sweep NAME=V1,V2,...`` (variants over a setting's or a
run field's values). `run_grid` (run.py) runs the cells that have no
``summary.json`` yet (so an interrupted comparison resumes) in a pool of
processes (pool.py), records each cell's outcome in ``cells.json`` (done,
diverged or failed) and goes on past a failed cell; a diverged cell is
finished (its summary says where it diverged) and is not run again. Besides
the training cells, each variant gets a *timing* cell per `timing_networks`
entry: a ``--dry-run`` of the same schedule on another network, which gives
its simulated throughput without the math.
"""
from __future__ import annotations

from jaxdl.compare.args import CompareArgs, apply_args, description, named_grid, passed_on
from jaxdl.compare.checks import check_cells, check_out
from jaxdl.compare.findings import Finding
from jaxdl.compare.grid import DEFAULT_RUN, PER_CELL, Cell, Grid, Variant, section_fields
from jaxdl.compare.grids import (COMMUNICATION_GRID, DC_ASGD_A, DEFAULT_GRID, GOSSIP_GRID, GRIDS,
                                 IPDPS21_VARIANTS, STRATEGIES_GRID, load_experiment)
from jaxdl.compare.pool import default_jobs, outcome
from jaxdl.compare.run import CELLS_FILE, GRID_FILE, run_grid, target_metric

__all__ = ["CELLS_FILE", "COMMUNICATION_GRID", "DC_ASGD_A", "DEFAULT_GRID", "DEFAULT_RUN",
           "GOSSIP_GRID", "GRIDS", "GRID_FILE", "IPDPS21_VARIANTS", "PER_CELL",
           "STRATEGIES_GRID", "Cell", "CompareArgs", "Finding", "Grid", "Variant", "apply_args",
           "check_cells", "check_out", "default_jobs", "description", "load_experiment",
           "named_grid", "outcome", "passed_on", "run_grid", "section_fields", "target_metric"]
