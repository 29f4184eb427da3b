"""A task's data as fields: dicts of arrays with one row per example.

Three kinds of training data (`to_data` takes what a script passes):

  * random access, `len` and ``gather(indices) -> fields``: a dict of arrays
    (`ArrayFields`) or a dataset's image split (`ImageFields`); each worker
    reads its own shard (`jaxdl.data.streams.WorkerStreams`);
  * `FunctionData`: ``fn(worker, step, seed) -> fields``, that worker's batch;
  * `IterableData`: global batches in order, split over the workers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from jaxdl.data.arrays import ArraySplit
from jaxdl.errors import TaskError

Fields = dict[str, np.ndarray]


def _describe(fields: Mapping[str, Any]) -> str:
  return ", ".join(f"{k} {np.shape(v)}" for k, v in fields.items())


def check_fields(fields: Any, task: str, where: str, rows: int | None = None) -> Fields:
  """`fields` as a dict of numpy arrays with one leading axis of `rows` (if
  given) shared by all; a TaskError naming `task` and `where` otherwise."""
  if not isinstance(fields, Mapping) or not fields:
    raise TaskError(task, where, "a non-empty dict of arrays, one row per example; "
                    f"got {type(fields).__name__}")
  out = {}
  for name, value in fields.items():
    array = np.asarray(value)
    if not isinstance(name, str) or array.ndim == 0 or array.dtype == object:
      raise TaskError(task, where, f"arrays with a leading example axis; field "
                      f"{name!r} is {array.dtype} of shape {array.shape}")
    out[name] = array
  lengths = {len(a) for a in out.values()}
  if len(lengths) != 1 or (rows is not None and lengths != {rows}):
    want = f"{rows} rows (the batch size)" if rows is not None else "the same number of rows"
    raise TaskError(task, where, f"fields with {want}; they have {_describe(out)}")
  return out


class ArrayFields:
  """Random access to a dict of in-memory arrays."""
  in_memory = True

  def __init__(self, arrays: Mapping[str, Any], task: str = "custom", where: str = "data"):
    self.arrays = check_fields(arrays, task, where)

  def __len__(self) -> int:
    return len(next(iter(self.arrays.values())))

  def gather(self, indices: np.ndarray) -> Fields:
    return {k: v[indices] for k, v in self.arrays.items()}


class ImageFields:
  """An image dataset's split (`jaxdl.data.Split`) as fields "image" and "label"."""

  def __init__(self, split):
    self.split = split
    self.in_memory = isinstance(split, ArraySplit)

  def __len__(self) -> int:
    return len(self.split)

  def gather(self, indices: np.ndarray) -> Fields:
    images, labels = self.split.gather(indices)
    return {"image": images, "label": labels}


@dataclasses.dataclass(frozen=True)
class FunctionData:
  """Training data as a function: ``fn(worker, step, seed)`` returns that
  worker's batch at its `step`-th batch, a dict of arrays whose rows are the
  worker's batch size. It must depend on nothing else (a resumed or
  replayed run asks again). An epoch, for the cadences that count in
  epochs (evaluation, checkpoints, --epochs), is `steps_per_epoch` steps."""
  fn: Callable[[int, int, int], Mapping[str, Any]]
  steps_per_epoch: int = 100


@dataclasses.dataclass(frozen=True)
class IterableData:
  """Training data as an iterable of global batches (dicts of arrays of the
  global batch size, the workers' batch sizes summed), e.g. a ``tf.data``
  dataset or a grain loader. Worker m's k-th batch is its slice of the k-th
  global batch (workers in order), so asynchronous workers that run ahead
  read ahead. Iterating it again must give the same batches: a resumed run
  skips the batches already read. An epoch is `steps_per_epoch` steps (unset:
  its len, if it has one, else 100)."""
  iterable: Iterable[Mapping[str, Any]]
  steps_per_epoch: int | None = None


def to_data(data: Any, task: str, where: str):
  """What a script passes as a task's data, as one of the kinds above."""
  if isinstance(data, (FunctionData, IterableData)) or hasattr(data, "gather"):
    return data
  if isinstance(data, Mapping):
    return ArrayFields(data, task, where)
  if callable(data):
    return FunctionData(data)
  if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
    return IterableData(data)
  raise TaskError(task, where, "a dict of arrays, a function (worker, step, seed) -> "
                  f"batch, or an iterable of batches; got {type(data).__name__}")


Data = Any  # ArrayFields | ImageFields | FunctionData | IterableData | a random-access split
