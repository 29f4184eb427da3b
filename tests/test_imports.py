"""The package's layers point down: no two modules import each other, even
through an import inside a function, and a function imports only the heavy
dependencies that most runs never load."""
import ast
import pathlib

import jaxdl

PACKAGE = pathlib.Path(jaxdl.__file__).parent
HEAVY = {
    "ray": "real processes: only the ray engine and calibrate's ray checks",
    "tensorflow_datasets": "only tfds:NAME datasets (it loads tensorflow)",
    "tensorflow": "only tfds:NAME datasets",
    "matplotlib": "only plots",
    "tensorboardX": "only runs that write TensorBoard logs",
    "sklearn": "only the embedded digits, once, to build their table",
    "PIL": "only images resized to --image-size",
}
"""What a function may import, and why it waits until then."""


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    name = ".".join(("jaxdl",) + path.relative_to(PACKAGE).with_suffix("").parts)
    modules[name.removesuffix(".__init__")] = path
  return modules


def _imports(modules: dict[str, pathlib.Path]):
  """(module, imported module of the package or the top-level name of another
  package, whether inside a function) for every import statement."""
  for name, path in modules.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    inner = {id(node) for f in ast.walk(tree)
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(f)}
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(parts + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
      else:
        continue
      for target in targets:
        while target not in modules and "." in target:
          target = target.rpartition(".")[0]
        yield name, target, id(node) in inner


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in graph:
    if v not in index:
      visit(v)
  return found


def _graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """Each module -> the package's modules it imports, function-level imports
  counted; a package's face (__init__) counts, except from a module inside
  that package."""
  graph = {name: set() for name in modules}
  for name, target, _ in _imports(modules):
    face = target in modules and modules[target].name == "__init__.py" and name.startswith(
        target + ".")
    if target in modules and target != name and not face:
      graph[name].add(target)
  return graph


def _late(modules: dict[str, pathlib.Path]) -> list[tuple[str, str]]:
  """(module, what one of its functions imports) but the HEAVY dependencies."""
  return sorted({(name, target) for name, target, inner in _imports(modules)
                 if inner and target.split(".")[0] not in HEAVY})


def test_no_two_modules_import_each_other():
  assert _cycles(_graph(_modules())) == []


def test_a_function_imports_only_heavy_optional_dependencies():
  assert _late(_modules()) == []


def test_the_checks_find_a_cycle_through_a_function_and_a_late_import(tmp_path):
  (tmp_path / "a.py").write_text("import jaxdl.b\n")
  (tmp_path / "b.py").write_text("def f():\n  from jaxdl import a\n  import numpy, ray\n")
  (tmp_path / "c.py").write_text("import jaxdl.a\n")
  modules = {f"jaxdl.{n}": tmp_path / f"{n}.py" for n in "abc"}
  assert _cycles(_graph(modules)) == [["jaxdl.a", "jaxdl.b"]]
  assert _late(modules) == [("jaxdl.b", "jaxdl.a"), ("jaxdl.b", "numpy")]
