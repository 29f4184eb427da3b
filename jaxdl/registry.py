"""Plug-ins found by name: datasets, models, optimizers, algorithms."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from jaxdl.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
  """A name -> entry map whose failed look-ups raise a ConfigError."""

  def __init__(self, field: str):
    self.field = field  # the config field whose values name entries
    self._entries: dict[str, T] = {}
    self._docs: dict[str, str] = {}

  def register(self, name: str, doc: str = "") -> Callable[[T], T]:
    def add(entry: T) -> T:
      if name in self._entries:
        raise KeyError(f"{self.field} {name!r} registered twice")
      self._entries[name] = entry
      self._docs[name] = doc or (getattr(entry, "__doc__", "") or "").strip().split("\n")[0]
      return entry
    return add

  def add(self, entry: T) -> T:
    """Registers an entry that carries its own `name` and `doc`."""
    return self.register(entry.name, entry.doc)(entry)

  def remove(self, name: str) -> None:
    self._entries.pop(name)
    self._docs.pop(name)

  def get(self, name: str) -> T:
    if name not in self._entries:
      raise ConfigError(self.field, name, "one of " + ", ".join(self._entries))
    return self._entries[name]

  def doc(self, name: str) -> str:
    return self._docs[name]

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def names(self) -> list[str]:
    return list(self._entries)
