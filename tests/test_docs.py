"""The documentation site holds: every shell command it shows runs as written
or says why not, every Python example is a notebook cell that the build
executes, every section of BENCHMARKS.md has its row in the summary, and
the site builds with warnings as errors (slow).
"""
from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from jaxdl.algorithms import ALGORITHMS
from tests.marks import slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHELLS = ("bash", "sh", "shell", "console")
NOT_RUN = re.compile(r"<!-- not run: (.*?) -->\n$")
FENCE = re.compile(r"^ *```(\S*)[^\n]*\n(.*?)^ *```", re.S | re.M)
INCLUDE = re.compile(r"^```\{include\} (\S+)", re.M)


class Block(NamedTuple):
  """A fenced block of a page: where it is, its language and code, and the
  reason it is not run (None: it is run)."""
  page: str
  line: int
  language: str
  code: str
  not_run: str | None


def pages() -> list[Path]:
  return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def blocks(path: Path, reason: str | None = None) -> list[Block]:
  """The fenced blocks of `path` and of the files it includes; `reason`: why
  none of them runs (the include's own `not run` line)."""
  text, found = path.read_text(), []
  for fence in FENCE.finditer(text):
    before = text[:fence.start()]
    marked = NOT_RUN.search(before)
    found.append(Block(str(path.relative_to(ROOT)), before.count("\n") + 1, fence.group(1),
                       fence.group(2), reason or (marked.group(1) if marked else None)))
    included = INCLUDE.match(fence.group(0))
    if included:
      found += blocks((path.parent / included.group(1)).resolve(),
                      marked.group(1) if marked else reason)
  return found


SHELL_BLOCKS = [b for page in pages() for b in blocks(page) if b.language in SHELLS]
RUN = [b for b in SHELL_BLOCKS if b.not_run is None]
REPRESENTATIVE = [b for b in RUN if b.page == "docs/getting-started.md"][:1]
CASES = [pytest.param(b, id=f"{b.page}:{b.line}") if b in REPRESENTATIVE
         else slow(b, id=f"{b.page}:{b.line}") for b in RUN]
"""Each block that runs: the first of getting-started.md by default, the rest slow."""


def test_every_shell_block_is_run_or_says_why_not():
  assert len(SHELL_BLOCKS) > 40 and len(RUN) > 20 and REPRESENTATIVE
  for block in SHELL_BLOCKS:
    assert block.not_run is None or len(block.not_run.split()) >= 3, block[:2]
  # the included BENCHMARKS.md's commands are covered by its include's reason
  assert any(b.page == "BENCHMARKS.md" and b.not_run for b in SHELL_BLOCKS)


def test_every_python_example_is_a_notebook_cell():
  """A ```python block would be shown and never run: examples are
  ```{code-cell}s of a page that names its kernel, which the build executes."""
  for page in pages():
    for block in blocks(page):
      assert block.language not in ("python", "py", "ipython3"), block[:2]
      if block.language.startswith("{code-cell}"):
        assert "\nkernelspec:" in page.read_text().split("\n---\n")[0], page


@pytest.mark.parametrize("block", CASES)
def test_a_shell_block_runs_as_written(block, tmp_path):
  """Run with this checkout's `jaxdl` and `python` first on the PATH, in a
  directory that holds only `experiments/`; every command must succeed."""
  env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ["PATH"]]))
  (tmp_path / "experiments").symlink_to(ROOT / "experiments")  # the scripts blocks name
  ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
  assert ran.returncode == 0, f"{block.page}:{block.line}\n{ran.stdout[-2000:]}\n" \
                              f"{ran.stderr[-3000:]}"


def _slug(title: str) -> str:
  """A heading's anchor as MyST makes it (GitHub's slugs)."""
  return re.sub(r"[^\w\-]", "", title.lower().replace(" ", "-"))


def test_the_benchmarks_summary_has_a_row_per_section():
  sections = re.findall(r"^## (.+)$", (ROOT / "BENCHMARKS.md").read_text(), re.M)
  summary = (DOCS / "benchmarks.md").read_text().split("\n## Summary\n")[1]
  rows = [line for line in summary.splitlines() if line.startswith("| [")]
  linked = [re.search(r"\]\(#([^)]+)\)", row).group(1) for row in rows]
  assert linked == [_slug(title) for title in sections]


def _text(page: Path) -> str:
  """An HTML page's text, its tags taken out."""
  return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("myst_nb") is None,
                    reason="the docs extra is not installed: pip install -e '.[docs]'")
def test_the_site_builds_with_warnings_as_errors(tmp_path):
  """The documented command, into a temporary directory: every notebook
  executed, every reference resolved, no warning; the generated pages there."""
  out = tmp_path / "html"
  built = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
                          str(DOCS), str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=1500)
  assert built.returncode == 0, built.stderr[-5000:]
  assert not re.search(r"WARNING: ", built.stderr) and "build succeeded" in built.stdout
  for name in ALGORITHMS:  # each page with its registry facts
    page = _text(out / "algorithms" / f"{name}.html")
    assert f"jaxdl run --algorithm {name}" in page and ALGORITHMS.doc(name) in page
  cli = (out / "cli.html").read_text()
  assert all(f'id="cmdoption-jaxdl-{command}-' in cli for command in ("run", "compare",
                                                                       "report", "calibrate"))
  quickstart = (out / "quickstart.html").read_text()
  assert "<img" in quickstart and "Traceback" not in quickstart
