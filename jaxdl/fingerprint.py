"""A canonical hash of a pytree's arrays: equal exactly when the bytes are equal."""
from __future__ import annotations

import hashlib

import jax
import numpy as np

from jaxdl.distributed import host_copy


def fingerprint(tree) -> str:
  """sha256 over (path, dtype, shape, bytes) of every leaf, in sorted path order."""
  leaves = jax.tree_util.tree_flatten_with_path(host_copy(tree))[0]
  by_path = sorted((jax.tree_util.keystr(path), leaf) for path, leaf in leaves)
  digest = hashlib.sha256()
  for path, leaf in by_path:
    array = np.ascontiguousarray(leaf)
    digest.update(f"{path}|{array.dtype}|{array.shape}|".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()
