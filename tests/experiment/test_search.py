"""The attacker search (``evaluation.attacker_search``, issue 25): each attack's own grid, selected on the
attacker's own validation rows (never the test rows), reported beside the default attacker and used by the
verdicts and by tune."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pandas as pd
import pytest
import torch
import yaml
from conftest import minimal
from rich.console import Console

from vflbench.attacks import ATTACKS
from vflbench.attacks.base import Attack, Scale
from vflbench.cli import _result_table
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import scenario_of, validate_attacks
from vflbench.experiment.results import RunResult
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.experiment.scoring import run_attacks
from vflbench.experiment.search import candidate_settings, choose, search_attack
from vflbench.experiment.sweep import run_sweep, scores_table
from vflbench.experiment.tune import tune
from vflbench.report import build_report

#: Model completion with a learning rate far too small to fine-tune anything in its 10 epochs: a weak default.
WEAK_MC = {"name": "model_completion", "lr": 1e-6, "epochs": 10, "prior": "random"}


def _search_cfg(attacks, **sections):
    return build_config(
        minimal(
            train={"epochs": 4},
            attacks=attacks,
            evaluation={"attacker_search": True, "search_budget": 8, "repeats": 2},
            **sections,
        )
    )


def _trained(cfg):
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    return plan, run, run_attacks(plan, run)[0]


def test_the_search_finds_a_better_learning_rate_than_a_weak_default_and_leaks_more():
    result = run_experiment(_search_cfg([WEAK_MC])).attacks[0]
    search = result.details["search"]
    assert search["status"] == "searched" and search["budget"] == 8
    assert search["grid_size"] == 55  # the grid's 54 and the default
    tried = search["tried"]
    assert len(tried) == 8 and tried[0]["setting"]["lr"] == 1e-6  # the default first, then 7 of the grid
    assert all("validation" in t for t in tried)
    # the chosen setting is the one with the best validation score (the earliest among ties)
    best = max(t["validation"] for t in tried)
    assert result.attacker_setting == next(t["setting"] for t in tried if t["validation"] == best)
    assert result.attacker_setting["lr"] > 1e-6 and not search["chosen_is_default"]
    assert result.leakage < 10.0  # the default barely moves its head
    assert result.leakage_worst >= result.leakage + 20.0
    assert len(result.leakages_worst) == 2 and result.leakage_worst_ci is not None
    assert result.undefended_leakage_worst == result.leakage_worst  # the run has no defense: it is its own
    assert "known labels" in search["selected_on"]


def test_selection_never_reads_a_test_label():
    """The same trained model searched twice, the second time with every test label changed: the settings
    tried, their validation scores and the choice are identical; only the final test score of the chosen
    attacker (which the test labels are for) changes."""
    plan, run, (default,) = _trained(_search_cfg([WEAK_MC]))
    corrupted = dataclasses.replace(
        run, data=dataclasses.replace(run.data, y_test=(run.data.y_test + 1) % run.data.num_classes)
    )
    truthful, lying = (
        dataclasses.replace(default, details=dict(default.details)),
        dataclasses.replace(default, details=dict(default.details)),
    )
    search_attack(plan.attacks[0], run, truthful)
    search_attack(plan.attacks[0], corrupted, lying)
    assert truthful.details["search"]["tried"] == lying.details["search"]["tried"]
    assert truthful.attacker_setting == lying.attacker_setting and not truthful.details["search"]["chosen_is_default"]
    assert truthful.value_worst != lying.value_worst  # the chosen attacker is scored on the test labels


def test_choose_takes_the_best_validation_score_and_the_default_on_ties():
    assert choose([{"score": 0.5}, {"score": 0.7}, {"score": 0.7}]) == 1
    assert choose([{"score": 0.7}, {"score": 0.7}]) == 0  # the default, tried first, wins a tie
    assert choose([{"refused": "no"}, {"score": 0.1}, {"score": float("nan")}]) == 1
    with pytest.raises(CompatibilityError, match="could not score any setting"):
        choose([{"refused": "no"}])


def test_candidates_are_the_default_then_a_seeded_subset_of_the_grid_scaled_to_the_configured_budget():
    cfg = _search_cfg([{**WEAK_MC, "epochs": 10}])
    vd = load_vertical_data(cfg)
    attack = validate_attacks(cfg, vd).attacks[0].attack
    scenario = scenario_of(cfg, vd)
    settings, size = candidate_settings(attack, scenario, 5, torch.Generator().manual_seed(0))
    again, _ = candidate_settings(attack, scenario, 5, torch.Generator().manual_seed(0))
    assert size == 55 and len(settings) == 5  # the grid's 54 and the default and settings == again
    assert settings[0] == {"lr": 1e-6, "epochs": 10, "optimizer": "adam", "head_hidden": 64}
    assert {s["epochs"] for s in settings[1:]} <= {5, 10, 20}  # Scale(0.5, 1, 2) of the configured 10
    everything, _ = candidate_settings(attack, scenario, 100, torch.Generator().manual_seed(0))
    assert len(everything) == 55 and len({json.dumps(s, sort_keys=True) for s in everything}) == 55
    assert Scale(0.5).of(1) == 1 and Scale(2.0).of(1e-3) == pytest.approx(2e-3)


def test_every_attack_declares_a_grid_of_its_own_parameters_or_none():
    """A grid names constructor parameters only (so the search sets what the config could set), never the
    threat model's grants, and attacks whose settings act during training declare none."""
    granted = {
        "known_per_class",
        "aux_size",
        "aux_fraction",
        "aux_classes",
        "party",
        "victim",
        "n_targets",
        "target_split",
        "val_per_class",
        "select",
        "prior",
        "metric",
    }
    searchable = set()
    for entry in ATTACKS:
        cls = entry.factory
        grid = cls.search_space
        assert not set(grid) & granted, cls.name
        params = inspect.signature(cls.__init__).parameters
        assert set(grid) <= set(params), (cls.name, set(grid) - set(params))
        if grid:
            searchable.add(cls.name)
            if cls.phase == "malicious":  # only its fine-tuning after training (active model completion)
                assert issubclass(cls, ATTACKS.get("model_completion").factory)
    assert {
        "model_completion",
        "model_completion_mixmatch",
        "labobf_adaptive_mixmatch",
        "vmask_weight_recovery",
        "model_inversion",
        "grna",
        "gia",
        "pcat",
    } <= searchable
    assert (
        not {"dmavfl", "sdar", "fsha", "agn", "embedding_extension", "norm_scoring", "direct_label_inference"}
        & searchable
    )
    assert Attack.search_space == {}


