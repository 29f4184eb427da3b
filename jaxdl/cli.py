"""The command line: ``jaxdl run | compare | report | list``."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from jaxdl.errors import ConfigError

USAGE = """usage: jaxdl COMMAND [FLAGS]

commands:
  run      train one configuration into a run directory (jaxdl run --help)
  compare  run a grid of algorithms x workers x networks (jaxdl compare --help)
  report   tables and plots of a comparison directory (jaxdl report --help)
  list     list datasets, models, optimizers, algorithms and engines
"""


# Flags that take several values: "--batch-sizes 32,48,48" reads as "32 48 48".
LIST_FLAGS = ("--batch-sizes", "--worker-speeds", "--lr-milestones")
COMPARE_LIST_FLAGS = ("--algorithms", "--workers", "--staleness-bounds",
                      "--communication-periods", "--gossip-probabilities", "--networks",
                      "--timing-networks")


def _split_lists(args: list[str], flags: tuple[str, ...] = LIST_FLAGS) -> list[str]:
  out: list[str] = []
  for arg in args:
    flag, eq, value = arg.partition("=")
    if eq and flag in flags:
      out += [flag, *value.split(",")]
    elif out and out[-1] in flags and "," in arg:
      out += [v for v in arg.split(",") if v]
    else:
      out.append(arg)
  return out


def _parse_run_config(args: list[str]):
  import tyro

  from jaxdl.config import RunConfig

  args = _split_lists(args)

  def parse(default: RunConfig) -> RunConfig:
    return tyro.cli(RunConfig, args=args, default=default, prog="jaxdl run",
                    config=(tyro.conf.OmitArgPrefixes,),
                    description="Train one configuration into a run directory.")

  given = parse(RunConfig())
  base = None
  if given.output.config:
    base = RunConfig.load(given.output.config)
  elif given.output.resume and given.output.out:
    stored = Path(given.output.out) / "config.json"
    base = RunConfig.load(str(stored)) if stored.exists() else None
  # Values from the file are the defaults; flags given on the line win.
  return given if base is None else parse(base)


def _run(args: list[str]) -> int:
  from jaxdl.runner import run

  summary = run(_parse_run_config(args))
  keys = ("test_accuracy", "test_loss", "train_loss", "steps", "wall_time_s",
          "samples_per_s", "simulated_time_s", "samples_per_simulated_s", "staleness_mean",
          "bytes_total", "params_fingerprint")
  for key in (k for k in keys if k in summary):
    value = summary[key]
    print(f"{key:>20}: {value:.4f}" if isinstance(value, float) else f"{key:>20}: {value}")
  return 0


def _compare(args: list[str]) -> int:
  import tyro

  from jaxdl import compare
  from jaxdl.config import RunConfig
  from jaxdl.report import Report

  opts, rest = tyro.cli(compare.CompareArgs, args=_split_lists(args, COMPARE_LIST_FLAGS),
                        return_unknown_args=True, prog="jaxdl compare")
  grid = compare.load_experiment(opts.experiment) if opts.experiment else compare.DEFAULT_GRID
  run_flags = {}
  if rest:  # `jaxdl run` flags: settings shared by every cell
    base = RunConfig.make(**dict(grid.run))
    given = tyro.cli(RunConfig, args=_split_lists(rest), default=base, prog="jaxdl compare",
                     config=(tyro.conf.OmitArgPrefixes,))
    run_flags = {k: v for k, v in given.flat().items() if v != base.flat()[k]}
  grid = compare.apply_args(grid, opts, run_flags)
  status = compare.run_grid(grid, opts.out, jobs=opts.jobs, overwrite=opts.overwrite,
                            progress=opts.progress)
  report = Report(opts.out, opts.target_accuracy)
  print(report.tables())
  if opts.report:
    print(f"report: {report.write()}")
  failed = [name for name, s in status.items() if s["status"] == "failed"]
  if failed:
    print(f"{len(failed)} of {len(status)} cells failed (errors in "
          f"{Path(opts.out) / compare.CELLS_FILE}); rerun the command to retry them",
          file=sys.stderr)
  return 1 if failed else 0


def _report(args: list[str]) -> int:
  import tyro

  from jaxdl.report import Report, ReportArgs

  opts = tyro.cli(ReportArgs, args=args, prog="jaxdl report")
  directory = Path(opts.dir)
  if not directory.is_dir() or not any(p.joinpath("summary.json").exists()
                                       for p in directory.iterdir()):
    raise ConfigError("dir", opts.dir, "a comparison directory with finished run "
                      "directories (jaxdl compare --out DIR)")
  report = Report(directory, opts.target_accuracy)
  print(report.tables())
  print(f"report: {report.write()}")
  return 0


def _list(args: list[str]) -> int:
  if args:
    print("usage: jaxdl list", file=sys.stderr)
    return 2
  from jaxdl.algorithms import ALGORITHMS
  from jaxdl.data import describe_datasets
  from jaxdl.engines import ENGINES
  from jaxdl.models import MODELS
  from jaxdl.optim import OPTIMIZERS

  sections = [("datasets (--dataset)", describe_datasets())]
  for title, registry in (("models (--model)", MODELS),
                          ("optimizers (--optimizer)", OPTIMIZERS),
                          ("algorithms (--algorithm)", ALGORITHMS),
                          ("engines (--engine)", ENGINES)):
    sections.append((title, [(name, registry.doc(name)) for name in registry]))
  for title, rows in sections:
    print(title)
    for name, doc in rows:
      print(f"  {name:<28} {doc}")
  return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run, "compare": _compare, "report": _report, "list": _list}


def _environment() -> None:
  """Quiet TensorFlow logs; keep compiled XLA programs across runs (set
  JAX_COMPILATION_CACHE_DIR to move the cache, or to '' to turn it off)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                        str(Path.home() / ".cache" / "jaxdl" / "xla"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")


def main(argv: list[str] | None = None) -> int:
  _environment()
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(USAGE)
    return 0 if argv else 2
  command = COMMANDS.get(argv[0])
  if command is None:
    print(f"jaxdl: error: unknown command {argv[0]!r}; allowed: {', '.join(COMMANDS)}",
          file=sys.stderr)
    return 2
  try:
    return command(argv[1:])
  except ConfigError as e:
    print(f"jaxdl {argv[0]}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"jaxdl {argv[0]}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
