"""The pages that the registries and the command line's dataclasses write.

Directives, each generating MyST markdown from the source that the command
line reads too, so that no page copies a fact by hand:

- ``{jaxdl-algorithm} NAME`` (``:test:`` its reference test files): an
  algorithm's doc line, family, engines, optimizer defaults and settings
  with their ranges, from `jaxdl.algorithms.ALGORITHMS`;
- ``{jaxdl-algorithms}``: every registered algorithm, a row each;
- ``{jaxdl-families}``: every family, what it runs and its algorithms;
- ``{jaxdl-engines}``: every registered engine, its families and algorithms;
- ``{jaxdl-command} NAME``: a command's flags as ``--help`` shows them (tyro's
  parser of the same dataclasses), each a Sphinx option of ``jaxdl NAME``;
- ``{jaxdl-output} ARGS``: what ``jaxdl ARGS`` prints (``jaxdl list``).

At the end of reading, every registered algorithm must have its page
(a warning otherwise, which ``-W`` makes an error).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import re
import warnings
from pathlib import Path

import tyro
import tyro.extras
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from jaxdl import calibrate, cli, compare, flags, optim
from jaxdl.algorithms import ALGORITHMS, FAMILIES
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, engines_for
from jaxdl.report import ReportArgs
from jaxdl.settings import allowed, base_type, field_docs, field_types, symbol

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger(__name__)
_PUNCTUATION = re.compile(r"([\\*_\[\]<>|#$!{}~^=+-])")


def text(value: str) -> str:
  """`value` as MyST markdown that shows it as written: `code` spans kept,
  every other markup character escaped."""
  parts = str(value).split("`")
  if len(parts) % 2 == 0:  # an odd backtick: no code spans
    parts = [str(value)]
  return "".join(f"`{part}`" if i % 2 else _PUNCTUATION.sub(r"\\\1", part)
                 for i, part in enumerate(parts))


def flag(field: str) -> str:
  return "--" + field.replace("_", "-")


def family_ref(family: type) -> str:
  return f"{{py:class}}`~{family.__module__}.{family.__qualname__}`"


def page_ref(algorithm: str) -> str:
  """A link to the algorithm's page, algorithms/NAME."""
  return f"{{doc}}`{algorithm} </algorithms/{algorithm}>`"


class Generated(SphinxDirective):
  """A directive whose output is MyST markdown, parsed in place. Its page
  depends on the package's source: an incremental build reads it again
  when a module changes."""

  def markdown(self) -> list[str]:
    raise NotImplementedError

  def run(self) -> list[nodes.Node]:
    for source in sorted((ROOT / "jaxdl").rglob("*.py")):
      self.env.note_dependency(str(source))
    container = nodes.container()
    lines = StringList(self.markdown(), source=self.get_source_info()[0])
    self.state.nested_parse(lines, self.content_offset, container)
    return container.children


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
          *("| " + " | ".join(row) + " |" for row in rows), ""]


def _values(values: dict) -> str:
  return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                   for k, v in values.items())


def _optimizer_defaults(spec) -> str:
  """What fills the optimizer flags a run leaves unset: the algorithm's
  rule, with what it gives at a few worker counts, or the run-wide defaults."""
  if spec.optim_defaults is None:
    return f"the run's, where no flag sets them: {_values(optim.DEFAULTS)}"
  at = "; ".join(f"M = {m}: {_values(spec.optim_defaults(m))}" for m in (1, 4, 16))
  return f"{text(spec.optim_rule)} ({text(at)})"


