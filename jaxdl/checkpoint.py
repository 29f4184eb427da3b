"""Orbax checkpoints of a run's whole state, verified on restore."""
from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxdl.fingerprint import fingerprint

logging.getLogger("absl").setLevel(logging.ERROR)  # orbax logs every save


class Checkpointer:
  """Keeps the last `keep` checkpoints of `state` in `directory`.

  Each checkpoint stores, beside the state, a JSON record with the state's
  fingerprint, so that a checkpoint whose bytes changed is detected on restore
  instead of silently resuming from garbage.
  """

  def __init__(self, directory: Path, keep: int):
    self.directory = Path(directory).absolute()
    self._keep = keep
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True)
    return ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    meta = dict(meta, step=step, state_fingerprint=fingerprint(state))
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

  def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
    """The newest checkpoint that restores and verifies, or None.

    A bad checkpoint is moved to ``<directory>.corrupt/`` (never deleted) with
    a warning, and the one before it is tried.
    """
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        meta = dict(restored.meta)
        if fingerprint(restored.state) != meta.get("state_fingerprint"):
          raise ValueError("its contents do not match the fingerprint saved with it")
        return restored.state, meta
      except Exception as e:  # orbax and tensorstore raise many types
        aside = self.directory.with_name(self.directory.name + ".corrupt") / str(step)
        # The first line of the cause: tensorstore's errors run to dozens of lines.
        cause = (str(e).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"checkpoint of step {step} is unreadable ({type(e).__name__}: {cause})"
                      f"\nmoved it to {aside}; resuming from the one before it", stacklevel=2)
        self._manager.close()
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(self.directory / str(step), aside)
        self._manager = self._open()
    return None

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def placed_like(restored: Any, live: Any) -> Any:
  """`restored` (restored into ``abstract(live)``) with each array that
  `live` holds uncommitted to a device uncommitted too. Orbax commits what
  it restores, and a jitted step called with committed arrays where it was
  traced with uncommitted ones lowers to another program (its inputs'
  shardings spelled out): a resumed run would compile its step anew, a miss
  in JAX's persistent cache too. The values are the same."""
  def place(r, l):
    if (isinstance(l, jax.Array) and isinstance(r, jax.Array) and not l.committed
        and r.committed and not r.weak_type and r.is_fully_addressable
        and not jax.dtypes.issubdtype(r.dtype, jax.dtypes.prng_key)):
      return jax.device_put(np.asarray(r))
    return r
  return jax.tree.map(place, restored, live)


def abstract(tree: Any) -> Any:
  """Shape/dtype structure of `tree`, the target orbax restores into."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)
