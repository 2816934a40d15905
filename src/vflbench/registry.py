"""Explicit name -> factory registries.

Each kind of component (datasets, models, attacks, defenses) has one :class:`Registry`.
Registration is explicit (a decorator next to the class), duplicates are rejected, and an
unknown name raises an error listing every valid name (and the closest one).

:func:`check_params` is the one check of a component's keyword parameters (attacks, defenses,
models, datasets): unknown names, types from the factory's annotations, ``Literal`` choices,
finite numbers and the ranges of :data:`RANGES` and :data:`MAXIMA`.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import math
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from vflbench.errors import ConfigError, VFLBenchError, unknown_name

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component: its factory and the facts `vflbench describe` shows."""

    name: str
    factory: Callable[..., T]
    summary: str
    info: dict[str, Any] = field(default_factory=dict)


class Params:
    """Components whose keyword-only constructor parameters are stored unmodified as attributes (scikit-learn
    style); attributes ending or starting with ``_`` are state, not parameters."""

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters, as given (for results and hashing)."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_")}


class Registry(Generic[T]):
    """A registry of named factories of one kind (``"dataset"``, ``"model"``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str | None = None, *, summary: str = "", **info: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Register ``factory`` under ``name`` (default: the class attribute ``name`` of a class, so that
        an attack or defense states its name once); the decorator returns it unchanged."""

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            key = name if name is not None else getattr(factory, "name", None)
            if not isinstance(key, str) or not key:
                raise VFLBenchError(f"a {self.kind} registered without a name needs a non-empty class attribute "
                                    f"'name' ({factory!r})")
            self._register(key, factory, summary, info)
            return factory

        return decorator

    def _register(self, name: str, factory: Callable[..., T], summary: str, info: dict[str, Any]) -> None:
        if name in self._entries:
            raise VFLBenchError(f"{self.kind} {name!r} is already registered")
        doc = (factory.__doc__ or "").strip().splitlines()
        self._entries[name] = Entry(name, factory, summary or (doc[0] if doc else ""), info)

    def get(self, name: str) -> Entry[T]:
        """Return the entry for ``name`` or raise an error listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            error = unknown_name(self.kind, name, self._entries)
            hint = closest(name, self._entries)
            raise type(error)(f"{error}{hint}") from None

    def check(self, name: str, params: Mapping[str, Any], *, reserved: Collection[str] = (),
              noun: str = "parameter", error: type[VFLBenchError] = ConfigError) -> None:
        """Check ``params`` of the component ``name`` (see :func:`check_params`)."""
        check_params(self.kind, name, self.get(name).factory, params, reserved=reserved, noun=noun, error=error)

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


# Parameters whose name fixes a sensible range, whatever component takes them: (lower bound, whether the
# bound itself is allowed). Each number (and each number in a list) given for them must lie in it.
RANGES: dict[str, tuple[float, bool]] = {
    **dict.fromkeys(("lr", "mc_lr", "d_lr", "e_lr", "disc_lr", "decoder_lr", "generator_lr", "inverse_lr", "opt_lr",
                     "shadow_lr", "teacher_lr", "d_dis_lr", "e_dis_lr"), (0.0, False)),
    **dict.fromkeys(("epochs", "mc_epochs", "shadow_epochs", "decoder_epochs", "pretrain_epochs", "teacher_epochs",
                     "inverse_epochs", "momentum", "mc_momentum", "sigma", "weight", "known_per_class"), (0.0, True)),
    **dict.fromkeys(("batch_size", "aux_batch_size", "mc_batch_size", "shadow_batch_size", "teacher_batch_size",
                     "aux_size", "n_targets", "hidden", "head_hidden", "decoder_width", "iterations", "steps"),
                    (1.0, True)),
    **dict.fromkeys(("aux_fraction", "test_fraction"), (0.0, False)),
}
# Layer widths: at most this many units (a typo such as 100000000000 fails here with a message, not in the
# memory allocator); the same bound as ``model.embed_dim``.
MAX_WIDTH = 1 << 20
MAXIMA: dict[str, float] = dict.fromkeys(("hidden", "head_hidden", "decoder_width", "embedding_dim", "channels",
                                          "n_filters"), MAX_WIDTH)
# Parameters for which +inf is a meaningful value (a privacy budget of infinity: no protection).
UNBOUNDED = frozenset({"epsilon"})


def closest_name(name: str, valid: Collection[Any]) -> str | None:
    """The valid name closest to ``name`` (difflib), or ``None`` when none is close."""
    match = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return match[0] if match else None


def closest(name: str, valid: Collection[Any]) -> str:
    """``" Did you mean 'x'?"`` for the valid name closest to ``name``, or ``""``."""
    match = closest_name(name, valid)
    return f" Did you mean {match!r}?" if match else ""


def show(value: Any) -> str:
    """``value`` as it is written in YAML (``true``, ``null``, ``.inf``), else its ``repr``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    return repr(value)