class AlgorithmFacts(Generated):
  """An algorithm's registry entry: what it is, where it runs, its settings."""
  required_arguments = 1
  option_spec = {"test": directives.unchanged_required}

  def markdown(self) -> list[str]:
    name = self.arguments[0]
    if name not in ALGORITHMS:
      raise self.error(f"{name!r} is no registered algorithm (one of {', '.join(ALGORITHMS)})")
    spec = ALGORITHMS.get(name)
    if self.env.docname != f"algorithms/{name}":
      raise self.error(f"{name}'s facts belong on its page, algorithms/{name}.md")
    self.env.jaxdl_algorithm_pages[name] = self.env.docname
    tests = self.options.get("test", "").split()
    if not tests:
      raise self.error(f"{name}: name its reference tests (:test: tests/...)")
    for test in tests:
      if not (ROOT / test).is_file() or not test.startswith("tests/"):
        raise self.error(f"{name}: its reference test {test!r} is no file under tests/")
    engines = engines_for(spec.family)
    facts = [
        ("Command line", f"`jaxdl run --algorithm {name}`"),
        ("What", text(spec.doc)),
        ("Family", family_ref(spec.family)),
        ("Engines", ", ".join(f"`{e}`" for e in engines) + f" (default: `{engines[0]}`)"),
        ("Parameter server", "yes: `--servers k` shards it" if spec.has_server else "none"),
        ("Workers", f"at most {spec.max_workers}" if spec.max_workers else "any number"),
        ("Optimizer defaults", _optimizer_defaults(spec)),
        ("Reference tests", ", ".join(f"`{test}`" for test in tests)),
    ]
    return [*(f"- **{k}**: {v}" for k, v in facts), "", *self._settings(spec)]

  @staticmethod
  def _settings(spec) -> list[str]:
    fields = dataclasses.fields(spec.settings)
    if not fields:
      return ["It has no settings of its own.", ""]
    docs, types = field_docs(spec.settings), field_types(spec.settings)
    rows = []
    for f in fields:
      kind = base_type(types[f.name])
      valid = allowed(spec.settings, f.name)
      allows = valid.describe(kind) if valid else f"any {getattr(kind, '__name__', kind)}"
      paper = symbol(spec.settings, f.name)
      rows.append([f"{{option}}`{flag(f.name)} <jaxdl run {flag(f.name)}>`",
                   f"`{f.default!r}`", text(allows), f"`{paper}`" if paper else "",
                   text(docs.get(f.name, ""))])
    return ["Its settings (flags of `jaxdl run`, fields of "
            f"`{spec.settings.__module__}.{spec.settings.__qualname__}`):", "",
            *_table(["flag", "default", "allowed", "symbol", "what"], rows)]


class AlgorithmsTable(Generated):
  """Every registered algorithm, with its family and engines."""

  def markdown(self) -> list[str]:
    rows = [[page_ref(name), family_ref(ALGORITHMS.get(name).family),
             ", ".join(engines_for(ALGORITHMS.get(name).family)),
             text(ALGORITHMS.get(name).doc)] for name in ALGORITHMS]
    return _table(["`--algorithm`", "family", "engines", "what"], rows)


class FamiliesTable(Generated):
  """Every family: its docstring's first paragraph, its registered algorithms."""

  def markdown(self) -> list[str]:
    rows = []
    for family in FAMILIES:
      summary = " ".join(inspect.getdoc(family).split("\n\n")[0].split())
      members = [page_ref(n) for n in ALGORITHMS if ALGORITHMS.get(n).family is family]
      rows.append([family_ref(family), text(summary), ", ".join(members)])
    return _table(["family", "what the engine runs", "algorithms"], rows)


class EnginesTable(Generated):
  """Every registered engine, with the families and algorithms it runs."""

  def markdown(self) -> list[str]:
    rows = []
    for name in ENGINES:
      engine = ENGINES.get(name)
      runs = [a for a in ALGORITHMS if ALGORITHMS.get(a).family in engine.families]
      rows.append([f"`{name}`", text(ENGINES.doc(name)),
                   ", ".join(family_ref(f) for f in engine.families),
                   ", ".join(f"`{a}`" for a in runs),
                   "yes" if engine.deterministic else "no (its trace replays on the sim)"])
    return _table(["`--engine`", "what", "families", "algorithms", "bitwise reproducible"],
                  rows)


