"""Fuzzing the command line: random `run` and `compare` flags and `--config`
contents (valid, out of range, of the wrong type, unknown) each end with exit
code 0 or 2, print no traceback, and leave an existing run directory as it
was; and a sweep of bad input, each class generated over every field it
applies to, each case refused in one line. The examples are derived from a
fixed seed (derandomize), so CI runs the same ones every time; each valid one
trains a single step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxdl
from jaxdl import flags as run_flags
from jaxdl.algorithms import ALGORITHMS, settings_owners
from jaxdl.cli import ExperimentArgs, experiment_main, main
from jaxdl.compare import CompareArgs
from jaxdl.config import RunConfig
from jaxdl.errors import flag
from jaxdl.report import Report, ReportArgs
from tests.helpers import snapshot
from tests import marks

NUMBERS = st.one_of(st.integers(-3, 40).map(str),
                    st.sampled_from(["0.5", "1e-3", "-0.1", "1.5", "nan", "inf", "1e9", ""]))
TEXT = st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=8)
ANY = st.one_of(NUMBERS, TEXT)
SMALL = st.integers(1, 4).map(str)
RATE = st.sampled_from(["0", "0.05", "0.5"])
# flag: (values it allows, any value). Half the examples draw from the first.
RUN_FLAGS = {
    "--algorithm": (st.sampled_from(sorted(ALGORITHMS)), TEXT),
    "--workers": (SMALL, NUMBERS), "--batch-size": (SMALL, NUMBERS),
    "--lr": (st.just("0.05"), ANY), "--momentum": (RATE, ANY),
    "--model": (st.sampled_from(["mlp", "cnn"]), st.sampled_from(["resnet18", "vgg", ""])),
    "--dataset": (st.sampled_from(["digits", "synthetic"]),
                  st.sampled_from(["npz:/nowhere.npz", "tfds:", "mnist"])),
    "--image-size": (st.integers(8, 16).map(str), st.sampled_from(["-1", "0", "100000"])),
    "--engine": (st.sampled_from(["auto", "mesh", "sim"]), st.sampled_from(["ray", ""])),
    "--optimizer": (st.sampled_from(["sgd", "adam", "adamw"]), st.sampled_from(["lamb", "x"])),
    "--schedule": (st.sampled_from(["constant", "cosine"]), st.just("x")),
    "--opt-args": (st.just('{"eps": 1e-6}'), st.sampled_from(['{"b1": "x"}', "[1]", "{"])),
    "--batch-sizes": (st.lists(SMALL, min_size=1, max_size=3), st.lists(NUMBERS, max_size=3)),
    "--worker-speeds": (st.lists(SMALL, min_size=1, max_size=3), st.lists(NUMBERS, max_size=3)),
    "--staleness-bound": (SMALL, NUMBERS), "--communication-period": (SMALL, NUMBERS),
    "--elasticity": (RATE, ANY), "--gossip-probability": (RATE, NUMBERS),
    "--dc-lambda": (RATE, NUMBERS), "--lc-max-delay": (SMALL, NUMBERS),
    "--servers": (SMALL, NUMBERS), "--jitter": (RATE, NUMBERS),
    "--network": (st.just("1gbps"), st.just("fast")),
    "--eval-every": (SMALL, NUMBERS), "--checkpoint-every": (SMALL, NUMBERS),
    "--seed": (SMALL, NUMBERS),
    "--replay": (st.nothing(), st.sampled_from(["/nowhere/trace.jsonl", "/etc/hostname"])),
    "--sync-bn": (st.just(None), st.nothing()), "--async-bn": (st.just(None), st.nothing()),
    "--dry-run": (st.just(None), st.nothing()), "--no-such-flag": (st.nothing(), ANY),
}
CONFIG_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 20), st.floats(-1, 2),
                          TEXT, st.lists(st.integers(0, 9), max_size=3))
CONFIG_KEYS = st.sampled_from(["lr", "workers", "algorithm", "model", "momentum", "batch_size",
                               "staleness_bound", "servers", "nope", "epochs"])
CONFIG = st.one_of(st.dictionaries(CONFIG_KEYS, CONFIG_VALUES, max_size=4),
                   st.lists(st.integers(), max_size=2), TEXT)


def flags(catalog: dict, max_size: int) -> st.SearchStrategy[list[str]]:
  """A few of the catalog's flags with drawn values: all allowed ones, or any."""
  def one(flag: str, allowed: bool) -> st.SearchStrategy[list[str]]:
    good, bad = catalog[flag]
    value = good if allowed else st.one_of(good, bad)
    return value.map(lambda v: [flag] if v is None else
                     [flag, *v] if isinstance(v, list) else [flag, v])

  def some(names: list[str], allowed: bool) -> st.SearchStrategy[list[str]]:
    names = [n for n in names if not (allowed and catalog[n][0].is_empty)]
    return st.tuples(*(one(n, allowed) for n in names)).map(lambda xs: sum(xs, []))

  names = st.lists(st.sampled_from(sorted(catalog)), max_size=max_size, unique=True)
  return st.tuples(names, st.booleans()).flatmap(lambda x: some(*x))


