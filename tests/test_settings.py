"""Typed, documented, validated settings (jaxdl.settings): docs, symbols, coercion."""
from __future__ import annotations

import dataclasses
import math

import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.algorithms.asp import SSPSettings
from jaxdl.algorithms.easgd import EASGDSettings
from jaxdl.algorithms.gosgd import GoSGDSettings
from jaxdl.errors import ConfigError
from jaxdl.settings import Settings, field_docs, require, setting, symbol


@dataclasses.dataclass(frozen=True)
class Example(Settings):
  count: int = setting(3, symbol="n")
  """How many: an integer."""
  rate: float = 0.5
  """A rate,
  over two lines."""
  maybe: int | None = None
  """Unset: derived from the rest."""
  flag: bool = False
  label: str = "x"
  """A label."""

  def validate(self) -> None:
    require("count", self.count, self.count >= 0, "an integer >= 0")


@dataclasses.dataclass(frozen=True)
class Derived(Example):
  extra: float | None = setting(None, symbol="e")
  """One more."""


@dataclasses.dataclass(frozen=True)
class Unsupported(Settings):
  pair: tuple = (1, 2)
  """Tuples are not a settings type."""


def test_field_docs_reads_the_docstring_under_each_field():
  assert field_docs(Example) == {"count": "How many: an integer.",
                                 "rate": "A rate, over two lines.",
                                 "maybe": "Unset: derived from the rest.",
                                 "label": "A label."}  # flag has none
  assert field_docs(Derived) == {**field_docs(Example), "extra": "One more."}
  assert field_docs(Settings) == {}
  assert field_docs(SSPSettings)["staleness_bound"].startswith("SSP's bound s:")


def test_every_registered_setting_is_documented():
  # `jaxdl run --help` and `jaxdl list` show these docs.
  for name in ALGORITHMS:
    settings = ALGORITHMS.get(name).settings
    fields = [f.name for f in dataclasses.fields(settings)]
    assert sorted(field_docs(settings)) == sorted(fields), name


def test_symbol_is_the_short_name_in_labels():
  assert symbol(Example, "count") == "n"
  assert symbol(Example, "rate") is None
  assert symbol(Derived, "count") == "n" and symbol(Derived, "extra") == "e"
  assert symbol(SSPSettings, "staleness_bound") == "s"
  assert symbol(EASGDSettings, "communication_period") == "tau"
  assert symbol(EASGDSettings, "elasticity") == "alpha"
  assert symbol(GoSGDSettings, "gossip_probability") == "p"


def test_defaults_and_to_dict():
  assert Example().to_dict() == {"count": 3, "rate": 0.5, "maybe": None, "flag": False,
                                 "label": "x"}
  assert Settings().to_dict() == {}
  with pytest.raises(dataclasses.FrozenInstanceError):
    Example().count = 4


@pytest.mark.parametrize("value", [1.5, True, "3", None, 2.0])
def test_int_field_refuses_what_is_not_an_integer(value):
  with pytest.raises(ConfigError, match="an integer") as info:
    Example(count=value)
  assert info.value.field == "count" and info.value.value == value


def test_float_field_takes_integers_as_floats():
  example = Example(rate=1)
  assert example.rate == 1.0 and type(example.rate) is float
  assert Example(rate=0.25).rate == 0.25


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "0.5", None])
def test_float_field_refuses_non_finite_and_non_numbers(value):
  with pytest.raises(ConfigError, match="a finite number") as info:
    Example(rate=value)
  assert info.value.field == "rate"


def test_optional_fields_take_none_or_their_type():
  assert Example(maybe=None).maybe is None and Example(maybe=4).maybe == 4
  assert Derived(extra=None).extra is None
  extra = Derived(extra=2).extra
  assert extra == 2.0 and type(extra) is float
  for field, value in (("maybe", 2.5), ("maybe", "x"), ("extra", math.nan)):
    with pytest.raises(ConfigError) as info:
      Derived(**{field: value})
    assert info.value.field == field


def test_bool_and_str_fields_refuse_other_types():
  assert Example(flag=True).flag is True and Example(label="y").label == "y"
  with pytest.raises(ConfigError, match="true or false"):
    Example(flag=1)
  with pytest.raises(ConfigError, match="a string"):
    Example(label=3)


def test_validate_runs_after_the_types_are_checked():
  with pytest.raises(ConfigError) as info:
    Example(count=-1)
  assert str(info.value) == "--count=-1 is not valid: an integer >= 0"
  with pytest.raises(ConfigError, match="an integer$"):  # the type check comes first
    Example(count=-1.5)


def test_unsupported_field_type_is_a_programming_error():
  with pytest.raises(TypeError, match="pair"):
    Unsupported()


def test_require():
  require("count", 1, True, "anything")
  with pytest.raises(ConfigError, match=r"^--dc-beta=1\.0 is not valid: a decay$"):
    require("dc_beta", 1.0, False, "a decay")
