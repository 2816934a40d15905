"""Explicit name -> factory registries.

Each kind of component (datasets, models, attacks, defenses) has one :class:`Registry`.
Registration is explicit (a decorator next to the class), duplicates are rejected, and an
unknown name raises an error listing every valid name (and the closest one).

:func:`check_params` is the one check of a component's keyword parameters (attacks, defenses,
models, datasets): unknown names, types from the factory's annotations (pydantic's ``TypeAdapter``),
``Literal`` choices, finite numbers and the bounds each component declares per parameter
(:class:`Param`, in its ``constraints``), which ``vflbench describe`` shows too.
"""

from __future__ import annotations

import collections.abc
import difflib
import functools
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError

from vflbench.errors import ConfigError, VFLBenchError, unknown_name

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component: its factory and the facts `vflbench describe` shows."""

    name: str
    factory: Callable[..., T]
    summary: str
    info: dict[str, Any] = field(default_factory=dict)
    constraints: dict[str, Param] = field(default_factory=dict)


class Params:
    """Components whose keyword-only constructor parameters are stored unmodified as attributes (scikit-learn
    style); attributes ending or starting with ``_`` are state, not parameters. ``constraints`` declares what
    each parameter means and its bounds (:class:`Param`); :func:`check_params` enforces them before the
    constructor runs, so constructors check only what relates several parameters."""

    constraints: ClassVar[Mapping[str, Param]] = {}

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters, as given (for results and hashing)."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_")}


class Registry(Generic[T]):
    """A registry of named factories of one kind (``"dataset"``, ``"model"``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(
        self, name: str | None = None, *, summary: str = "", constraints: Mapping[str, Param] | None = None, **info: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Register ``factory`` under ``name`` (default: the class attribute ``name`` of a class, so that
        an attack or defense states its name once); the decorator returns it unchanged. ``constraints``
        declares a function's parameters (a class declares them in its ``constraints`` attribute)."""

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            key = name if name is not None else getattr(factory, "name", None)
            if not isinstance(key, str) or not key:
                raise VFLBenchError(
                    f"a {self.kind} registered without a name needs a non-empty class attribute 'name' ({factory!r})"
                )
            own = (
                {**vars(factory).get("constraints", {}), **(constraints or {})}
                if isinstance(factory, type)
                else dict(constraints or {})
            )
            unknown = set(own) - set(inspect.signature(factory).parameters)
            if unknown:
                raise VFLBenchError(
                    f"{self.kind} {key!r} declares constraints on {', '.join(sorted(unknown))}, which it does not take"
                )
            self._register(key, factory, summary, info, {**constraints_of(factory), **(constraints or {})})
            return factory

        return decorator

    def _register(
        self, name: str, factory: Callable[..., T], summary: str, info: dict[str, Any], constraints: dict[str, Param]
    ) -> None:
        if name in self._entries:
            raise VFLBenchError(f"{self.kind} {name!r} is already registered")
        doc = (factory.__doc__ or "").strip().splitlines()
        self._entries[name] = Entry(name, factory, summary or (doc[0] if doc else ""), info, constraints)

    def get(self, name: str) -> Entry[T]:
        """Return the entry for ``name`` or raise an error listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            error = unknown_name(self.kind, name, self._entries)
            hint = closest(name, self._entries)
            raise type(error)(f"{error}{hint}") from None

    def check(
        self,
        name: str,
        params: Mapping[str, Any],
        *,
        reserved: Collection[str] = (),
        noun: str = "parameter",
        error: type[VFLBenchError] = ConfigError,
    ) -> None:
        """Check ``params`` of the component ``name`` (see :func:`check_params`)."""
        entry = self.get(name)
        check_params(
            self.kind,
            name,
            entry.factory,
            params,
            constraints=entry.constraints,
            reserved=reserved,
            noun=noun,
            error=error,
        )

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


# Layer widths: at most this many units (a typo such as 100000000000 fails here with a message, not in the
# memory allocator); the same bound as ``model.embed_dim``.
MAX_WIDTH = 1 << 20


@dataclass(frozen=True)
class Param:
    """What one parameter means and which values it takes beyond its annotation (scikit-learn's
    ``_parameter_constraints``): bounds on every number it holds (a list's numbers too), a step
    (``multiple_of``), and whether +inf is a meaningful value (``inf``: a privacy budget of infinity).

    A component declares them per class in ``constraints`` (inherited and extended by subclasses), or,
    for a function, in :meth:`Registry.register`; :func:`check_params` and ``vflbench describe`` read them.
    """

    meaning: str = ""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    multiple_of: int | None = None
    inf: bool = False

    def bounds(self) -> str:
        """The bounds in words (``"> 0"``, ``">= 1 and <= 1048576"``; ``""`` when there are none)."""
        parts = [
            f"{op} {_number(x)}"
            for op, x in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if x is not None
        ]
        if self.multiple_of is not None:
            parts.insert(0, f"a multiple of {self.multiple_of}")
        return " and ".join(parts)

    def admits(self, value: Any) -> bool:
        """Whether every number in ``value`` lies within the bounds (NaN and -inf never do)."""
        for x in _numbers(value):
            outside = (
                (self.ge is not None and x < self.ge)
                or (self.gt is not None and x <= self.gt)
                or (self.le is not None and x > self.le)
                or (self.lt is not None and x >= self.lt)
            )
            if math.isnan(x) or x == -math.inf or outside or (self.multiple_of is not None and x % self.multiple_of):
                return False
        return True


#: Common parameters, declared alike wherever a component takes them (each component still lists its own).
LEARNING_RATE = Param("learning rate", gt=0)
EPOCHS = Param("passes over the data", ge=0)
BATCH = Param("rows per batch", ge=1)
COUNT = Param(ge=1)
NON_NEGATIVE = Param(ge=0)
POSITIVE = Param(gt=0)
PROBABILITY = Param(ge=0, le=1)
WIDTH = Param("units per layer", ge=1, le=MAX_WIDTH)


def constraints_of(factory: Callable[..., Any]) -> dict[str, Param]:
    """The constraints a class declares in ``constraints``, merged along its bases (a subclass's win), on the
    parameters it takes (a base may declare parameters that a subclass drops)."""
    merged: dict[str, Param] = {}
    for klass in reversed(getattr(factory, "__mro__", ())):
        merged.update(vars(klass).get("constraints", {}))
    taken = inspect.signature(factory).parameters
    return {k: v for k, v in merged.items() if k in taken}


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


def check_params(
    kind: str,
    name: str,
    factory: Callable[..., Any],
    params: Mapping[str, Any],
    *,
    constraints: Mapping[str, Param] | None = None,
    reserved: Collection[str] = (),
    noun: str = "parameter",
    aliases: Mapping[str, str] | None = None,
    error: type[VFLBenchError] = ConfigError,
) -> None:
    """Check keyword ``params`` against ``factory``'s signature and ``constraints`` before anything is built.

    Raises ``error`` (:class:`~vflbench.errors.ConfigError` unless told), naming the parameter, the
    value and what is valid, for: a name the factory does not take (with the closest valid one); a
    value that does not match the parameter's annotation (checked by pydantic in strict mode:
    ``Literal`` choices, ``int``, ``float``, ``bool``, ``str``, lists, optional values; ``true`` is not
    a number, ``.nan`` and ``.inf`` are not valid floats unless the parameter's :class:`Param` allows
    +inf); a number outside the parameter's bounds. ``constraints`` default to what the factory's class
    declares (:func:`constraints_of`). ``reserved`` parameters are supplied by the framework;
    ``aliases`` maps extra accepted names to the parameter they stand for (a defense's ``strength``).
    """
    aliases = dict(aliases or {})
    declared = constraints_of(factory) if constraints is None else constraints
    signature = inspect.signature(factory)
    accepted = {
        p.name: p
        for p in signature.parameters.values()
        if p.name not in reserved
        and p.name != "self"
        and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    valid = [*accepted, *aliases]
    for key in params:
        if key not in valid and not open_ended:
            raise error(
                f"{kind} {name!r} has no {noun} {key!r}; valid {noun}s are: "
                f"{', '.join(valid) or '(none)'}.{closest(key, valid)}"
            )
    hints = annotations_of(factory)
    for key, value in params.items():
        target = aliases.get(key, key)
        if target not in accepted:
            continue
        annotation = hints.get(target, Any)
        constraint = declared.get(target, Param())
        # a strength grid or the tuner may give a whole number as a float for an integer knob
        checked = int(value) if key in aliases and isinstance(value, float) and value.is_integer() else value
        if not conforms(checked, annotation, allow_inf=constraint.inf):
            hint = closest(value, typing.get_args(annotation)) if isinstance(value, str) else ""
            raise error(
                f"{kind} {name!r}: {noun} {key!r} = {show(value)} is not valid; expected {_describe(annotation)}.{hint}"
            )
        if not constraint.admits(value):
            raise error(
                f"{kind} {name!r}: {noun} {key!r} = {show(value)} is not valid; it must be "
                f"{constraint.bounds() or 'a number other than .nan and -.inf'}."
            )


def allowed(annotation: Any, constraint: Param) -> str:
    """The values a parameter takes, in words, from its annotation and its bounds (for ``vflbench describe``):
    ``"an integer >= 1, or null"``, ``"a list of integers, each >= 1"``."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return "any value"
    args = typing.get_args(annotation)
    nullable = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args
    kinds = [_describe(a) for a in args if a is not type(None)] if nullable else [_describe(annotation)]
    text = " or ".join(kinds)
    if constraint.inf:
        text = text.replace("a finite number", "a number (.inf allowed)")
    bounds = constraint.bounds()
    if bounds:
        text = (
            f"{text}, each {bounds}"
            if text.startswith("a list")
            else (f"{text}; numbers {bounds}" if len(kinds) > 1 else f"{text} {bounds}")
        )
    return f"{text}, or null" if nullable else text


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _numbers(value: Any) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def annotations_of(factory: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``factory``'s parameters (none when they cannot be resolved: then
    only the names are checked)."""
    try:
        return typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)  # type: ignore[misc]
    except (NameError, TypeError, AttributeError):
        return {}


_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Collection, collections.abc.Iterable)


@functools.cache
def _adapter(annotation: Any, allow_inf: bool) -> TypeAdapter[Any] | None:
    """pydantic's validator of ``annotation`` (``None`` for an annotation pydantic cannot validate: a module,
    a callable; such values are left to the constructor)."""
    try:
        return TypeAdapter(annotation, config=ConfigDict(allow_inf_nan=allow_inf, arbitrary_types_allowed=True))
    except (PydanticSchemaGenerationError, TypeError):
        return None


def conforms(value: Any, annotation: Any, *, allow_inf: bool = False) -> bool:
    """Whether a YAML value fits ``annotation``, by pydantic in strict mode on the value as JSON (so a list
    fills a tuple, but ``true`` is no number and ``"1"`` no integer); a float must be finite (``allow_inf``:
    or +inf; NaN and -inf are refused by :meth:`Param.admits`). Values JSON cannot hold are validated as
    Python objects."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return True
    adapter = _adapter(annotation, allow_inf)
    if adapter is None:
        return True
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = None
    try:
        if text is None:
            adapter.validate_python(value, strict=True)
        else:
            adapter.validate_json(text, strict=True)
    except ValidationError:
        return False
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
    names = {
        bool: ("true or false", "booleans"),
        int: ("an integer", "integers"),
        float: ("a finite number", "finite numbers"),
        str: ("a string", "strings"),
        dict: ("a mapping", "mappings"),
    }
    if annotation in names:
        return names[annotation][plural]
    if origin in (dict, collections.abc.Mapping):
        return "mappings" if plural else "a mapping"
    if origin in _SEQUENCES or annotation in (list, tuple):
        head = "lists" if plural else "a list"
        return f"{head} of {_describe(args[0], True)}" if args else head
    return getattr(annotation, "__name__", str(annotation))