def invoke(argv: list[str]) -> tuple[int, str]:
  """The CLI's exit code and everything it printed."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = main(argv)
    except SystemExit as e:  # argument parsing (tyro) exits with 2
      code = e.code
  return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("fuzz") / "run"
  jaxdl.run(RunConfig.make(model="mlp", steps=2, out=str(out), progress=False))
  return out


FUZZ = settings(max_examples=30, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@FUZZ
@given(argv=flags(RUN_FLAGS, 4), config=st.one_of(st.none(), CONFIG), existing=st.booleans())
def test_run_ends_with_0_or_2_and_keeps_an_existing_run(finished, argv, config, existing):
  before = snapshot(finished)
  with tempfile.TemporaryDirectory() as tmp:
    out = finished if existing else Path(tmp) / "run"
    extra = ["--steps", "1", "--no-progress", "--out", str(out)]
    if config is not None:
      (Path(tmp) / "c.json").write_text(json.dumps(config))
      extra += ["--config", str(Path(tmp) / "c.json")]
    code, printed = invoke(["run", *argv, *extra])
  event(f"exit {code}")  # --hypothesis-show-statistics: how many ran
  assert code in (0, 2), printed
  assert "Traceback" not in printed
  assert code == 2 or not existing  # an existing run directory is never reused silently
  assert snapshot(finished) == before


COMPARE_FLAGS = {
    "--algorithms": (st.lists(st.sampled_from(["asp", "ssp_s2", "gosgd", "sgd"]), min_size=1,
                              max_size=2, unique=True), st.lists(TEXT, min_size=1, max_size=2)),
    "--workers": (st.lists(SMALL, min_size=1, max_size=2), st.lists(NUMBERS, max_size=2)),
    "--staleness-bounds": (st.lists(SMALL, min_size=1, max_size=2), st.lists(NUMBERS, max_size=2)),
    "--gossip-probabilities": (st.lists(RATE, min_size=1, max_size=2),
                               st.lists(NUMBERS, max_size=2)),
    "--networks": (st.just(["1gbps"]), st.just(["fast"])),
    "--target": (st.just("0.5"), NUMBERS), "--jobs": (st.just("1"), st.just("x")),
    "--lr": (st.just("0.05"), ANY), "--engine": (st.just("sim"), st.sampled_from(["mesh", "x"])),
    "--network": (st.nothing(), ANY), "--dc-lambda": (RATE, NUMBERS),
    "--experiment": (st.nothing(), st.sampled_from(["/nowhere.py", "/etc/hostname"])),
}


@settings(FUZZ, max_examples=10)
@given(argv=flags(COMPARE_FLAGS, 3), existing=st.booleans())
def test_compare_ends_with_0_or_2_and_keeps_an_existing_run(finished, argv, existing):
  before = snapshot(finished)
  with tempfile.TemporaryDirectory() as tmp:
    out = finished if existing else Path(tmp) / "cmp"
    base = ["compare", "--algorithms", "asp", "--workers", "2", "--timing-networks", "10gbps",
            "--steps", "1", "--model", "mlp", "--jobs", "1", "--no-report", "--no-progress"]
    code, printed = invoke([*base, *argv, "--out", str(out)])
  event(f"exit {code}")
  assert code in (0, 2), printed
  assert "Traceback" not in printed
  assert snapshot(finished) == before


# ------------------------------------------------- the bad-input sweep
#
# Each class of bad input is generated over every field it applies to (the
# fields and their types are read from the flags' dataclasses), and each
# case must give exit code 2, exactly one line on stderr naming the flag, no
# traceback, and leave every directory as it was. A small budget runs by
# default; `-m slow` runs ten times as many.


def optional(hint: Any) -> Any:
  """`hint` without its `| None`."""
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    rest = [a for a in typing.get_args(hint) if a is not type(None)]
    return rest[0] if len(rest) == 1 else hint
  return hint


def holds(hint: Any, kind: type) -> bool:
  """Whether a flag of type `hint` takes values of `kind` (alone, in a list, or unset)."""
  return hint is kind or any(holds(a, kind) for a in typing.get_args(hint))


def flag_types(cls: type) -> dict[str, Any]:
  """Every flag of a dataclass of flags (its sections' fields flat) -> its type."""
  hints = typing.get_type_hints(cls)
  out = {}
  for f in dataclasses.fields(cls):
    if dataclasses.is_dataclass(f.default):
      out |= flag_types(type(f.default))
    elif f.name != "settings":
      out[flag(f.name)] = hints[f.name]
  return out


RUN_TYPES = flag_types(run_flags.flags_class(RunConfig()))
COMPARE_TYPES = flag_types(CompareArgs)
OWNER = {flag(name): specs[0].name for name, specs in settings_owners().items()}
# Number fields that take 0 (all others must be > 0; none takes a negative).
TAKES_ZERO = {flag(f) for f in (
    "warmup_steps", "eval_every", "checkpoint_every", "process_id", "seed", "staleness_bound",
    "momentum", "weight_decay", "latency", "jitter", "straggler_prob", "outer_momentum",
    "dc_lambda", "dc_beta", "lc_lambda", "elasticity", "gossip_probability", "jobs",
    "staleness_bounds", "gossip_probabilities", "seeds")}
# The variants that own compare's setting lists.
LIST_OWNER = {"--staleness-bounds": "ssp", "--communication-periods": "easgd",
              "--gossip-probabilities": "gosgd"}
FLOAT32_MAX = 3.4028234663852886e38


def sweep(budget: int):
  """The sweep's budget by default, and ten times it with the slow tests."""
  return pytest.mark.parametrize("examples", [budget, marks.slow(10 * budget)])


def run_base(flag_name: str, out: Path) -> list[str]:
  algorithm = OWNER.get(flag_name, "asp")
  return ["run", "--model", "mlp", "--steps", "1", "--no-progress", "--algorithm", algorithm,
          "--workers", "2", "--out", str(out)]


def compare_base(flag_name: str, out: Path) -> list[str]:
  return ["compare", "--algorithms", LIST_OWNER.get(flag_name, "asp"), "--workers", "2",
          "--steps", "1", "--model", "mlp", "--no-progress", "--no-report", "--jobs", "1",
          "--timing-networks", "10gbps", "--out", str(out)]


def refused(argv: list[str], names: str, keep: Path | None = None,
            experiment: str | None = None) -> None:
  """Runs `argv` in an empty working directory: exit code 2, one line on
  stderr that contains `names`, no traceback, nothing written there, in
  argv's --out or in `keep`. `experiment`: argv goes to that file's command line."""
  before = snapshot(keep) if keep is not None else None
  cwd = os.getcwd()
  with tempfile.TemporaryDirectory() as here:
    os.chdir(here)
    out, err = io.StringIO(), io.StringIO()
    scale = os.environ.get("JAXDL_SCALE")  # (an experiment's command line sets it)
    try:
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = exit_code(argv, experiment)
      left = os.listdir(here)
    finally:
      os.chdir(cwd)
      if scale is None:
        os.environ.pop("JAXDL_SCALE", None)
      else:
        os.environ["JAXDL_SCALE"] = scale
  lines = err.getvalue().strip().splitlines()
  assert code == 2 and len(lines) == 1, (argv, code, err.getvalue())
  assert names in lines[0], (names, lines[0])
  assert "Traceback" not in out.getvalue() + err.getvalue()
  assert not left, left
  for out_dir in (argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"):
    assert not (out_dir.strip() and os.path.exists(out_dir)), out_dir  # (False if too long)
  assert keep is None or snapshot(keep) == before


def exit_code(argv: list[str], experiment: str | None) -> int:
  """The exit code of `jaxdl ARGV`, or of the experiment file's command line."""
  try:
    return experiment_main(experiment, "An experiment.", argv) if experiment else main(argv)
  except SystemExit as e:  # a script's own flags (jaxdl.cli.script_args)
    return e.code


def bad_numbers(name: str, hint) -> st.SearchStrategy[str]:
  """Values out of range for a number flag: negative, past int32 (a seed:
  uint32) or float32, not finite; zero where it must be positive."""
  low = [] if name in TAKES_ZERO else [st.just("0")]
  if holds(hint, int):
    top = 2**32 if name in ("--seed", "--seeds") else 2**31
    return st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=top).map(str),
                     *low)
  return st.one_of(st.floats(max_value=-1e-9).map(repr), st.sampled_from(["nan", "inf"]),
                   st.floats(min_value=FLOAT32_MAX * 1.01).map(repr), *low)


