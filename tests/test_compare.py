"""`jaxdl compare`: grid expansion, parallel cells, resume, failed cells, bad
input, and every registered algorithm, engine and task in a comparison."""
import json
from pathlib import Path

import pytest

from jaxdl import compare, rundir
from jaxdl.algorithms import ALGORITHMS
from jaxdl.cli import main
from jaxdl.compare import DEFAULT_GRID, Grid, Variant
from jaxdl.compare.grid import baseline, one_worker
from jaxdl.engines import ENGINES
from jaxdl.settings import allowed
from jaxdl.task import registered, task_names
from jaxdl.validation import validate
from jaxdl.errors import ConfigError
from tests import marks
from tests.registry_cases import (DEFAULT_ALGORITHMS, ENGINE_CASES, assert_intervals_hold,
                                  assert_tables_hold, engine_variant, swept)


@pytest.mark.parametrize("spec,algorithm,settings", [
    ("asp", "asp", ()),
    ("ar_sgd", "ar_sgd", ()),
    ("ad_psgd", "ad_psgd", ()),
    ("ssp_s3", "ssp", (("staleness_bound", 3),)),
    ("easgd_tau8", "easgd", (("communication_period", 8),)),
    ("local_sgd_tau4", "local_sgd", (("communication_period", 4),)),
    ("gosgd_p0.01", "gosgd", (("gossip_probability", 0.01),)),
    ("asp_abn", "asp", (("async_bn", True),)),
    ("ssp_s3_abn", "ssp", (("staleness_bound", 3), ("async_bn", True))),
    ("lc_asgd_abn", "lc_asgd", (("async_bn", True),)),
])
def test_variant_names_parse_and_print_back(spec, algorithm, settings):
  variant = Variant.parse(spec)
  assert (variant.algorithm, variant.settings) == (algorithm, settings)
  assert variant.label == spec


def test_default_grid_is_ipdps_and_lc_asgd_in_miniature():
  cells = DEFAULT_GRID.cells()
  train = [c for c in cells if not c.timing]
  names = [c.name for c in cells]
  assert len(set(names)) == len(names)
  # 13 distributed variants at 4, 8 and 16 workers, and one-worker SGD
  assert len(train) == 13 * 3 + 1
  for name in ("sgd-m1", "bsp-m4", "ar_sgd-m8", "asp-m16", "ssp_s3-m4", "ssp_s10-m16",
               "easgd_tau4-m8", "easgd_tau8-m8", "gosgd_p1-m4", "gosgd_p0.1-m8",
               "gosgd_p0.01-m16", "ad_psgd-m16", "dc_asgd-m8", "lc_asgd-m16"):
    assert name in names, name
  ssp = next(c for c in cells if c.name == "ssp_s10-m16")
  assert ssp.overrides == {"staleness_bound": 10, "algorithm": "ssp", "workers": 16,
                           "network": "10gbps"}
  dc = next(c for c in cells if c.name == "dc_asgd-m4")  # DC-ASGD-a, lambda0 = 2
  assert dc.overrides["dc_adaptive"] is True and dc.overrides["dc_lambda"] == 2.0
  timing = [c for c in cells if c.timing]
  assert len(timing) == len(train) and all(c.overrides["dry_run"] for c in timing)
  assert {c.network for c in timing} == {"56gbps"}


def test_a_grid_on_real_processes_has_no_simulated_cluster():
  grid = DEFAULT_GRID.with_run(engine="ray")
  assert grid.measured and not DEFAULT_GRID.measured
  cells = grid.cells()
  assert not any(c.timing for c in cells) and all("network" not in c.overrides for c in cells)
  from jaxdl.compare import CompareArgs, apply_args
  grid = apply_args(DEFAULT_GRID, CompareArgs(), {"engine": "ray"})
  assert dict(grid.run)["engine"] == "ray"
  assert not {"compute_time", "jitter"} & set(dict(grid.run))  # the sim's defaults go
  for cell in grid.cells():
    validate(grid.config(cell, Path("out")))  # every algorithm has a ray form


