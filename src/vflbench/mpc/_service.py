"""Handles to live services (the dealer, the other party) that must never be copied or pickled.

A party's model may be deep-copied (e.g. by an attack that fine-tunes a copy of the bottom
model) or pickled. A handle to another party or to the dealer stands for a network connection,
not for data the copying party owns: a deep copy returns the same handle (the copy talks to the
same service), and pickling yields a :class:`DisconnectedService` that raises on any use, so the
other party's state never ends up inside a copy or a file written by the copying party.
"""

from __future__ import annotations

from typing import Any


class DisconnectedService:
    """What a pickled service handle becomes: any attribute access raises."""

    def __init__(self, description: str) -> None:
        object.__setattr__(self, "_description", description)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(
            f"{self._description} was pickled and is disconnected: a pickled copy of a party's model "
            "cannot talk to the other party or to the dealer"
        )

    def __repr__(self) -> str:
        return f"DisconnectedService({self._description!r})"


class ServiceHandle:
    """Base class: deep copy returns ``self``; pickling returns a :class:`DisconnectedService`."""

    def __deepcopy__(self, memo: dict[int, Any]) -> ServiceHandle:
        return self

    def __copy__(self) -> ServiceHandle:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (DisconnectedService, (repr(self),))