def numeric(typed: dict) -> list[str]:
  return sorted(n for n, t in typed.items() if holds(t, int) or holds(t, float))


@sweep(24)
def test_numbers_out_of_range_are_refused(examples):
  cases = st.sampled_from([("run", n) for n in numeric(RUN_TYPES)] +
                          [("compare", n) for n in numeric(COMPARE_TYPES)])

  @settings(FUZZ, max_examples=examples)
  @given(case=cases.flatmap(lambda c: st.tuples(st.just(c), bad_numbers(
      c[1], (RUN_TYPES if c[0] == "run" else COMPARE_TYPES)[c[1]]))))
  def check(case):
    (command, name), value = case
    event(name)
    with tempfile.TemporaryDirectory() as tmp:
      base = (run_base if command == "run" else compare_base)(name, Path(tmp) / "out")
      many = typing.get_origin(optional(RUN_TYPES.get(name, COMPARE_TYPES.get(name)))) is tuple
      refused([*base, name, *([value] * (2 if many and command == "run" else 1))], name + "=")
  check()


TOO_LONG = st.one_of(
    st.integers(256, 400).map(lambda n: "n" * n),  # one name past NAME_MAX
    st.integers(17, 30).map(lambda k: "/".join(["d" * 250] * k)))  # the whole past PATH_MAX