def test_search_switch_is_in_the_hash_only_when_on():
    off = build_config(minimal())
    assert off.hash() == build_config(minimal(evaluation={"search_budget": 3})).hash()
    on = build_config(minimal(evaluation={"attacker_search": True}))
    assert on.hash() != off.hash()
    assert on.hash() != build_config(minimal(evaluation={"attacker_search": True, "search_budget": 3})).hash()


def test_a_label_attack_needs_a_known_label_left_to_fine_tune_on():
    cfg = build_config(
        minimal(attacks=[{"name": "model_completion", "known_per_class": 1}], evaluation={"attacker_search": True})
    )
    with pytest.raises(ConfigError, match="val_per_class"):
        run_experiment(cfg)


def test_sweep_reports_the_searched_attacker_of_every_searchable_attack_of_every_point(tmp_path):
    """Breast cancer: model completion and black-box model inversion have grids; direction scoring, a function
    of the transcript, runs as configured only. A resumed sweep reads the searches from result.json."""
    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 3, "batch_size": 32},
        attacks=[
            {"name": "model_completion", "epochs": 5},
            {"name": "model_inversion", "mode": "black_box", "inverse_epochs": 4, "n_targets": 40},
            {"name": "direction_scoring", "epochs": [0]},
        ],
        defenses=[{"name": "embedding_noise", "strength": 0.1}],
        evaluation={"search_budget": 3},
    )
    raw["sweep"] = {"seeds": [0, 1], "attacker_search": True}
    cfg = build_config(raw)
    table = run_sweep(cfg, tmp_path)
    assert len(table) == 12 and set(table["defense"]) == {"none", "embedding_noise"}
    searchable = table[table["attack"] != "direction_scoring"]
    assert (searchable["search"] == "searched").all() and searchable["leakage_worst"].notna().all()
    assert searchable["attacker_setting"].map(lambda s: bool(json.loads(s))).all()
    assert searchable["leakage_worst_ci_low"].notna().all() and searchable["leakage_worst_ci_high"].notna().all()
    fixed = table[table["attack"] == "direction_scoring"]
    assert (fixed["search"] == "default attacker only").all() and fixed["leakage_worst"].isna().all()
    for path in (tmp_path / "runs").glob("*/result.json"):
        for attack in json.loads(path.read_text())["attacks"]:
            search = attack["details"]["search"]
            if attack["name"] == "model_inversion":
                assert "auxiliary rows" in search["selected_on"] and len(search["tried"]) == 3
                assert all(t["validation"] > 0 for t in search["tried"])  # reconstruction MSEs of held-out rows
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert "eps_p.model_completion [searched]" in scores.columns
    report = build_report(tmp_path).read_text()
    assert "searched ε_p [95% CI]" in report and "default attacker only" in report

    def refuse(*_):
        raise AssertionError("a finished point ran again")

    again = run_sweep(cfg, tmp_path, resume=True, runner=refuse)
    assert again["leakage_worst"].tolist() == pytest.approx(table["leakage_worst"].tolist(), nan_ok=True)