def check_params(kind: str, name: str, factory: Callable[..., Any], params: Mapping[str, Any], *,
                 reserved: Collection[str] = (), noun: str = "parameter",
                 aliases: Mapping[str, str] | None = None, error: type[VFLBenchError] = ConfigError) -> None:
    """Check keyword ``params`` against ``factory``'s signature before anything is built.

    Raises ``error`` (:class:`~vflbench.errors.ConfigError` unless told), naming the parameter, the
    value and what is valid, for: a name the factory does not take (with the closest valid one); a
    value that does not match the parameter's annotation (``Literal`` choices, ``int``, ``float``,
    ``bool``, ``str``, lists, optional values; ``true`` is not a number, ``.nan`` and ``.inf`` are
    not valid floats except +inf for :data:`UNBOUNDED` names); a number outside the range that
    :data:`RANGES` (or :data:`MAXIMA`) gives its name. ``reserved`` parameters are supplied by the framework;
    ``aliases`` maps extra accepted names to the parameter they stand for (a defense's ``strength``).
    """
    aliases = dict(aliases or {})
    signature = inspect.signature(factory)
    accepted = {p.name: p for p in signature.parameters.values()
                if p.name not in reserved and p.name != "self"
                and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    valid = [*accepted, *aliases]
    for key in params:
        if key not in valid and not open_ended:
            raise error(f"{kind} {name!r} has no {noun} {key!r}; valid {noun}s are: "
                              f"{', '.join(valid) or '(none)'}.{closest(key, valid)}")
    hints = _annotations(factory)
    for key, value in params.items():
        target = aliases.get(key, key)
        if target not in accepted:
            continue
        annotation = hints.get(target, Any)
        # a strength grid or the tuner may give a whole number as a float for an integer knob
        checked = int(value) if key in aliases and isinstance(value, float) and value.is_integer() else value
        if not _conforms(checked, annotation, allow_inf=target in UNBOUNDED):
            hint = closest(value, typing.get_args(annotation)) if isinstance(value, str) else ""
            raise error(f"{kind} {name!r}: {noun} {key!r} = {show(value)} is not valid; expected "
                              f"{_describe(annotation)}.{hint}")
        bound = RANGES.get(target)
        numbers = _numbers(value)
        if bound is not None and any(x < bound[0] or (x == bound[0] and not bound[1]) for x in numbers):
            relation = ">=" if bound[1] else ">"
            raise error(f"{kind} {name!r}: {noun} {key!r} = {show(value)} is not valid; it must be "
                              f"{relation} {bound[0]:g}.")
        most = MAXIMA.get(target)
        if most is not None and any(x > most for x in numbers):
            raise error(f"{kind} {name!r}: {noun} {key!r} = {show(value)} is not valid; it must be "
                        f"<= {int(most)} (a layer width).")


def _numbers(value: Any) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def _annotations(factory: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``factory``'s parameters (none when they cannot be resolved: then
    only the names are checked)."""
    try:
        return typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)  # type: ignore[misc]
    except (NameError, TypeError, AttributeError):
        return {}


_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Collection, collections.abc.Iterable)


def _conforms(value: Any, annotation: Any, *, allow_inf: bool = False) -> bool:
    """Whether a YAML value fits ``annotation`` (unknown annotations accept anything); a float must be
    finite (``allow_inf``: or +inf)."""

    def fits(v: Any, a: Any) -> bool:
        return _conforms(v, a, allow_inf=allow_inf)

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or annotation is inspect.Parameter.empty:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is typing.Annotated:
        return fits(value, args[0])
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (math.isfinite(value) or (allow_inf and value == math.inf)))
    if annotation is str:
        return isinstance(value, str)
    if origin in (dict, collections.abc.Mapping) or annotation is dict:
        return isinstance(value, dict) and (len(args) < 2 or all(fits(v, args[1]) for v in value.values()))
    if origin in _SEQUENCES or annotation in (list, tuple):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args, strict=True))
        return not args or all(fits(v, args[0]) for v in value)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _describe(annotation: Any, plural: bool = False) -> str:
    """What a value of ``annotation`` is, in words (``plural``: what several such values are)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is None or annotation is type(None):
        return "null"
    if origin is Literal:
        return ("values among " if plural else "one of ") + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        kinds = [_describe(a, plural) for a in args if a is not type(None)]
        return " or ".join(kinds) + (", or null" if type(None) in args else "")
    if origin is typing.Annotated:
        return _describe(args[0], plural)
    names = {bool: ("true or false", "booleans"), int: ("an integer", "integers"),
             float: ("a finite number", "finite numbers"), str: ("a string", "strings"),
             dict: ("a mapping", "mappings")}
    if annotation in names:
        return names[annotation][plural]
    if origin in (dict, collections.abc.Mapping):
        return "mappings" if plural else "a mapping"
    if origin in _SEQUENCES or annotation in (list, tuple):
        head = "lists" if plural else "a list"
        return f"{head} of {_describe(args[0], True)}" if args else head
    return getattr(annotation, "__name__", str(annotation))
