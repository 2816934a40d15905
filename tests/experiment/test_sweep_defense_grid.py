"""A sweep grid over a defense parameter other than its strength knob keeps its points apart (issue 25's σ sweep)."""

from __future__ import annotations

from vflbench.experiment.sweep import _defense_label


def test_a_defense_grid_value_other_than_the_strength_names_the_defense():
    """Without the value in the label, every σ of ``vmask_alls`` (strength knob: budget) fell into one group of
    summary.csv and its intervals mixed the σ values."""
    alls = [{"name": "vmask_alls", "params": {"sigma": 0.1, "budget": 0.25}}]
    assert _defense_label(alls, {"seed": 0, "defenses.0.sigma": 0.1}) == "vmask_alls [sigma=0.1]"
    assert _defense_label(alls, {"seed": 0, "defenses.0.budget": 0.25}) == "vmask_alls"  # the strength column's
    assert _defense_label(alls, {"seed": 0, "defenses.0.strength": 0.25}) == "vmask_alls"
    assert _defense_label([], {"seed": 0, "defenses.0.sigma": 0.1}) == "none"
    stack = [{"name": "embedding_noise", "params": {}}, {"name": "vmask_alls", "params": {}}]
    assert _defense_label(stack, {"defenses.0.sigma": 0.5, "defenses.1.sigma": 0.1, "data.name": "digits"}) == (
        "embedding_noise+vmask_alls [vmask_alls.sigma=0.1]"
    )  # embedding_noise's sigma is its strength