def _rows(defense, strength, default, searched, undefended, undefended_searched, loss):
    return [
        {
            "dataset": "d",
            "algorithm": "vhnn",
            "setting": "",
            "defense": defense,
            "strength": strength,
            "seed": s,
            "attack": "a",
            "attack_target": "labels",
            "attack_metric": "auc",
            "utility": 0.9,
            "utility_loss": loss,
            "leakage": d,
            "undefended_leakage": u,
            "leakage_worst": w,
            "undefended_leakage_worst": uw,
            "confidence": 0.95,
        }
        for s, (d, w, u, uw) in enumerate(zip(default, searched, undefended, undefended_searched, strict=True))
    ]


def _scores(rows, with_search=True):
    from vflbench.experiment.sweep import WORST_COLUMNS, _group_statistics

    table = pd.DataFrame(rows)
    _group_statistics(table, [([r["leakage"]], [r["undefended_leakage"]]) for r in rows])
    if with_search:
        _group_statistics(table, [([r["leakage_worst"]], [r["undefended_leakage_worst"]]) for r in rows], WORST_COLUMNS)
    return scores_table(table).set_index("defense")


def test_a_verdict_is_judged_against_the_stronger_of_the_default_and_the_searched_attacker():
    """The defense stops the default attacker (10 -> 2 points) but not the searched one (25 -> 24): against the
    default alone it protects, against the worst case it does not."""
    undefended, undefended_searched = [10.0, 11.0, 12.0], [24.0, 25.0, 26.0]
    rows = _rows("none", None, undefended, undefended_searched, undefended, undefended_searched, 0.0) + _rows(
        "d", 1.0, [2.0, 2.5, 3.0], [23.5, 24.0, 25.5], undefended, undefended_searched, 1.0
    )
    default_only = _scores(rows, with_search=False)
    assert default_only.loc["d", "verdict"] == "protects"
    scores = _scores(rows)
    assert scores.loc["d", "verdict"] == "no measurable protection" and pd.isna(scores.loc["d", "s_pu"])
    assert scores.loc["d", "worst_attack"] == "a [searched]"
    assert scores.loc["d", "worst_leakage"] == pytest.approx(24.33, abs=0.01)
    assert scores.loc["d", "eps_p.a"] == pytest.approx(2.5)


