"""An algorithm's or an engine's name is written in its own modules and the
registries alone: everything else asks the registries (a family, a
declaration), so that a new algorithm or engine is one module and one line."""
import ast
import inspect
import pathlib
import sys

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.engines import ENGINES

PACKAGE = pathlib.Path(jaxdl.__file__).parent
REGISTRIES = ("algorithms/__init__.py", "engines/__init__.py")
ELSEWHERE = {
    # the schema's default run: sequential SGD (AlgorithmConfig.algorithm)
    ("config.py", "sgd"),
    # optimizers named sgd (optax.sgd), not the algorithm
    ("optim.py", "sgd"), ("algorithms/bsp.py", "sgd"), ("algorithms/diloco.py", "sgd"),
    # the Ray library (its version, whether it is imported), not the engine
    ("calibrate.py", "ray"), ("engines/ray_cluster.py", "ray"),
    # the built-in grids name the algorithms they compare, as an experiment does
    *(("compare/grids.py", name) for name in ("bsp", "asp", "ad_psgd", "dc_asgd", "sgd", "ar_sgd",
                                              "lc_asgd", "diloco", "gosgd", "mesh", "sim")),
    # the default grid's run: the sim engine and an sgd optimizer
    ("compare/grid.py", "sim"), ("compare/grid.py", "sgd"),
}
"""(module, name) written outside the name's own modules, and why."""


def _owners() -> dict[str, set[str]]:
  """Each name -> the modules that define what it names: an algorithm's spec's
  module, an engine's class's and those of the classes that name themselves so
  (an engine's forms: its own-programs run, its driver)."""
  def rel(obj) -> str:
    return str(pathlib.Path(inspect.getfile(obj)).relative_to(PACKAGE))
  owners = {name: {rel(ALGORITHMS.get(name).build)} for name in ALGORITHMS}
  for name in ENGINES:
    engine = ENGINES.get(name)
    forms = [engine, *(c for c in engine.__mro__ if getattr(c, "name", None) == name)]
    forms += [c for module in list(sys.modules.values())
              if module.__name__.startswith("jaxdl.engines")
              for c in vars(module).values()
              if inspect.isclass(c) and c.__module__ == module.__name__
              and c.__dict__.get("name") == name]
    owners[name] = {rel(c) for c in forms}
  return owners


def _literals(names: set[str], root: pathlib.Path = PACKAGE):
  """(module, name) for every string constant of the package equal to a name."""
  for path in sorted(root.rglob("*.py")):
    module = str(path.relative_to(root))
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and node.value in names:
        yield module, node.value


def _stray(owners: dict[str, set[str]], root: pathlib.Path = PACKAGE) -> set[tuple[str, str]]:
  return {(module, name) for module, name in _literals(set(owners), root)
          if module not in owners[name] and module not in REGISTRIES
          and (module, name) not in ELSEWHERE}


def test_names_are_written_by_their_owners_and_the_registries_alone():
  assert _stray(_owners()) == set()


def test_every_exception_is_still_needed():
  found = set(_literals(set(_owners())))
  assert ELSEWHERE - found == set()


def test_the_check_finds_a_name_written_elsewhere(tmp_path):
  (tmp_path / "report.py").write_text("ORDER = ('asp', 'x')\nif engine == 'ray': pass\n")
  (tmp_path / "asp.py").write_text("NAME = 'asp'\n")
  owners = {"asp": {"asp.py"}, "ray": {"ray.py"}}
  assert _stray(owners, tmp_path) == {("report.py", "asp"), ("report.py", "ray")}
