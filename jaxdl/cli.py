"""The command line: ``jaxdl run | compare | report | list``."""
from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Literal

import jaxdl
from jaxdl import calibrate, compare, flags, parsing, rundir
from jaxdl.algorithms import ALGORITHMS
from jaxdl.cluster import DEFAULT_UTILIZATION, DEVICE_PROFILES
from jaxdl.config import RunConfig
from jaxdl.data import describe_datasets
from jaxdl.engines import ENGINES, engines_for
from jaxdl.errors import ArgvError, ConfigError
from jaxdl.models import MODELS, TEXT_MODELS
from jaxdl.optim import OPTIMIZERS
from jaxdl.report import Report, ReportArgs
from jaxdl.runner import DIVERGENCE_FACTOR, default_out, run
from jaxdl.settings import field_docs
from jaxdl.shutdown import Collecting, deferred, exit_within
from jaxdl.task import TASKS, task_names
from jaxdl.validation import check_target

USAGE = """usage: jaxdl COMMAND [FLAGS]

commands:
  run      train one configuration into a run directory (jaxdl run --help)
  compare  run a grid of algorithms x workers x networks (jaxdl compare --help)
  report   tables and plots of a comparison directory (jaxdl report --help)
  calibrate  measure this machine's costs on the ray engine into a profile
           for --engine sim --cluster PROFILE.json (jaxdl calibrate --help)
  list     list datasets, models, optimizers, algorithms and engines

  --version  print jaxdl's version

exit codes: 0 done; 1 some compare cells failed; 2 bad input; 3 the run
diverged (jaxdl run: its training loss became NaN or infinite, or past
1000 x its first value; summary.json has "status": "diverged"); 130 interrupted
"""
EXIT_DIVERGED = 3


# Flags that take several values: "--batch-sizes 32,48,48" reads as "32 48 48".
LIST_FLAGS = ("--batch-sizes", "--worker-speeds", "--lr-milestones")
COMPARE_LIST_FLAGS = ("--algorithms", "--workers", "--staleness-bounds",
                      "--communication-periods", "--gossip-probabilities", "--networks",
                      "--timing-networks", "--seeds")


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
  args = _split_lists(args)
  description = ("Train one configuration into a run directory. A run whose training loss "
                 f"becomes NaN or infinite, or grows past {DIVERGENCE_FACTOR:g} x its first "
                 "value, stops there: summary.json says \"status\": \"diverged\" and the "
                 f"exit code is {EXIT_DIVERGED}.")
  given, settings = flags.parse(args, RunConfig(), "jaxdl run", description)
  base = None
  if given.output.config:
    base = RunConfig.load(given.output.config)
  elif given.output.resume and given.output.out:
    stored = rundir.check_path("out", given.output.out) / rundir.CONFIG
    base = RunConfig.load(str(stored)) if stored.exists() else None
  if base is not None:  # values from the file are the defaults; flags given win
    given, settings = flags.parse(args, base, "jaxdl run", description)
  return given.replace(**settings)


def _run(args: list[str]) -> int:
  config = _parse_run_config(args)
  summary = run(config, announce=lambda out: print(f"run directory: {out}", flush=True))
  target = summary.get("target_metric")
  keys = (*([target] if target else []), "test_accuracy", "test_loss", "test_perplexity",
          "unigram_nats_per_char", "train_loss", "steps", "wall_time_s",
          "samples_per_s", "simulated_time_s", "samples_per_simulated_s", "staleness_mean",
          "bytes_total", "params_fingerprint")
  for key in (k for k in dict.fromkeys(keys) if summary.get(k) is not None):
    value = summary[key]
    spec = ".4f" if not isinstance(value, float) or abs(value) < 1e6 else ".4g"
    print(f"{key:>20}: {value:{spec}}" if isinstance(value, float) else f"{key:>20}: {value}")
  if summary.get("status") == "diverged":
    out = Path(config.output.out or default_out(config))
    print(f"jaxdl run: diverged: {summary['divergence']}; stopped at step {summary['steps']} "
          f"(no checkpoint of the diverged state; {out / 'summary.json'})", file=sys.stderr)
    return EXIT_DIVERGED
  print(f"summary: {Path(config.output.out or default_out(config)) / 'summary.json'}")
  return 0


def _interrupt(signum, frame) -> None:
  """Ctrl-C, or SIGTERM during `compare`: a KeyboardInterrupt, unless the
  garbage collector or a finalizer is running, which would only print it
  and go on (e.g. an asyncio loop's __del__): then the same signal again,
  shortly, out of it."""
  if not deferred(signum, frame):
    raise KeyboardInterrupt