BAD_PATHS = st.one_of(st.sampled_from(["", " ", "  "]), TOO_LONG)
PATH_FLAGS = [("run", "--out"), ("run", "--config"), ("run", "--replay"), ("run", "--data-dir"),
              ("compare", "--out"), ("compare", "--experiment"), ("report", "DIR"),
              ("calibrate", "--profile")]


@sweep(12)
def test_empty_and_overlong_paths_are_refused(examples):
  @settings(FUZZ, max_examples=examples)
  @given(where=st.sampled_from(PATH_FLAGS), value=BAD_PATHS)
  def check(where, value):
    (command, name) = where
    event(f"{command} {name}")
    with tempfile.TemporaryDirectory() as tmp:
      out = str(Path(tmp) / "out")
      argv = {"run": run_base(name, Path(out)), "compare": compare_base(name, Path(out)),
              "report": ["report"], "calibrate": ["calibrate", "--model", "mlp"]}[command]
      refused([*argv, value] if name == "DIR" else [*argv, name, value], name + "=")
  check()


EMPTY_JSON = st.sampled_from(["{}", "[]", "null", '""', "0", "true", '{"environment": {}}'])
NOT_JSON = st.one_of(st.just(""), TEXT.filter(lambda s: not _parses(s)))


def _parses(text: str) -> bool:
  try:
    json.loads(text)
  except ValueError:
    return False
  return True


def cut_short(path: Path) -> st.SearchStrategy[str]:
  """The file at `path` cut at any point before its end (not JSON then)."""
  text = path.read_text()
  return st.integers(0, len(text.rstrip()) - 1).map(lambda k: text[:k]).filter(
      lambda s: not _parses(s))


def comparison(root: Path, finished: Path) -> Path:
  """A comparison directory of one cell, a copy of the finished run's files."""
  cell = root / "cmp" / "sgd-m1"
  cell.mkdir(parents=True)
  for name in ("config.json", "summary.json", "metrics.jsonl"):
    shutil.copy(finished / name, cell / name)
  (root / "cmp" / "grid.json").write_text(json.dumps(
      {"grid": {}, "cells": [{"name": "sgd-m1", "variant": "sgd"}]}))
  (root / "cmp" / "cells.json").write_text(json.dumps({"sgd-m1": {"status": "done"}}))
  return root / "cmp"


def test_the_sweeps_comparison_is_whole(finished, tmp_path):
  # the JSON sweep's directory, intact: its one cell is read, none skipped
  whole = Report(comparison(tmp_path, finished))
  assert [c.name for c in whole.train] == ["sgd-m1"] and not whole.skipped


