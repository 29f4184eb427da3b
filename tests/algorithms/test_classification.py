"""Image classification as a task (jaxdl.task.classification): its evaluation."""
import jax
import numpy as np
import pytest

from jaxdl.data import load_dataset
from jaxdl.models import build_model
from jaxdl.task import classification

DIGITS = load_dataset("digits")


def test_evaluation_uses_the_running_statistics_and_counts_correct_labels():
  model = build_model("cnn_bn", 10, (8, 8, 1))
  task = classification(model, DIGITS)
  params, stats = model.init(jax.random.key(0))
  batch = task.test.gather(np.arange(64))
  base = task.evaluation(params, stats, batch)
  # the running means, not the batch's own statistics, normalize in evaluation
  shifted = jax.tree.map(lambda x: x + 3.0, stats)
  assert float(task.evaluation(params, shifted, batch)["loss"]) != pytest.approx(
      float(base["loss"]), rel=1e-3)
  logits, _ = model.apply(params, stats, batch["image"], False)
  expected = np.mean(np.argmax(np.asarray(logits), -1) == batch["label"])
  assert float(base["accuracy"]) == pytest.approx(expected)
