"""Datasets by name (jaxdl.data): the registry, prefixed names and unknown ones."""
import pytest

from jaxdl.data import DATASETS, check_name, describe_datasets, load_dataset
from jaxdl.errors import ConfigError


def test_registry_and_unknown_names():
  assert DATASETS.names() == ["digits", "mnist", "fashion_mnist", "python_docs", "synthetic"]
  names = [name for name, _ in describe_datasets()]
  assert names[-2:] == ["tfds:NAME", "npz:PATH"]
  assert all(doc for _, doc in describe_datasets())
  with pytest.raises(ConfigError, match="tfds:NAME, npz:PATH"):
    load_dataset("cifar10")
  with pytest.raises(ConfigError, match="image-size"):
    load_dataset("digits", image_size=32)


@pytest.mark.parametrize("name", ["digits", "synthetic", "tfds:cifar10", "npz:/nowhere/d.npz"])
def test_check_name_takes_every_loadable_name_without_reading_data(name):
  check_name(name)


@pytest.mark.parametrize("name", ["cifar10", "tfds:", "npz:", "", "Digits"])
def test_check_name_refuses_what_no_loader_takes(name):
  with pytest.raises(ConfigError, match="tfds:NAME, npz:PATH") as info:
    check_name(name)
  assert info.value.field == "dataset"
