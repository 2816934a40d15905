"""The one parameter check: types by pydantic, bounds declared per class, both read by ``describe``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import pytest

from vflbench.errors import ConfigError, VFLBenchError
from vflbench.registry import Param, Params, Registry, allowed, conforms, constraints_of


class _Base(Params):
    constraints: ClassVar[Mapping[str, Param]] = {"lr": Param("learning rate", gt=0), "dropped": Param(ge=0)}

    def __init__(self, *, lr: float = 0.1, dropped: int = 0) -> None:
        self.lr = lr
        self.dropped = dropped


class _Child(_Base):
    """A component that extends its base's constraints and drops one of its parameters."""

    name = "child"
    constraints: ClassVar[Mapping[str, Param]] = {
        "sizes": Param("widths", ge=1, le=8),
        "mode": Param("how"),
        "budget": Param(ge=0, inf=True),
    }

    def __init__(
        self,
        *,
        lr: float = 0.1,
        sizes: Sequence[int] = (2, 3),
        mode: Literal["a", "b"] = "a",
        shape: tuple[int, int] | None = None,
        budget: float = 1.0,
        step: int = 8,
    ) -> None:
        self.lr = lr
        self.sizes = sizes
        self.mode = mode
        self.shape = shape
        self.budget = budget
        self.step = step


def _registry() -> Registry[Any]:
    registry: Registry[Any] = Registry("widget")
    registry.register()(_Child)
    return registry


def test_constraints_are_inherited_extended_and_limited_to_the_parameters_taken():
    assert set(constraints_of(_Child)) == {"lr", "sizes", "mode", "budget"}
    assert _registry().get("child").constraints["lr"].meaning == "learning rate"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lr": 0.0}, "widget 'child': parameter 'lr' = 0.0 is not valid; it must be > 0."),
        ({"sizes": [1, 9]}, "parameter 'sizes' = [1, 9] is not valid; it must be >= 1 and <= 8."),
        ({"sizes": "ab"}, "parameter 'sizes' = 'ab' is not valid; expected a list of integers."),
        ({"lr": True}, "parameter 'lr' = true is not valid; expected a finite number."),
        ({"lr": math.nan}, "parameter 'lr' = .nan is not valid; expected a finite number."),
        ({"step": "8"}, "parameter 'step' = '8' is not valid; expected an integer."),
        ({"step": 8.0}, "parameter 'step' = 8.0 is not valid; expected an integer."),
        ({"mode": "c"}, "parameter 'mode' = 'c' is not valid; expected one of 'a', 'b'."),
        ({"shape": [1, 2, 3]}, "parameter 'shape' = [1, 2, 3] is not valid"),
        ({"budget": -math.inf}, "parameter 'budget' = -.inf is not valid; it must be >= 0."),
        ({"budget": math.nan}, "parameter 'budget' = .nan is not valid; it must be >= 0."),
        (
            {"modes": "a"},
            "widget 'child' has no parameter 'modes'; valid parameters are: lr, sizes, mode, shape, "
            "budget, step. Did you mean 'mode'?",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_what_is_valid(params, message):
    with pytest.raises(ConfigError) as info:
        _registry().check("child", params)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_good_values_pass_as_yaml_gives_them():
    _registry().check("child", {"lr": 1, "sizes": [1, 8], "mode": "b", "shape": [1, 2], "budget": math.inf, "step": 3})


def test_conforms_is_strict_about_types():
    assert conforms([1, 2], tuple[int, int]) and not conforms([1], tuple[int, int])
    assert conforms(1, float) and not conforms(True, float) and not conforms(math.inf, float)
    assert conforms(math.inf, float, allow_inf=True)
    assert conforms({"a": 1.0}, dict[str, float]) and not conforms({"a": "x"}, dict[str, float])
    assert conforms(None, int | None) and not conforms(None, int)
    assert conforms(object(), Any)


def test_a_constraint_on_a_parameter_the_class_does_not_take_is_refused_at_registration():
    class Typo(_Child):
        name = "typo"
        constraints: ClassVar[Mapping[str, Param]] = {"setp": Param(ge=1)}

    with pytest.raises(VFLBenchError, match="widget 'typo' declares constraints on setp, which it does not take"):
        _registry().register()(Typo)


def test_describe_words_the_allowed_values():
    assert allowed(int | None, Param(ge=1)) == "an integer >= 1, or null"
    assert allowed(Sequence[int], Param(ge=1, le=8)) == "a list of integers, each >= 1 and <= 8"
    assert allowed(float, Param(ge=0, inf=True)) == "a number (.inf allowed) >= 0"
    assert allowed(int, Param(ge=512, multiple_of=8)) == "an integer a multiple of 8 and >= 512"
    assert allowed(Literal["a", "b"], Param()) == "one of 'a', 'b'"
