"""Defenses: the registry and construction from config specs.

Each defense is a :class:`~vflbench.protocol.hooks.Defense` subclass registered by name.
Its parameters are keyword-only; ``strength`` is accepted everywhere as an alias for the
defense's main knob (``strength_param``), so that sweeps treat all defenses alike.
"""

from __future__ import annotations

from typing import Any

from vflbench.errors import ConfigError
from vflbench.protocol.hooks import Defense
from vflbench.registry import Registry, check_params

DEFENSES: Registry[Defense] = Registry("defense")


def defense_class(name: str) -> type[Defense]:
    """The registered class of defense ``name`` (its metadata: side, surface, strength, ...)."""
    cls = DEFENSES.get(name).factory
    assert isinstance(cls, type) and issubclass(cls, Defense)
    return cls


def check_defense(name: str, params: dict[str, Any]) -> None:
    """Check a defense's parameters (``strength`` standing for its main knob) before it is built."""
    cls = defense_class(name)
    aliases = {"strength": cls.strength_param} if cls.strength_param else {}
    check_params(DEFENSES.kind, name, cls, params, aliases=aliases)


def create_defense(name: str, **params: Any) -> Defense:
    """Build defense ``name``; ``strength`` maps to its main knob; parameters are checked by
    :func:`check_defense`."""
    check_defense(name, params)
    cls = defense_class(name)
    if "strength" in params:
        if cls.strength_param in params:
            raise ConfigError(f"defense {name!r}: give 'strength' or {cls.strength_param!r}, not both")
        params[cls.strength_param] = params.pop("strength")  # type: ignore[index]
    try:
        return DEFENSES.create(name, **params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"defense {name!r}: {exc}") from None


from vflbench.defenses import gradient  # noqa: E402,F401,I001  (register)
from vflbench.defenses import correlation, bottlenecks, embedding  # noqa: E402,F401  (register)
from vflbench.defenses import labels  # noqa: E402,F401  (register)
from vflbench.defenses import labobf  # noqa: E402,F401  (register)
from vflbench.defenses import detectors  # noqa: E402,F401  (register)
from vflbench.defenses import paillier  # noqa: E402,F401  (register)
from vflbench.defenses import vmask  # noqa: E402,F401  (register)
