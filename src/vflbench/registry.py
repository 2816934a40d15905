"""Explicit name -> factory registries.

Each kind of component (datasets, models, attacks, defenses) has one :class:`Registry`.
Registration is explicit (a decorator next to the class), duplicates are rejected, and an
unknown name raises an error listing every valid name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from vflbench.errors import VFLBenchError, unknown_name

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component: its factory and the facts `vflbench describe` shows."""

    name: str
    factory: Callable[..., T]
    summary: str
    info: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """A registry of named factories of one kind (``"dataset"``, ``"model"``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str, *, summary: str = "", **info: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Register ``factory`` under ``name``; the decorator returns it unchanged."""

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise VFLBenchError(f"{self.kind} {name!r} is already registered")
            doc = (factory.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, factory, summary or (doc[0] if doc else ""), info)
            return factory

        return decorator

    def get(self, name: str) -> Entry[T]:
        """Return the entry for ``name`` or raise an error listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            raise unknown_name(self.kind, name, self._entries) from None

    def create(self, name: str, /, **kwargs: Any) -> T:
        """Build the component registered as ``name`` with keyword arguments."""
        return self.get(name).factory(**kwargs)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())
