"""The embedded text corpus and its windows (jaxdl.data.text)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from jaxdl.data import load_dataset
from jaxdl.data.text import TEST_FRACTION, corpus, unigram_nats, windows


def test_windows_do_not_overlap_and_cover_the_text_in_order():
  tokens = np.arange(10)
  w = windows(tokens, 3)
  assert w.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]  # context + 1, stride 3


def test_unigram_baseline_by_hand():
  # train counts a:3 b:1 (+1 each, vocab 3: a b c) -> p = 4/7, 2/7, 1/7
  nats = unigram_nats(np.array([0, 0, 0, 1]), np.array([0, 2]), 3)
  assert nats == pytest.approx(-(math.log(4 / 7) + math.log(1 / 7)) / 2)


def test_python_docs_decodes_back_to_its_text():
  ds = load_dataset("python_docs")
  text = corpus("python_docs")
  assert len(text) == 465_048 and ds.vocab == "".join(sorted(set(text)))
  cut = int(len(text) * (1 - TEST_FRACTION))
  first, last = ds.train.gather(np.array([0]))["tokens"][0], ds.test.arrays["tokens"][-1]
  decode = lambda ids: "".join(ds.vocab[i] for i in ids)
  assert decode(first) == text[:ds.context + 1]
  assert text[cut:].startswith(decode(ds.test.arrays["tokens"][0]))
  assert decode(last) in text[cut:]
  assert len(ds.train) == (cut - 1) // ds.context
  assert 2.5 < ds.unigram_nats_per_char < 4.5  # English: about 3 nats