def test_tune_meets_the_budget_against_the_searched_attacker(tmp_path):
    """With the search on, tune's worst case is the strongest of the default and the searched attackers."""
    raw = minimal(
        train={"epochs": 4},
        attacks=[WEAK_MC],
        defenses=[{"name": "embedding_noise"}],
        evaluation={"repeats": 3, "search_budget": 4},
    )
    raw["sweep"] = {"attacker_search": True}
    result = tune(build_config(raw), tmp_path, budget=5.0, low=0.1, high=10.0, steps=2)
    assert all(t["worst_attack"] == "model_completion [searched]" for t in result.trace)
    undefended = json.loads(
        next(
            p for p in (tmp_path / "runs").glob("*/result.json") if not json.loads(p.read_text())["defense"]
        ).read_text()
    )["attacks"][0]
    assert undefended["leakage_worst"] > undefended["leakage"] + 20.0


@pytest.mark.parametrize(
    "attack",
    [
        {"name": "model_inversion", "mode": "query_free", "shadow_epochs": 2, "steps": 20},
        {"name": "gia", "shadow_epochs": 2, "opt_steps": 10},
        {"name": "grna", "epochs": 2, "shadow_epochs": 2},
        {"name": "pcat", "decoder_epochs": 2},
    ],
    ids=lambda a: a["name"] + ("_" + a["mode"] if "mode" in a else ""),
)
def test_feature_attacks_are_searched_on_held_out_auxiliary_rows(attack):
    """Every setting fits on the auxiliary rows left after the hold-out and is scored by the reconstruction MSE of
    the held-out rows, from the embeddings the victim sends for them."""
    cfg = build_config(
        minimal(
            data={"aux_pool": 100},
            train={"epochs": 2},
            attacks=[{**attack, "n_targets": 40}],
            evaluation={"attacker_search": True, "search_budget": 2},
        )
    )
    plan, run, (result,) = _trained(cfg)
    search_attack(plan.attacks[0], run, result)
    search = result.details["search"]
    aux = len(plan.attacks[0].aux.ids) if plan.attacks[0].aux is not None else None
    held = max(2, round(0.2 * aux)) if aux else None
    assert search["status"] == "searched" and len(search["tried"]) == 2
    assert search["selected_on"].startswith(f"{held} of the attacker's {aux} auxiliary rows")
    assert all(t["validation"] > 0 for t in search["tried"])
    assert result.leakage_worst is not None and result.attacker_setting is not None
    assert set(result.attacker_setting) == set(plan.attacks[0].attack.search_grid(plan.scenario))


def test_the_cli_run_table_shows_the_searched_attacker_beside_the_default(tmp_path, cli):
    config = tmp_path / "search.yaml"
    config.write_text(
        yaml.safe_dump(
            minimal(
                train={"epochs": 4},
                attacks=[WEAK_MC, {"name": "norm_scoring"}],
                data={"name": "breast_cancer"},
                evaluation={"search_budget": 3},
            )
        )
    )
    done = cli("run", str(config), "--set", "evaluation.attacker_search=true", "--out", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr
    assert "searched" in done.stdout
    result = json.loads(next((tmp_path / "runs").glob("*/result.json")).read_text())
    console = Console(width=250, record=True)
    console.print(_result_table(RunResult.from_dict(result)))
    table = console.export_text()
    assert "searched: lr=" in table and "default attacker only" in table
    mc, norm = result["attacks"]
    assert mc["attacker_setting"] is not None and mc["leakage_worst"] is not None
    assert norm["attacker_setting"] is None and norm["details"]["search"]["status"] == "default attacker only"
