"""Config validation, overrides and hashing."""

from __future__ import annotations

import pytest
from conftest import minimal

from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config


def test_minimal_config_validates_and_resolves_defaults():
    cfg = build_config(minimal()).resolved()
    assert cfg.train.aggregation == "concat"
    assert cfg.model.bottom == "mlp2"


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as exc:
        build_config(minimal(train={"epoch": 3}))
    msg = str(exc.value)
    assert "train.epoch" in msg and "epochs" in msg and "batch_size" in msg
    assert "(did you mean 'epochs'?)" in msg  # the closest valid key


def test_set_value_that_is_not_yaml_is_named():
    """A YAML syntax error in --set used to surface as 'Input should be a valid list'."""
    with pytest.raises(ConfigError, match=r"--set 'attacks=\[\{name: x\}': the value .* is not valid YAML"):
        build_config(minimal(), ["attacks=[{name: x}"])


def test_infinite_and_nan_numbers_are_refused():
    for value in (".inf", ".nan"):
        with pytest.raises(ConfigError, match="train.lr: Input should be a finite number"):
            build_config(minimal(), [f"train.lr={value}"])


def test_unknown_top_level_section_lists_sections():
    with pytest.raises(ConfigError, match="valid keys here are: data, model, train"):
        build_config({**minimal(), "trainer": {}})


def test_set_overrides_nested_and_list_items():
    raw = minimal(defenses=[{"name": "x", "strength": 1}])
    cfg = build_config(raw, ["train.epochs=7", "defenses.0.strength=0.5", "data.options.n_samples=300"])
    assert cfg.train.epochs == 7
    assert cfg.defenses[0].params() == {"strength": 0.5}
    assert cfg.data.options == {"n_samples": 300}


def test_bad_override_syntax_and_index():
    with pytest.raises(ConfigError, match="key=value"):
        build_config(minimal(), ["train.epochs"])
    with pytest.raises(ConfigError, match="not a valid index"):
        build_config(minimal(), ["defenses.3.strength=1"])


@pytest.mark.parametrize(("algorithm", "aggregation"), [("vlr", "concat"), ("vlr", "mean")])
def test_aggregation_not_allowed_by_algorithm(algorithm, aggregation):
    message = f"aggregation '{aggregation}' is not allowed with {algorithm}; {algorithm} allows: sum"
    with pytest.raises(ConfigError, match=message):
        build_config(
            minimal(
                train={"algorithm": algorithm, "aggregation": aggregation},
                model={"bottom": "logreg", "top": "identity"},
            )
        )


def test_vlr_rejects_neural_bottoms():
    with pytest.raises(ConfigError, match="VLR uses logreg bottom models"):
        build_config(minimal(train={"algorithm": "vlr"}))


def test_hash_is_stable_and_sensitive():
    a = build_config(minimal())
    assert a.hash() == build_config(minimal()).hash()
    assert a.hash() != build_config(minimal(seed=1)).hash()
    assert a.hash() == build_config(minimal(train={"aggregation": "concat"})).hash()  # explicit default