# Report's JSON inputs. An empty cells.json ({}) is allowed: compare writes it
# before any cell has finished.
REPORT_FILES = ["grid.json", "cells.json", "sgd-m1/config.json", "sgd-m1/summary.json"]


@sweep(12)
def test_files_that_are_not_json_or_empty_are_refused(finished, examples):
  @settings(FUZZ, max_examples=examples)
  @given(data=st.data(), target=st.sampled_from(["--config", *REPORT_FILES]))
  def check(data, target):
    event(target)
    bad = st.one_of(NOT_JSON, EMPTY_JSON, cut_short(finished / "config.json"))
    text = data.draw(bad.filter(lambda s: not (target == "cells.json" and s == "{}")))
    with tempfile.TemporaryDirectory() as tmp:
      if target == "--config":
        path = Path(tmp) / "config.json"
        path.write_text(text)
        refused([*run_base("", Path(tmp) / "out"), "--config", str(path)], "--config=", path)
        return
      directory = comparison(Path(tmp), finished)
      (directory / target).write_text(text)
      refused(["report", str(directory)], "DIR=", directory)
  check()


EXPERIMENT = str(Path(__file__).resolve().parents[1] / "experiments" / "partitions.py")
COMMAND_TYPES = {"run": RUN_TYPES, "calibrate": RUN_TYPES, "compare": COMPARE_TYPES,
                 "report": flag_types(ReportArgs), "experiment": flag_types(ExperimentArgs)}


def wrong_type(hint) -> st.SearchStrategy[str] | None:
  """Words that a flag of type `hint` does not take (None: it takes any)."""
  inner = optional(hint)
  if typing.get_origin(inner) is tuple:
    inner = typing.get_args(inner)[0]
  if typing.get_origin(inner) is Literal:
    words = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
    return words.filter(lambda w: w not in typing.get_args(inner) and w != "None")
  if inner in (int, float):
    words = st.text("abcdfghjklmopqrstuvwxyz,.", min_size=0, max_size=6)  # no e, i, n
    return st.one_of(words, st.just("1.5")) if inner is int else words.filter(
        lambda w: w.strip(".,") != "")
  return None


def unparsable(command: str) -> st.SearchStrategy[tuple[list[str], str]]:
  """A command line of `command` that its parser refuses, and what its
  error must name: a value of the wrong type or choice, an unknown flag, a
  flag without its value, a value after a flag that takes none, a missing DIR."""
  flag_map = COMMAND_TYPES[command]
  typed = [(n, s) for n, t in flag_map.items() if n != "DIR" and (s := wrong_type(t)) is not None]
  scalars = [n for n, t in flag_map.items() if n != "DIR" and t is not bool
             and typing.get_origin(optional(t)) is not tuple]
  switches = [n for n, t in flag_map.items() if t is bool]
  accepted = {*flag_map, *(RUN_TYPES if command != "report" else ()), "--help", "--profile"}
  accepted |= {"--no-" + n[2:] for n in accepted}
  unknown = st.from_regex(r"--[a-z][a-z-]{0,12}", fullmatch=True).filter(
      lambda f: f not in accepted)
  kinds = [st.sampled_from(typed).flatmap(lambda c: c[1].map(lambda v: ([c[0], v], c[0] + "="))),
           unknown.map(lambda f: ([f], f)),
           st.sampled_from(scalars).map(lambda n: ([n], n))]
  if switches:
    kinds.append(st.sampled_from(switches).map(lambda n: ([n, "stray"], "'stray'")))
  if command == "report":
    kinds.append(st.just(([], "DIR")))
  return st.one_of(kinds)


@sweep(24)
def test_command_lines_that_do_not_parse_are_refused(examples):
  @settings(FUZZ, max_examples=examples)
  @given(case=st.sampled_from(sorted(COMMAND_TYPES)).flatmap(
      lambda c: st.tuples(st.just(c), unparsable(c))))
  def check(case):
    command, (args, names) = case
    event(command)
    with tempfile.TemporaryDirectory() as tmp:
      out = Path(tmp) / "out"
      if command == "report":
        refused(["report", *([str(tmp)] if args else []), *args], names)
      elif command == "experiment":
        refused(["--out", str(out), *args], names, experiment=EXPERIMENT)
      else:
        base = run_base("", out) if command == "run" else compare_base("", out) \
            if command == "compare" else ["calibrate", "--profile", str(out) + ".json"]
        refused([command, *base[1:], *args], names)
  check()
