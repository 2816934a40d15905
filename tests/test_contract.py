"""One contract test over every registered dataset, model, attack and defense."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from vflbench.attacks import ATTACKS, Attack, FeatureAttack, LabelAttack
from vflbench.data import DATASETS
from vflbench.defenses import DEFENSES, create_defense
from vflbench.models import MODELS, TOP_MODELS
from vflbench.protocol import Defense
from vflbench.registry import annotations_of, conforms


def _keyword_only(cls) -> None:
    for p in inspect.signature(cls).parameters.values():
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{cls.__name__}: parameter {p.name} must be keyword-only"


@pytest.mark.parametrize("entry", list(DEFENSES), ids=lambda e: e.name)
def test_defense_contract(entry):
    cls = entry.factory
    assert isinstance(cls, type) and issubclass(cls, Defense)
    assert cls.name == entry.name and entry.summary
    assert cls.side in ("active", "passive", "both")
    assert cls.paper, "cite the paper"
    _keyword_only(cls)
    defense = create_defense(entry.name)
    params = defense.get_params()
    assert set(params) <= set(inspect.signature(cls).parameters)
    assert type(defense)(**params).get_params() == params  # parameters are stored unmodified
    if cls.strength_param is not None:
        assert cls.strength_param in inspect.signature(cls).parameters
        assert cls.strength_direction.startswith(("larger is stronger", "smaller is stronger"))


@pytest.mark.parametrize("entry", list(ATTACKS), ids=lambda e: e.name)
def test_attack_contract(entry):
    cls = entry.factory
    assert isinstance(cls, type) and issubclass(cls, Attack)
    assert cls.name == entry.name and entry.summary and cls.paper and cls.threat and cls.reads
    assert cls.target in ("labels", "features")
    # each kind derives from its own base, and carries none of the other kind's attributes
    own, other = (LabelAttack, FeatureAttack) if cls.target == "labels" else (FeatureAttack, LabelAttack)
    assert issubclass(cls, own) and not issubclass(cls, other)
    foreign = ("victim", "aux_size", "target_split") if own is LabelAttack else ("known_per_class", "prior", "select")
    assert not any(hasattr(cls, a) for a in foreign), f"{cls.__name__} has another kind's attributes"
    assert cls.phase in ("observer", "post_training", "malicious")
    _keyword_only(cls)
    attack = cls()
    assert attack.get_params() == cls(**attack.get_params()).get_params()


@pytest.mark.parametrize("registry", [DATASETS, MODELS, TOP_MODELS], ids=["datasets", "models", "top"])
def test_factories_take_keyword_only_options(registry):
    for entry in registry:
        assert entry.summary, entry.name
        for p in inspect.signature(entry.factory).parameters.values():
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{entry.name}: {p.name}"


def test_canonical_names_are_registered():
    datasets = {
        "digits",
        "breast_cancer",
        "wine",
        "synthetic",
        "mnist",
        "fashion_mnist",
        "tabmnist",
        "tabfmnist",
        "cifar10",
        "cifar100",
        "credit_default",
        "bank_marketing",
        "rt_iot2022",
        "trec",
        "ag_news",
        "criteo",
        "csv",
    }
    models = {"logreg", "mlp2", "mlp3", "lenet5", "vgg13", "resnet18", "conv2", "emb_mlp", "text_cnn"}
    assert datasets <= set(DATASETS.names())
    assert models <= set(MODELS.names())


def test_every_attack_and_defense_has_a_line_in_the_methods_doc():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", doc, re.MULTILINE))
    missing = [n for n in [*ATTACKS.names(), *DEFENSES.names()] if n not in documented]
    assert not missing, f"docs/methods.md has no line for {missing}"


def _outside(constraint) -> float | None:
    """A number just outside ``constraint``'s bounds (None when it has none)."""
    for bound, step in ((constraint.ge, -1), (constraint.gt, 0), (constraint.le, 1), (constraint.lt, 0)):
        if bound is not None:
            return bound + step
    return None


@pytest.mark.parametrize(
    "registry",
    [DATASETS, MODELS, TOP_MODELS, ATTACKS, DEFENSES],
    ids=["datasets", "models", "top", "attacks", "defenses"],
)
def test_parameter_constraints_hold_for_defaults_and_refuse_values_outside(registry):
    """scikit-learn's check_param_validation: every default passes the one check (types from the annotation,
    bounds from the declared constraints), and a number outside a declared bound is refused with a one-line
    error naming the parameter, the value and the bound."""
    checked = 0
    for entry in registry:
        defaults = {
            p.name: p.default
            for p in inspect.signature(entry.factory).parameters.values()
            if p.default is not inspect.Parameter.empty and p.name != "root"
        }
        registry.check(entry.name, defaults)
        for name, constraint in entry.constraints.items():
            assert name in inspect.signature(entry.factory).parameters
            value = _outside(constraint)
            if value is None:
                continue
            annotation = annotations_of(entry.factory)[name]
            # the number as the annotation takes it: an integer for an integer knob, in a list for a list
            value = next(v for v in (int(value), value, [int(value)], [value]) if conforms(v, annotation))
            with pytest.raises(Exception) as info:  # ConfigError, DataError for datasets
                registry.check(entry.name, {name: value})
            message = str(info.value)
            assert "\n" not in message and f"{name!r} = {value}" in message and constraint.bounds() in message, message
            checked += 1
    assert checked > 0
