"""The language model in the box: --dataset python_docs --model transformer."""
from __future__ import annotations

import math

import pytest

import jaxdl
from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError

LM = dict(dataset="python_docs", model="transformer", batch_size=32, optimizer="adam",
          lr=3e-3, schedule="constant", progress=False)


@pytest.mark.slow
def test_the_transformer_beats_the_unigram_baseline(tmp_path):
  summary = jaxdl.run(RunConfig.make(steps=150, out=str(tmp_path / "lm"), **LM))
  assert summary["target_metric"] == "test_nats_per_char" and not summary["higher_is_better"]
  assert summary["test_perplexity"] == pytest.approx(math.exp(summary["test_nats_per_char"]))
  assert summary["unigram_perplexity"] == pytest.approx(
      math.exp(summary["unigram_nats_per_char"]))
  # below the unigram baseline by a margin: the model uses the context
  assert summary["test_nats_per_char"] < summary["unigram_nats_per_char"] - 0.4, summary


@pytest.mark.slow  # about a minute on 2 cores; test_task.py trains every algorithm by default
def test_asynchronous_workers_train_it_too(tmp_path):
  summary = jaxdl.run(RunConfig.make(steps=60, algorithm="asp", workers=4, engine="sim",
                                     compute_time=1e-3, out=str(tmp_path / "asp"), **LM))
  assert summary["test_nats_per_char"] < summary["unigram_nats_per_char"]


@pytest.mark.parametrize("dataset,model,kind", [("python_docs", "mlp", "a text model"),
                                                ("digits", "transformer", "an image model")])
def test_a_model_of_the_other_kind_is_refused(tmp_path, dataset, model, kind):
  with pytest.raises(ConfigError, match=f"--model='{model}' is not valid: {kind} for "
                                        f"--dataset {dataset}"):
    jaxdl.run(RunConfig.make(dataset=dataset, model=model, steps=1,
                             out=str(tmp_path / "x"), progress=False))
  assert not (tmp_path / "x").exists()


def test_a_language_model_task_is_a_transformer_unless_told():
  from jaxdl.data.text import load_text
  from jaxdl.task import language_model
  dataset = load_text("python_docs")
  task = language_model(dataset)
  assert task.name == "python_docs/transformer" == language_model(dataset, "transformer").name
  assert (task.target, task.higher_is_better) == ("nats_per_char", False)


def test_the_language_models_loss_is_the_weighted_mean_of_its_windows_nats():
  """A window's loss is its mean nats per character (evaluate's figure); a
  batch's is the windows' weighted sum, with the batch's shares as weights."""
  import jax
  import numpy as np
  from jaxdl.data.text import load_text
  from jaxdl.task import language_model
  task = language_model(load_text("python_docs"))
  params, state = task.init(jax.random.key(0))
  tokens = task.test.gather(np.arange(2))["tokens"]
  alone = [float(task.loss(params, state, {"tokens": tokens[i:i + 1], "weight": np.ones(1)},
                           None)[0]) for i in range(2)]
  for i in range(2):
    nats = task.evaluate(params, state, {"tokens": tokens[i:i + 1]})["nats_per_char"]
    assert alone[i] == pytest.approx(float(nats), rel=1e-6)
  assert alone[0] != pytest.approx(alone[1], rel=1e-3)
  both = task.loss(params, state, {"tokens": tokens, "weight": np.array([0.25, 0.75])}, None)[0]
  assert float(both) == pytest.approx(0.25 * alone[0] + 0.75 * alone[1], rel=1e-5)
