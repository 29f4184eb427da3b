"""Text for character-level language models: an embedded corpus, cut into
windows of characters.

A corpus is split by position: its first 90% of characters train, the rest
test. An example is a window of `context` + 1 consecutive characters (token
ids, the corpus's characters in sorted order); windows do not overlap, and the
loss predicts each of the last `context` from those before it.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
from importlib import resources

import numpy as np

from jaxdl.data.fields import ArrayFields

CORPORA = {"python_docs": "python_docs.txt.gz"}
"""Embedded corpora (jaxdl/data/corpora, with their licences in its README.md)."""
TEST_FRACTION = 0.1
CONTEXT = 64


@dataclasses.dataclass(frozen=True)
class TextDataset:
  """A character-level corpus: windows of token ids, in fields "tokens"."""
  name: str
  vocab: str            # token i is the character vocab[i]
  context: int          # characters a window predicts (its length is context + 1)
  train: ArrayFields
  test: ArrayFields
  unigram_nats_per_char: float
  """The test characters' cross-entropy under the training characters'
  frequencies (add-one smoothed): the baseline a model must beat."""


@functools.cache
def corpus(name: str) -> str:
  """The text of an embedded corpus."""
  data = resources.files("jaxdl.data").joinpath("corpora", CORPORA[name]).read_bytes()
  return gzip.decompress(data).decode("utf-8")


def windows(tokens: np.ndarray, context: int) -> np.ndarray:
  """Non-overlapping windows of context + 1 tokens: (N, context + 1) int32."""
  n = (len(tokens) - 1) // context
  return tokens[np.arange(n)[:, None] * context + np.arange(context + 1)].astype(np.int32)


def unigram_nats(train: np.ndarray, test: np.ndarray, vocab_size: int) -> float:
  counts = np.bincount(train, minlength=vocab_size) + 1.0
  return float(-np.mean(np.log(counts / counts.sum())[test]))


def load_text(name: str, context: int = CONTEXT) -> TextDataset:
  text = corpus(name)
  vocab = "".join(sorted(set(text)))
  lookup = {c: i for i, c in enumerate(vocab)}
  tokens = np.fromiter((lookup[c] for c in text), np.int32, len(text))
  cut = int(len(tokens) * (1 - TEST_FRACTION))
  train, test = tokens[:cut], tokens[cut:]
  return TextDataset(name, vocab, context,
                     train=ArrayFields({"tokens": windows(train, context)}, name, "train data"),
                     test=ArrayFields({"tokens": windows(test, context)}, name, "test data"),
                     unigram_nats_per_char=unigram_nats(train, test, len(vocab)))
