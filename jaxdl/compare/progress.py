"""compare's progress bar: cells done of all, failures, the running ones and
the time left."""
from __future__ import annotations

from tqdm.auto import tqdm

from jaxdl.compare.grid import Cell


class Progress:
  """Cells done of all, failures, the running ones and the time left (a timing
  cell counts as 1/20 of a training cell)."""

  def __init__(self, cells: list[Cell], todo: list[Cell], enabled: bool, failed: int):
    self.weight = {c.name: 0.05 if c.timing else 1.0 for c in cells}
    self.total, self.done = len(cells), len(cells) - len(todo)
    self.failed, self.running = failed, []
    self.bar = tqdm(total=round(sum(self.weight[c.name] for c in todo), 2), disable=not enabled,
                    desc="compare", dynamic_ncols=True,
                    bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    self._show()

  def start(self, cell: Cell) -> None:
    self.running.append(cell.name)
    self._show()

  def finish(self, cell: Cell, result: dict) -> None:
    self.running.remove(cell.name)
    self.done += 1
    if result["status"] == "failed":
      self.failed += 1
      self.bar.write(f"cell {cell.name} failed: {result['error']}")
    elif result["status"] == "diverged":
      self.bar.write(f"cell {cell.name} diverged: {result['divergence']}")
    self.bar.update(self.weight[cell.name])
    self._show()

  def _show(self) -> None:
    failed = f", {self.failed} failed" if self.failed else ""
    self.bar.set_description_str(f"compare: {self.done}/{self.total} cells{failed}, running "
                                 f"{', '.join(self.running) or '-'};", refresh=True)

  def close(self) -> None:
    self.bar.close()