def _compare(args: list[str]) -> int:
  opts, rest = parsing.parse(compare.CompareArgs, _split_lists(args, COMPARE_LIST_FLAGS),
                          "jaxdl compare", return_unknown_args=True,
                          description=compare.description())
  grid = compare.named_grid(opts)
  run_flags = {}
  if rest:  # `jaxdl run` flags: settings shared by every cell
    base = RunConfig.make(**compare.section_fields(grid.run))
    given, settings = flags.parse(_split_lists(rest), base, "jaxdl compare")
    run_flags = {k: v for k, v in given.flat().items() if v != base.flat().get(k)}
    run_flags.update(settings)
  grid = compare.apply_args(grid, opts, run_flags)
  check_target(opts.target, compare.target_metric(grid))
  signal.signal(signal.SIGTERM, _interrupt)  # stops the cells as Ctrl-C does
  status = compare.run_grid(grid, opts.out, jobs=opts.jobs, overwrite=opts.overwrite,
                            progress=opts.progress, experiment=opts.experiment, args=opts)
  report = Report(opts.out, opts.target)
  print(report.tables())
  if opts.report:
    print(f"report: {report.write()}")
  diverged = [name for name, s in status.items() if s["status"] == "diverged"]
  if diverged:
    print(f"{len(diverged)} of {len(status)} cells diverged: {', '.join(diverged)}",
          file=sys.stderr)
  failed = [name for name, s in status.items() if s["status"] == "failed"]
  if failed:
    print(f"{len(failed)} of {len(status)} cells failed (errors in "
          f"{Path(opts.out) / compare.CELLS_FILE}); rerun the command to retry them",
          file=sys.stderr)
  return 1 if failed else 0


def _report(args: list[str]) -> int:
  opts = parsing.parse(ReportArgs, args, "jaxdl report")
  directory = rundir.check_path("dir", opts.dir)
  expected = "a comparison directory with finished run directories (jaxdl compare --out DIR)"
  if not directory.is_dir() or not any(p.joinpath("summary.json").exists()
                                       for p in directory.iterdir()):
    raise ConfigError("dir", opts.dir, expected)
  report = Report(directory, opts.target)
  if not report.train + report.timing:
    skipped = next(iter(report.skipped.items()), None)
    raise ConfigError("dir", opts.dir, f"{expected}; no run is readable" + (
        f" ({skipped[0]}: {skipped[1]})" if skipped else ": none is a cell of its grid.json"))
  print(report.tables())
  print(f"report: {report.write()}")
  return 0


def _calibrate(args: list[str]) -> int:
  path, rest, given = calibrate.CalibrateArgs().profile, [], iter(args)
  for arg in given:  # --profile PATH or --profile=PATH; the rest are run flags
    if arg == "--profile" or arg.startswith("--profile="):
      path = arg.partition("=")[2] if "=" in arg else next(given, "")
    else:
      rest.append(arg)
  description = (f"{calibrate.__doc__}\n--profile PATH.json: where the profile is written "
                 f"(default {path}). --steps: updates of each measuring run (default "
                 f"{calibrate.DEFAULT_STEPS}). Other flags are `jaxdl run`'s: the model, "
                 "dataset and batch size measured, --ray-address.")
  config, settings = flags.parse(_split_lists(rest), RunConfig(), "jaxdl calibrate", description)
  config = config.replace(**settings)
  if not path.endswith(".json") or rundir.check_path("profile", path).is_dir():
    raise ConfigError("profile", path, "a path PATH.json for the profile")
  out = Path(path)
  if out.exists() and not config.output.overwrite:
    raise ConfigError("profile", path, "a path with no file yet, or --overwrite to replace it")
  rundir.check_writable(out.parent, "profile")
  profile = calibrate.calibrate(config)
  out.parent.mkdir(parents=True, exist_ok=True)
  rundir.write_json(out, profile)
  print(f"{calibrate.summary_line(profile)}\nprofile: {out} (jaxdl run --engine sim "
        f"--cluster {out} --model {config.model.model} --batch-size {config.data.batch_size})")
  return 0