def test_a_measured_profile_sets_the_grids_compute_time():
  from jaxdl.compare import CompareArgs, apply_args
  run = dict(apply_args(DEFAULT_GRID, CompareArgs(), {"cluster": "p.json"}).run)
  assert "compute_time" not in run and run["cluster"] == "p.json"
  given = {"cluster": "p.json", "compute_time": 1e-3}
  assert dict(apply_args(DEFAULT_GRID, CompareArgs(), given).run)["compute_time"] == 1e-3
  assert dict(apply_args(DEFAULT_GRID, CompareArgs(), {"cluster": "v100"}).run)[
      "compute_time"] == 2e-4


def test_a_task_brings_its_own_data_and_model():
  """--dataset task:NAME drops the grid's model (the default grid's mlp),
  which the task replaces; a --model given with it stays (and is refused
  when the cells are checked, naming it)."""
  from jaxdl.compare import CompareArgs, apply_args
  run = dict(apply_args(DEFAULT_GRID, CompareArgs(), {"dataset": "task:toy"}).run)
  assert run["dataset"] == "task:toy" and "model" not in run
  assert run["batch_size"] == dict(DEFAULT_GRID.run)["batch_size"]  # not the task's
  given = {"dataset": "task:toy", "model": "cnn"}
  assert dict(apply_args(DEFAULT_GRID, CompareArgs(), given).run)["model"] == "cnn"


def test_a_shared_setting_reaches_the_cells_whose_algorithm_has_it(tmp_path):
  from jaxdl.compare import CompareArgs, apply_args
  grid = apply_args(DEFAULT_GRID, CompareArgs(algorithms=("asp", "dc_asgd")), {"dc_lambda": 0.5})
  configs = {c.variant: grid.config(c, tmp_path) for c in grid.cells()}
  assert configs["dc_asgd"].settings().dc_lambda == 0.5
  assert "dc_lambda" not in configs["asp"].settings_dict()
  assert compare.check_cells(grid, tmp_path) == {}


def test_setting_lists_expand_the_variants_they_apply_to():
  grid = Grid(variants=(Variant("asp"), Variant("ssp"), Variant("easgd")))
  grid = grid.with_setting("staleness_bound", (1, 5)).with_setting("communication_period", (2,))
  assert [v.label for v in grid.variants] == ["asp", "ssp_s1", "ssp_s5", "easgd_tau2"]


