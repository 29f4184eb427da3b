"""Fuzzing the command line: random `run` and `compare` flags and `--config`
contents (valid, out of range, of the wrong type, unknown) each end with exit
code 0 or 2, print no traceback, and leave an existing run directory as it
was. The examples are derived from a fixed seed (derandomize), so CI runs the
same ones every time; each valid one trains a single step.
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.cli import main
from jaxdl.config import RunConfig
from tests.helpers import snapshot

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
