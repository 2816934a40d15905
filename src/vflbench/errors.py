"""User-facing errors.

Every problem caused by the user's input (a config, a name, a file) raises a
:class:`VFLBenchError` whose message says what was wrong and what is valid. The CLI prints
the message as one paragraph and exits non-zero; library users catch it like any exception.
"""

from __future__ import annotations

from collections.abc import Iterable


class VFLBenchError(Exception):
    """An error in the user's input, with a message meant to be read by a person."""


class ConfigError(VFLBenchError):
    """The experiment configuration is invalid."""


class DataError(VFLBenchError):
    """A dataset is missing, corrupt, or cannot be partitioned as asked."""


class CompatibilityError(VFLBenchError):
    """Components were combined in a way their threat model or requirements forbid."""


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> VFLBenchError:
    """Return an error for an unknown registry name that lists the valid ones."""
    names = ", ".join(sorted(valid))
    return VFLBenchError(f"unknown {kind} {name!r}; valid {kind} names are: {names}.")