@pytest.mark.parametrize("args,flag", [
    (["--network", "1gbps"], "--network"),      # set per cell: --networks
    (["--algorithm", "asp"], "--algorithm"),
    (["--workers", "0"], "--workers"),
    (["--jobs", "-1"], "--jobs"),
    (["--lr", "-1"], "--lr"),                   # a shared flag no cell can run with
    # a setting that no algorithm of the grid has, or a bad value of one
    (["--algorithms", "asp,sgd", "--staleness-bound", "3"], "--staleness-bound"),
    (["--algorithms", "ssp", "--staleness-bound", "-1"], "--staleness-bound"),
    (["--experiment", "experiments/none.py"], "--experiment"),
    # real processes measure time: no simulated network, one cell at a time
    (["--engine", "ray", "--networks", "1gbps"], "--networks"),
    (["--engine", "ray", "--jobs", "2"], "--jobs"),
    (["--engine", "ray", "--jitter", "0.2"], "--jitter"),  # the grid's compute time dropped
    # seeds: none, a negative one, one twice, or beside --seed or a sweep of seed
    (["--seeds"], "--seeds"),
    (["--seeds", "0", "-1"], "--seeds"),
    (["--seeds", "1", "2", "1"], "--seeds"),
    (["--seeds", "0", "1", "--seed", "2"], "--seeds"),
    (["--seeds", "0", "1", "--sweep", "seed=3,4"], "--seeds"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, flag):
  out = tmp_path / "cmp"
  assert main(["compare", "--out", str(out), "--no-progress", *args]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err
  assert not out.exists()


def test_experiment_file_defines_the_grid_and_flags_override_it(tmp_path):
  path = tmp_path / "exp.py"
  path.write_text("from jaxdl.compare import Grid, Variant\n"
                  "GRID = Grid(variants=(Variant('asp'), Variant('gosgd')), workers=(2,))\n")
  grid = compare.load_experiment(str(path))
  assert grid.workers == (2,) and [v.label for v in grid.variants] == ["asp", "gosgd"]
  args = compare.CompareArgs(workers=(4, 8), gossip_probabilities=(0.5,))
  grid = compare.apply_args(grid, args, {"epochs": 2.0})
  assert grid.workers == (4, 8) and [v.label for v in grid.variants] == ["asp", "gosgd_p0.5"]
  assert dict(grid.run)["epochs"] == 2.0 and dict(grid.run)["model"] == "mlp"


TINY = Grid(
    variants=(Variant("sgd"), Variant("asp"), Variant("nope")),
    workers=(2, 16), timing_networks=("56gbps",),
    run=(("model", "mlp"), ("engine", "sim"), ("steps", 3), ("batch_size", 100),
         ("momentum", 0.0), ("compute_time", 1e-4)))


def test_grid_runs_resumes_and_reports_failed_cells(tmp_path):
  out = tmp_path / "cmp"
  status = compare.run_grid(TINY, out, jobs=2, progress=False)
  done = {n for n, s in status.items() if s["status"] == "done"}
  assert done == {"sgd-m1", "asp-m2", "sgd-m1-56gbps-timing", "asp-m2-56gbps-timing"}
  # unknown algorithm: refused before running; 16 workers' shards (89) < batch 100:
  # fails inside its process. Both are reported, the others finished.
  assert "--algorithm='nope'" in status["nope-m2"]["error"]
  assert "--batch-size" in status["asp-m16"]["error"]
  assert json.loads((out / "cells.json").read_text()) == status
  summary = json.loads((out / "asp-m2" / "summary.json").read_text())
  assert summary["steps"] == 3 and summary["workers"] == 2 and summary["staleness_mean"] > 0
  assert json.loads((out / "asp-m2-56gbps-timing" / "summary.json").read_text())["dry_run"]
  config = json.loads((out / "asp-m2" / "config.json").read_text())
  assert config["cluster"]["network"] == "10gbps" and config["train"]["steps"] == 3

  mtimes = {n: (out / n / "summary.json").stat().st_mtime_ns for n in done}
  again = compare.run_grid(TINY, out, jobs=2, progress=False)
  assert {n for n, s in again.items() if s.get("skipped")} == done
  for name in ("sgd-m1", "asp-m2"):  # a skipped cell keeps its accuracy and seconds
    assert again[name]["test_accuracy"] == status[name]["test_accuracy"]
    assert again[name]["seconds"] > 0
  assert {n: (out / n / "summary.json").stat().st_mtime_ns for n in done} == mtimes
  assert again["asp-m16"]["status"] == "failed"  # failed cells are tried again

  # The same directory with other settings is refused, naming the cell.
  with pytest.raises(ConfigError, match="lr"):
    compare.run_grid(TINY.with_run(lr=0.5), out, jobs=1, progress=False)

  # A comparison still running in it (the kernel's hold, as another process
  # has it): refused before --overwrite deletes a cell
  with rundir.claimed(out):
    with pytest.raises(ConfigError, match="no other run or compare is writing to"):
      compare.run_grid(TINY, out, jobs=1, overwrite=True, progress=False)
  assert {n: (out / n / "summary.json").stat().st_mtime_ns for n in done} == mtimes


@pytest.mark.parametrize("name", ["ipdps21_table3", "lcasgd_table3",
                                  "hyperparameter_sensitivity", "partitions", "strategies",
                                  "staleness_spread"])
def test_experiment_files_define_valid_grids(tmp_path, monkeypatch, name):
  from pathlib import Path
  path = Path(__file__).parent.parent / "experiments" / f"{name}.py"
  for scale in ("mini",) if name == "staleness_spread" else ("mini", "paper"):
    monkeypatch.setenv("JAXDL_SCALE", scale)
    grid = compare.load_experiment(str(path))
    assert grid.cells()
    if scale == "mini":  # the paper scale needs its dataset to validate
      assert compare.check_cells(grid, tmp_path) == {}
  if name == "lcasgd_table3":
    assert {"asp_abn", "dc_asgd_abn", "lc_asgd_abn"} <= {v.label for v in grid.variants}
  if name == "staleness_spread":  # the LC-ASGD miniature's task and lr; compute-bound, spread
    lc_run = dict(compare.load_experiment(str(path.with_name("lcasgd_table3.py"))).run)
    spread = {**lc_run, "compute_time": 0.05, "jitter": 1.0}
    assert dict(grid.run) == spread and [v.label for v in grid.variants] == [
        "sgd", "asp", "dc_asgd", "lc_asgd"]
  if name == "partitions":
    assert [v.label for v in grid.variants] == ["ar_sgd", "ar_sgd_proportional",
                                                "ar_sgd_adaptive"]
  if name == "strategies":  # one device; the others at 2 workers or 2 devices a worker
    cells = {c.variant: c for c in grid.cells()}
    assert list(cells) == ["sgd", "data", "gpipe", "model", "tensor"]
    assert [cells[v].workers for v in cells] == [1, 2, 1, 1, 1]
    assert cells["gpipe"].overrides["microbatches"] == 4
    assert cells["model"].overrides["microbatches"] == 1


@pytest.mark.slow
def test_a_diverged_cell_is_reported_not_failed_and_not_rerun(tmp_path, capsys):
  out = tmp_path / "cmp"
  args = ["compare", "--out", str(out), "--algorithms", "asp", "--workers", "2", "--jobs", "1",
          "--no-progress", "--steps", "30", "--lr", "50", "--model", "mlp"]
  assert main(args) == 0  # a diverged run is a result, not an error
  captured = capsys.readouterr()
  assert "1 of 2 cells diverged: asp-m2" in captured.err
  assert "| 2 | diverged |" in captured.out  # the accuracy table

  def strict(path):
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path}: {c}"))
  cells = strict(out / "cells.json")
  assert cells["asp-m2"]["status"] == "diverged"
  assert "at step" in cells["asp-m2"]["divergence"]
  assert cells["asp-m2-56gbps-timing"]["status"] == "done"
  strict(out / "grid.json")
  assert strict(out / "asp-m2" / "summary.json")["status"] == "diverged"
  assert "diverged" in (out / "report.md").read_text()
  assert main(args) == 0  # the rerun skips it, still diverged
  again = strict(out / "cells.json")["asp-m2"]
  assert again == {"status": "diverged", "divergence": cells["asp-m2"]["divergence"],
                   "seconds": strict(out / "asp-m2" / "summary.json")["wall_time_s"],
                   "skipped": True}


def test_compare_help_lists_the_run_flags_it_passes_on(capsys):
  from jaxdl.compare import PER_CELL
  from jaxdl.config import field_owner
  with pytest.raises(SystemExit):
    main(["compare", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  shared, refused = text.split("Run flags passed on to every cell")[1].split("Set per cell")
  for field in field_owner():
    flag = "--" + field.replace("_", "-")
    assert (flag + "," in refused or flag + " (" in refused) == (field in PER_CELL), flag
    assert (flag + "," in shared or flag + ";" in shared) == (field not in PER_CELL), flag


def test_a_named_grid(tmp_path, capsys):
  """--grid strategies is the strategies experiment's mini scale; --grid
  communication's cells are valid runs on two networks; an unknown name, or
  one given with --experiment, is refused in one line."""
  from pathlib import Path
  strategies = compare.named_grid(compare.CompareArgs(grid="strategies"))
  assert strategies == compare.STRATEGIES_GRID and compare.check_cells(strategies, tmp_path) == {}
  path = Path(__file__).parent.parent / "experiments" / "strategies.py"
  assert compare.load_experiment(str(path)).cells() == strategies.cells()
  assert compare.named_grid(compare.CompareArgs()) is compare.DEFAULT_GRID
  communication = compare.named_grid(compare.CompareArgs(grid="communication"))
  assert compare.check_cells(communication, tmp_path) == {}  # every cell a valid run
  cells = communication.cells()
  assert {c.network for c in cells} == {"56gbps", "1gbps"} and not any(c.timing for c in cells)
  assert len(cells) == 2 * (1 + 6 * 3)  # sgd, and 6 variants at 4, 8, 16 workers
  gossip = compare.named_grid(compare.CompareArgs(grid="gossip"))
  assert compare.check_cells(gossip, tmp_path) == {}
  assert gossip.run == communication.run and gossip.networks == communication.networks
  assert len(gossip.cells()) == 2 * (1 + 5 * 2)  # sgd, and 5 variants at 4 and 8 workers
  for args, says in ((["--grid", "nope"], "--grid='nope' is not valid: one of default, "
                      "strategies, communication, gossip"),
                     (["--grid", "strategies", "--experiment", str(path)],
                      "--grid='strategies' is not valid: its default (default) with "
                      "--experiment, which gives the grid")):
    assert main(["compare", "--out", str(tmp_path / "c"), *args]) == 2
    assert capsys.readouterr().err.strip() == f"jaxdl compare: error: {says}"
  assert not (tmp_path / "c").exists()


def _grid(argv: list[str]) -> Grid:
  """The default grid as compare's command line `argv` (compare's own flags) makes it."""
  from jaxdl import parsing
  from jaxdl.cli import COMPARE_LIST_FLAGS, _split_lists
  args = parsing.parse(compare.CompareArgs, _split_lists(argv, COMPARE_LIST_FLAGS),
                       "jaxdl compare")
  return compare.apply_args(compare.named_grid(args), args, {})


def test_a_sweep_over_a_setting_without_a_flag_of_its_own(tmp_path):
  """--sweep elasticity=...: one easgd variant per value, each cell's config
  holding its value; the other algorithms' variants as they were."""
  grid = _grid(["--algorithms", "sgd,easgd,asp", "--workers", "2,4",
                "--sweep", "elasticity=0.25,0.75"])
  assert [v.label for v in grid.variants] == ["sgd", "easgd_alpha0.25", "easgd_alpha0.75", "asp"]
  train = [c for c in grid.cells() if not c.timing]
  assert [c.name for c in train] == ["sgd-m1", "easgd_alpha0.25-m2", "easgd_alpha0.25-m4",
                                     "easgd_alpha0.75-m2", "easgd_alpha0.75-m4", "asp-m2",
                                     "asp-m4"]
  for cell in train:
    expected = {"easgd_alpha0.25": 0.25, "easgd_alpha0.75": 0.75}.get(cell.variant)
    assert cell.overrides.get("elasticity") == expected, cell.name
    config = grid.config(cell, tmp_path)
    validate(config)
    assert config.flat().get("elasticity") == expected, cell.name
  # Run for real: each cell trains with its own elasticity (the results differ).
  out = tmp_path / "cmp"
  assert main(["compare", "--out", str(out), "--algorithms", "easgd", "--workers", "2",
               "--sweep", "elasticity=0.25,0.75", "--steps", "4", "--communication-period", "1",
               "--timing-networks", "10gbps", "--jobs", "1", "--no-progress",
               "--no-report"]) == 0
  summaries = {}
  for value in ("0.25", "0.75"):
    run = out / f"easgd_alpha{value}-m2"
    config = json.loads((run / "config.json").read_text())
    assert config["algorithm"]["settings"]["elasticity"] == float(value)
    assert config["algorithm"]["settings"]["communication_period"] == 1  # the shared flag's
    summaries[value] = json.loads((run / "summary.json").read_text())["params_fingerprint"]
  assert summaries["0.25"] != summaries["0.75"]


def test_sweeps_combine_and_a_run_fields_sweep_leaves_the_baseline():
  """Two sweeps: every combination, the first varying slowest and named
  first; a run field's sweep takes every variant but one-worker sgd's."""
  grid = _grid(["--algorithms", "sgd,easgd,ssp", "--sweep", "lr=0.1,0.01",
                "--sweep", "communication_period=2,8"])
  assert [v.label for v in grid.variants] == [
      "sgd", "easgd_lr0.1_tau2", "easgd_lr0.1_tau8", "easgd_lr0.01_tau2", "easgd_lr0.01_tau8",
      "ssp_lr0.1", "ssp_lr0.01"]
  cell = next(c for c in grid.cells() if c.name == "easgd_lr0.01_tau8-m4")
  assert cell.overrides["lr"] == 0.01 and cell.overrides["communication_period"] == 8
  assert grid.config(cell, Path("out")).optim.lr == 0.01
  sgd = next(c for c in grid.cells() if c.name == "sgd-m1")
  assert grid.config(sgd, Path("out")).optim.lr == 0.05  # the shared value


@pytest.mark.parametrize("alias,field,values,variants", [
    ("--staleness-bounds", "staleness_bound", "3,10", ["ssp_s3", "ssp_s10"]),
    ("--communication-periods", "communication_period", "2,4",
     ["easgd_tau2", "easgd_tau4", "local_sgd_tau2", "local_sgd_tau4"]),
    ("--gossip-probabilities", "gossip_probability", "1,0.1", ["gosgd_p1", "gosgd_p0.1"]),
])
def test_an_alias_is_the_sweep_it_stands_for(alias, field, values, variants):
  base = ["--algorithms", "sgd,asp,ssp,easgd,local_sgd,gosgd", "--workers", "2,4"]
  by_alias = _grid([*base, alias, values])
  by_sweep = _grid([*base, "--sweep", f"{field}={values}"])
  assert by_alias == by_sweep and by_alias.cells() == by_sweep.cells()
  swept = [v.label for v in by_alias.variants if dict(v.settings).get(field) is not None]
  assert swept == variants


@pytest.mark.parametrize("args,says", [
    (["--sweep", "elasticity"], "--sweep='elasticity' is not valid: NAME=V1,V2,..."),
    (["--sweep", "elastic=0.5"], "did you mean elasticity?"),
    (["--sweep", "elasticity=0.5,x"], "--sweep='elasticity=x' is not valid: a number, or None"),
    (["--sweep", "elasticity=2"], "--sweep='elasticity=2' is not valid: a number in [0, 1] "
                                  "(cell easgd_alpha2-m2)"),
    (["--sweep", "elasticity=0.5,nan"], "--sweep='elasticity=nan' is not valid: a finite "
                                        "number (cell easgd_alphanan-m2)"),
    (["--sweep", "elasticity="], "one value or more, none empty"),
    (["--sweep", "communication_period=1.5"], "an integer"),
    (["--sweep", "lr=-1"], "--sweep='lr=-1' is not valid: a number > 0 (cell easgd_lr-1-m2)"),
    (["--sweep", "seed=-1"], "--sweep='seed=-1' is not valid: an integer in [0, 2**32)"),
    (["--sweep", "schedule=cosine,often"], "one of constant, cosine, step, linear"),
    (["--sweep", "workers=2,4"], "compare sets per cell: use --workers"),
    (["--sweep", "engine=sim,ray"], "use --engine"),
    (["--sweep", "batch_sizes=8"], "batch_sizes takes a list"),
    (["--sweep", "staleness_bound=1,2"], "no algorithm in the grid (sgd, easgd) has "
                                         "--staleness-bound (ssp do)"),
    (["--sweep", "elasticity=0.5", "--sweep", "elasticity=0.1"], "swept once"),
    (["--sweep", "communication_period=2", "--communication-periods", "4"], "swept once"),
    (["--sweep", "elasticity=0.5", "--elasticity", "0.1"], "--elasticity is given"),
    (["--communication-periods", "4", "--communication-period", "2"], "--communication-period "
                                                                      "is given"),
])
def test_a_bad_sweep_is_one_line_exit_2(tmp_path, capsys, args, says):
  out = tmp_path / "cmp"
  code = main(["compare", "--out", str(out), "--no-progress", "--algorithms", "sgd,easgd",
               "--workers", "2", *args])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
  assert says in err and ("--sweep=" in err or "--communication-periods=" in err), err
  assert not out.exists()


# The registry-driven cases (tests/registry_cases.py): each registered
# algorithm, engine and task in a tiny comparison of 3 steps.
TINY_RUN = ["--steps", "3", "--jobs", "1", "--no-progress", "--no-report"]


def _compared(out: Path, capsys, *args: str) -> tuple[str, list[dict], dict[str, dict]]:
  """`jaxdl compare --out OUT ARGS` (exit code 0, every cell done): what it
  printed, grid.json's cells, and each cell's summary.json."""
  assert main(["compare", "--out", str(out), *args, *TINY_RUN]) == 0
  cells = json.loads((out / compare.GRID_FILE).read_text())["cells"]
  status = json.loads((out / compare.CELLS_FILE).read_text())
  assert {c["name"]: status[c["name"]]["status"] for c in cells} == {
      c["name"]: "done" for c in cells}
  return capsys.readouterr().out, cells, {
      c["name"]: json.loads((out / c["name"] / "summary.json").read_text()) for c in cells}


def test_the_default_grids_cells_checkpoint_at_their_end(tmp_path):
  """A default cell (a second or two of work) saves one checkpoint, at its
  end, not one an epoch; --checkpoint-every still sets the cadence."""
  def steps_saved(out: Path, *args: str) -> list[int]:
    # two epochs of 5 steps (2 workers x 128 of digits' training images)
    assert main(["compare", "--out", str(out), "--algorithms", "asp", "--workers", "2",
                 "--batch-size", "128", "--epochs", "2", "--timing-networks",
                 "--jobs", "1", "--no-progress", "--no-report", *args]) == 0
    return sorted(int(p.name) for p in (out / "asp-m2" / "checkpoints").iterdir())
  assert steps_saved(tmp_path / "default") == [10]
  assert steps_saved(tmp_path / "every", "--checkpoint-every", "4") == [8, 10]


@pytest.mark.parametrize("name", marks.default_only(list(ALGORITHMS), DEFAULT_ALGORITHMS))
def test_every_algorithm_is_compared_and_swept(name, tmp_path, capsys):
  """Each registered algorithm beside the one-worker baseline, swept over two
  values of its first setting with a range: one cell per value, each
  holding its value, and compare's tables hold each cell's own numbers."""
  setting = swept(name)
  sweep = ["--sweep", f"{setting[0]}={','.join(map(str, setting[1]))}"] if setting else []
  printed, cells, summaries = _compared(
      tmp_path / "cmp", capsys, "--algorithms", ",".join(dict.fromkeys([baseline(), name])),
      "--workers", "1" if one_worker(name) else "2", "--timing-networks", "10gbps", *sweep)
  own = [c for c in cells if c["algorithm"] == name]
  assert len(own) == (len(setting[1]) if setting else 1)
  if setting:
    field, values = setting
    held = [json.loads((tmp_path / "cmp" / c["name"] / "config.json").read_text())[
        "algorithm"]["settings"][field] for c in own]
    assert held == values
    assert all(allowed(ALGORITHMS.get(name).settings, field).allows(v) for v in held)
  base = next(summaries[c["name"]] for c in cells if c["variant"] == baseline())
  for c in own:
    assert_tables_hold(printed, c["variant"], c["workers"], summaries[c["name"]], base)


@pytest.mark.parametrize("engine", ENGINE_CASES)
def test_a_one_cell_grid_on_every_engine(engine, tmp_path, capsys):
  """One cell, on the engine, of an algorithm it runs: the cell ran there (a
  simulated time on a simulated engine, no timing cell on another), and
  compare's tables hold its numbers."""
  simulated = ENGINES.get(engine).simulated
  printed, cells, summaries = _compared(
      tmp_path / "cmp", capsys, "--engine", engine, "--algorithms", engine_variant(engine),
      "--workers", "2", *(["--timing-networks", "10gbps"] if simulated else []))
  assert len(cells) == 1
  summary = summaries[cells[0]["name"]]
  assert summary["engine"] == engine and ("simulated_time_s" in summary) == simulated
  assert_tables_hold(printed, cells[0]["variant"], 2, summary)


@pytest.mark.parametrize("task", task_names())
def test_every_registered_task_is_compared_on_its_metric(task, tmp_path, capsys):
  """A registered task (--dataset task:NAME, which brings its own model) in
  place of the grid's: the baseline and a distributed algorithm on it, the
  tables in the task's target metric."""
  variant = engine_variant(dict(DEFAULT_GRID.run)["engine"])
  printed, cells, summaries = _compared(
      tmp_path / "cmp", capsys, "--dataset", f"task:{task}", "--algorithms",
      f"{baseline()},{variant}", "--workers", "2", "--timing-networks", "10gbps")
  assert len(cells) == 2
  base = summaries[next(c["name"] for c in cells if c["variant"] == baseline())]
  for c in cells:
    summary = summaries[c["name"]]
    assert summary["target_metric"] == registered(task).target_metric
    assert_tables_hold(printed, c["variant"], c["workers"], summary, base)


def test_seeds_give_each_cell_a_run_per_seed():
  """--seeds: every cell (timing cells too) once per seed, named CELL-seedN
  with its seed; without it, the grid's cells as they were."""
  plain = _grid(["--algorithms", "sgd,asp", "--workers", "2", "--timing-networks", "56gbps"])
  seeded = _grid(["--algorithms", "sgd,asp", "--workers", "2", "--timing-networks", "56gbps",
                  "--seeds", "4", "0", "7"])
  assert [c.name for c in seeded.cells()] == [
      f"{c.name}-seed{s}" for c in plain.cells() for s in (4, 0, 7)]
  assert [c.overrides["seed"] for c in seeded.cells()] == [4, 0, 7] * len(plain.cells())
  assert all("seed" not in c.overrides for c in plain.cells())


@pytest.mark.parametrize("name", marks.default_only(
    [n for n in ALGORITHMS if not one_worker(n)], DEFAULT_ALGORITHMS))
def test_every_algorithm_is_compared_over_seeds(name, tmp_path, capsys):
  """--seeds 0 1 2: each cell's three runs differ (their parameters'
  fingerprints), the tables give each cell's mean over them and its t
  interval, and the same command again runs none of them twice."""
  out = tmp_path / "cmp"
  args = ("--algorithms", f"{baseline()},{name}", "--workers", "2", "--timing-networks",
          "10gbps", "--seeds", "0", "1", "2")
  printed, cells, summaries = _compared(out, capsys, *args)
  assert len(cells) == 6 and {c["overrides"]["seed"] for c in cells} == {0, 1, 2}
  for variant in (baseline(), name):
    runs = [c["name"] for c in cells if c["variant"] == variant]
    assert len({summaries[r]["params_fingerprint"] for r in runs}) == 3
  base = [summaries[c["name"]] for c in cells if c["variant"] == baseline()]
  own = [summaries[c["name"]] for c in cells if c["variant"] == name]
  assert_intervals_hold(printed, name, 2, own, base)
  assert_intervals_hold(printed, baseline(), 1, base, base)

  mtimes = {c["name"]: (out / c["name"] / "summary.json").stat().st_mtime_ns for c in cells}
  again, _, _ = _compared(out, capsys, *args)
  status = json.loads((out / compare.CELLS_FILE).read_text())
  assert all(status[c]["skipped"] for c in mtimes)
  assert {c: (out / c / "summary.json").stat().st_mtime_ns for c in mtimes} == mtimes
  assert again == printed