def _parser(command: str):
  """tyro's parser of `command`'s flags: the dataclasses `jaxdl COMMAND` parses."""
  made = {"run": lambda: (flags.flags_class(RunConfig()), (tyro.conf.OmitArgPrefixes,)),
          "compare": lambda: (compare.CompareArgs, ()),
          "report": lambda: (ReportArgs, ()),
          "calibrate": lambda: (calibrate.CalibrateArgs, ())}
  cls, config = made[command]()
  with warnings.catch_warnings():  # get_parser is deprecated, but is how tyro reads them
    warnings.simplefilter("ignore", DeprecationWarning)
    return tyro.extras.get_parser(cls, prog=f"jaxdl {command}", config=config)


class Command(Generated):
  """A command's flags: one option each, under its section's title."""
  required_arguments = 1

  def markdown(self) -> list[str]:
    command = self.arguments[0]
    lines = [f":::{{program}} jaxdl {command}", ":::", ""]
    for group in _parser(command)._action_groups:
      actions = [a for a in group._group_actions if a.dest != "help"]
      if not actions:
        continue
      title = group.title.replace("-", " ")
      lines += [f":::{{rubric}} {text(title)}", ":::", ""]
      if group.description:
        lines += [text(" ".join(group.description.split())), ""]
      for action in actions:
        names = ", ".join(action.option_strings) or action.dest.upper()
        takes = action.option_strings and action.nargs != 0 and action.metavar
        value = f" {action.metavar}" if takes else ""
        lines += [f":::{{option}} {names}{value}", text(action.help.replace("%%", "%")),
                  ":::", ""]
    return lines


class Output(Generated):
  """What a `jaxdl` command prints, run while the page is built."""
  required_arguments = 1
  final_argument_whitespace = True

  def markdown(self) -> list[str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      status = cli.main(self.arguments[0].split())
    if status != 0:
      raise self.error(f"jaxdl {self.arguments[0]} exited with {status}")
    return ["```text", *printed.getvalue().rstrip().splitlines(), "```", ""]


def _attribute_summary(app, what, name, obj, options, lines) -> None:
  """An attribute's first line as written. Napoleon reads the words before a
  colon on an attribute docstring's first line as its type ("sync: What the
  cluster does each step: ..."); jaxdl writes types as annotations only, so
  the ":type:" napoleon made is put back in front of its description."""
  if what not in ("attribute", "data", "property"):
    return
  typed = [i for i, line in enumerate(lines) if line.startswith(":type: ")]
  first = next((i for i, line in enumerate(lines) if line.strip()), None)
  if len(typed) == 1 and first is not None and first < typed[0]:
    lines[first] = f"{lines[typed[0]][len(':type: '):]}: {lines[first].lstrip()}"
    del lines[typed[0]]


def _init(app, env, docnames) -> None:
  if not hasattr(env, "jaxdl_algorithm_pages"):
    env.jaxdl_algorithm_pages = {}
  for name, page in list(env.jaxdl_algorithm_pages.items()):
    if page in docnames:  # read again: its directives record it again
      del env.jaxdl_algorithm_pages[name]


def _merge(app, env, docnames, other) -> None:
  env.jaxdl_algorithm_pages.update(other.jaxdl_algorithm_pages)


def _every_algorithm_has_a_page(app, env) -> None:
  for name in ALGORITHMS:
    if name not in env.jaxdl_algorithm_pages:
      LOG.warning(f"algorithm {name!r} is registered but no page holds "
                  f"``{{jaxdl-algorithm}} {name}``")


def setup(app):
  app.add_directive("jaxdl-algorithm", AlgorithmFacts)
  app.add_directive("jaxdl-algorithms", AlgorithmsTable)
  app.add_directive("jaxdl-engines", EnginesTable)
  app.add_directive("jaxdl-families", FamiliesTable)
  app.add_directive("jaxdl-command", Command)
  app.add_directive("jaxdl-output", Output)
  app.connect("autodoc-process-docstring", _attribute_summary, priority=600)  # after napoleon
  app.connect("env-before-read-docs", _init)
  app.connect("env-merge-info", _merge)
  app.connect("env-check-consistency", _every_algorithm_has_a_page)
  return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
