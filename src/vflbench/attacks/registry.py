"""The attack registry: attacks register by name here; :func:`create_attack` builds one with checked parameters."""

from __future__ import annotations

from typing import Any

from vflbench.attacks.base import Attack
from vflbench.errors import ConfigError
from vflbench.registry import Registry

ATTACKS: Registry[Attack] = Registry("attack")


def create_attack(name: str, **params: Any) -> Attack:
    """Build attack ``name`` from keyword parameters, checked by :func:`vflbench.registry.check_params`."""
    ATTACKS.check(name, params)
    try:
        return ATTACKS.create(name, **params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"attack {name!r}: {exc}") from None