def _list(args: list[str]) -> int:
  if args:
    raise ArgvError("", args[0], "", f"unexpected argument {args[0]!r}: jaxdl list takes none")


  sections = [("datasets (--dataset)", describe_datasets())]
  tasks = [(f"task:{n}", TASKS.doc(n) if n in TASKS else "(an installed package's)")
           for n in task_names()]
  if tasks:
    sections.append(("registered tasks (--dataset task:NAME)", tasks))
  for title, registry in (("models (--model)", MODELS),
                          ("text models (--model, on text datasets)", TEXT_MODELS),
                          ("optimizers (--optimizer)", OPTIMIZERS)):
    sections.append((title, [(name, registry.doc(name)) for name in registry]))
  rows = []
  for name in ALGORITHMS:
    spec = ALGORITHMS.get(name)
    rows.append((name, f"{spec.doc} [{spec.family.__name__.lower()}; engines: "
                       f"{', '.join(engines_for(spec.family))}]"))
    docs = field_docs(spec.settings)
    for field, value in spec.settings().to_dict().items():
      rows.append((f"  --{field.replace('_', '-')} {value}", docs.get(field, "")))
    if spec.optim_rule:  # the flags its defaults fill
      flags = ", ".join("--" + k.replace("_", "-") for k in spec.optim_defaults(1))
      rows.append((f"  {flags}", spec.optim_rule))
  sections.append(("algorithms (--algorithm) and their settings", rows))
  sections.append(("simulated devices (--cluster [COUNTx]PROFILE, sim engine)", [
      (name, f"{flops / 1e12:g} TFLOP/s peak, {DEFAULT_UTILIZATION:.0%} of it per step")
      for name, flops in DEVICE_PROFILES.items()]))
  sections.append(("networks (--network, sim engine)", [
      ("10gbps, 56gbps, 100mbps", "link bandwidth per worker and per server shard: "
       "bits (gbps, mbps, gbit) or bytes (GB/s)")]))
  sections.append(("engines (--engine)", [
      (name, f"{ENGINES.doc(name)} [families: "
             f"{', '.join(s.__name__.lower() for s in ENGINES.get(name).families)}]")
      for name in ENGINES]))
  for title, rows in sections:
    print(title)
    for name, doc in rows:
      print(f"  {name:<28} {doc}")
  return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run, "compare": _compare, "report": _report, "calibrate": _calibrate,
    "list": _list}


@dataclasses.dataclass(frozen=True)
class ExperimentArgs:
  """An experiment file's own flag; every other argument is `jaxdl compare`'s."""
  scale: Literal["mini", "paper"] = "mini"
  """The grid's scale, passed to the file's GRID as JAXDL_SCALE: mini (minutes on a CPU) or paper (the paper's)."""


def script_args(cls: type, argv: list[str] | None = None, path: str | None = None,
                **kwargs):
  """A script's own flags, the dataclass `cls` parsed by tyro from `argv`
  (default sys.argv[1:]; `kwargs`: tyro.cli's); a command line that does not
  parse is one line on stderr and exit code 2 (SystemExit), as in jaxdl's."""
  prog = f"python {Path(path or sys.argv[0]).name}"
  try:
    return parsing.parse(cls, sys.argv[1:] if argv is None else argv, prog, **kwargs)
  except ConfigError as e:
    print(f"{prog}: error: {e}", file=sys.stderr)
    raise SystemExit(2) from None


def experiment_main(path: str, doc: str, argv: list[str]) -> int:
  """An experiment file's command line (`doc` its docstring): ``--scale
  mini|paper`` (ExperimentArgs), every other argument a `jaxdl compare`
  flag; the default --out is runs/<file>-<scale>."""
  args, rest = script_args(ExperimentArgs, argv, path, return_unknown_args=True,
                           description=f"{doc.split(chr(10) * 2)[0]}\n\nOther arguments go "
                                       "to jaxdl compare.")
  os.environ["JAXDL_SCALE"] = args.scale
  return main(["compare", "--experiment", path,
               "--out", f"runs/{Path(path).stem}-{args.scale}", *rest])


def _environment() -> None:
  """Quiet TensorFlow logs; keep every compiled XLA program across runs and
  across a comparison's processes, however quick its compile (set
  JAX_COMPILATION_CACHE_DIR to move the cache, or to '' to turn it off, and
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS to keep only slower ones)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                        str(Path.home() / ".cache" / "jaxdl" / "xla"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


EXIT_GRACE_S = 60.0
"""How long an interrupted command's exit may wait on other threads."""


def main(argv: list[str] | None = None) -> int:
  _environment()
  try:  # `kill -USR1 PID`: every thread's stack to stderr
    faulthandler.register(signal.SIGUSR1, all_threads=True)
  except (AttributeError, ValueError):  # no SIGUSR1 here, or stderr is not a file
    pass
  program = argv is None and threading.current_thread() is threading.main_thread()
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(USAGE)
    return 0 if argv else 2
  if argv[0] == "--version":
    print(f"jaxdl {jaxdl.__version__}")
    return 0
  command = COMMANDS.get(argv[0])
  if command is None:
    print(f"jaxdl: error: unknown command {argv[0]!r}; allowed: {', '.join(COMMANDS)}",
          file=sys.stderr)
    return 2
  handlers = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _interrupt)  # Ctrl-C
  Collecting.watch()
  try:
    return command(argv[1:])
  except ConfigError as e:
    print(f"jaxdl {argv[0]}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    kept = " (finished cells are kept: rerun the command to run the rest)" \
        if argv[0] == "compare" else ""
    print(f"jaxdl {argv[0]}: interrupted{kept}", file=sys.stderr)
    if program:
      exit_within(EXIT_GRACE_S, 130)
    return 130
  finally:
    Collecting.unwatch()
    if threading.current_thread() is threading.main_thread():
      for n, handler in handlers.items():
        signal.signal(n, handler)


if __name__ == "__main__":
  sys.exit(main())
