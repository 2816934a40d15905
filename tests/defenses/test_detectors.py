"""SplitGuard, Gradients Scrutinizer and received-gradient DP on digits; detectors judged by both rates.

Every detector result carries its detection rate (the share of its decisions that flag the run with the attack)
and its false-alarm rate (the same on honest training of the same scenario: the config without its malicious
attacks, same data, pool and seed). SplitGuard runs at the paper's settings (p_fake 0.1, N = 20, mean of the last
10 scores below 0.9; DMAVFL with its defaults: URVFL's tanh decoder, Adam 1e-4, 720 pretraining steps) on digits
(batch 32, 25 epochs, 300 held-out aux rows), under both conventions for DMAVFL's malicious party: it trains
SplitGuard's fake batches on their randomised labels (``cooperative``, DMAVFL's evaluation) or it recognises them,
owning the labels, and answers them honestly (``aware``). The rates over seeds are in
docs/notes/reproduction_dmavfl.md (benchmarks/reproduce_dmavfl.py, ``sg_digits_*``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import minimal

from vflbench.attacks.feature.dmavfl import DMAVFL
from vflbench.cli import detector_table
from vflbench.defenses import create_defense
from vflbench.defenses.detectors import (
    GradientScrutinizer,
    SplitGuard,
    _Running,
    scrutinizer_score,
    splitguard_score,
)
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import honest_config, run_experiment, train_run
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses, pool_rows
from vflbench.protocol import BindContext, Channel, StepState, default_objective

PARTIES = ("active", "passive_1")

SG = {"name": "splitguard"}  # the paper's settings: p_fake 0.1, start (N) 20, window 10, threshold 0.9
GS = {"name": "gradient_scrutinizer"}  # the original: a score every 50 gradients, each against 0.5
DATA = {"name": "digits", "parties": 2, "aux_pool": 300}  # the attackers' aux rows, held out of training
TRAIN = {"epochs": 25, "batch_size": 32, "optimizer": "adam", "lr": 1e-3}


def _config(attack: dict | None, defenses: list[dict], *, seed: int = 0, train: dict | None = None):
    return build_config(
        minimal(
            data=DATA,
            train={**TRAIN, **(train or {})},
            defenses=defenses,
            attacks=[attack] if attack else [],
            seed=seed,
        )
    )


def _rates(entry: dict) -> tuple[float, float]:
    """(detection rate, false-alarm rate) of one detector entry of result.json."""
    return entry["details"]["rate"], entry["honest_reference"]["rate"]


@pytest.mark.slow
def test_splitguard_at_the_papers_settings_flags_dmavfl_unless_the_attacker_answers_fake_batches_honestly(tmp_path):
    """Seed 0. Cooperative DMAVFL (training SplitGuard's fake batches on their randomised labels) is flagged at most
    decisions from early on, which halts the victim and spoils the reconstruction; the aware attacker passes like
    honest training and reconstructs. The honest reference is one run, shared by both."""
    results = {
        mode: run_experiment(_config({"name": "dmavfl", "splitguard": mode}, [SG]), out_dir=tmp_path)
        for mode in ("cooperative", "aware")
    }
    coop, aware = (results[m].defense[0] for m in ("cooperative", "aware"))
    assert coop["honest_reference"] == aware["honest_reference"]
    assert coop["honest_reference"]["decisions"] == coop["details"]["decisions"] >= 60
    detected, false_alarm = _rates(coop)
    assert detected > 0.9 and false_alarm < 0.05
    assert coop["details"]["parties"]["passive_1"]["first_flag_step"] < 200  # within DMAVFL's first epochs
    assert results["cooperative"].attacks[0].leakage < 0  # halted: worse than the aux-mean guess
    detected, false_alarm = _rates(aware)
    assert detected == 0.0 and false_alarm < 0.05
    attack = results["aware"].attacks[0]
    assert attack.value < attack.prior and attack.leakage > 30  # it still reconstructs
    assert attack.details["honest_batches"] > 0.05 * attack.details["malicious_batches"]


@pytest.mark.slow
def test_splitguard_flags_fsha_at_every_decision_and_honest_training_rarely(tmp_path):
    result = run_experiment(_config({"name": "fsha", "aux_batch_size": 32, "lr": 1e-3}, [SG]), out_dir=tmp_path)
    detected, false_alarm = _rates(result.defense[0])
    assert result.defense[0]["details"]["decisions"] >= 60
    assert detected == 1.0 and false_alarm < 0.05  # FSHA ignores the labels: fake and regular gradients look alike
    sg = result.defense[0]["details"]["parties"]["passive_1"]
    assert sg["halted"] and sg["first_flag_step"] <= 200  # at its first decision (its 10th fake batch)


@pytest.mark.slow
def test_gradient_scrutinizer_flags_fsha_but_not_honest_training():
    _, _, honest = _run("honest", GS, epochs=7, lr=3e-4)
    _, _, fsha = _run("fsha", GS, epochs=3, lr=3e-4)
    h = [s for _, _, s in honest.scores_]
    assert len(h) >= 5 and honest.detected_step_ is None and min(h) > 0.5
    assert fsha.detected_step_ == 51 and fsha.scores_[0][2] < 0.1  # no same/different-label gap at all


@pytest.mark.slow
def test_gradient_scrutinizer_flags_dmavfl_and_honest_training_alike_on_digits(tmp_path):
    """Both configurations of GS, watching only, seed 0: DMAVFL is flagged at most decisions (as at MNIST paper scale,
    docs/notes/reproduction_dmavfl.md), but honest training of the same scenario is flagged at most of them too, so GS
    detects nothing here; the shape of the issue's measurement on a tabular dataset (honest training flagged at 228
    of 346 decisions, DMAVFL at 313 of 316)."""
    watch = [{**GS, "halt": False}, {"name": "gradient_scrutinizer_dmavfl", "halt": False}]
    result = run_experiment(_config({"name": "dmavfl"}, watch), out_dir=tmp_path)
    for entry in result.defense:
        detected, false_alarm = _rates(entry)
        assert entry["details"]["decisions"] >= 10 and entry["honest_reference"]["decisions"] >= 10
        assert detected >= 0.8 and false_alarm >= 0.5 and detected - false_alarm <= 0.35
    attack = result.attacks[0]
    assert attack.value < attack.prior  # the attack it cannot tell from honest training reconstructs


def _run(attack: str, defense: dict, *, epochs: int, lr: float):
    spec = {"fsha": {"name": "fsha", "aux_batch_size": 32, "lr": 1e-3}}.get(attack)
    cfg = _config(spec, [defense], train={"epochs": epochs, "lr": lr})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    [detector] = run.federation.passives[0].defenses
    return run, plan, detector


# -- decisions, both rates, the honest reference -----------------------------------------------


class _RecordingDMAVFL(DMAVFL):
    """DMAVFL that records the batches it computes the malicious loss on."""

    def attack_step(self, state, ids, h, y):
        self.attacked.append(ids.clone())
        return super().attack_step(state, ids, h, y)


@pytest.mark.parametrize("mode", ["cooperative", "aware"])
def test_an_aware_dmavfl_never_applies_the_malicious_loss_on_a_fake_batch(mode):
    cfg = _config(
        {"name": "dmavfl", "pretrain_epochs": 1, "splitguard": mode},
        [{**SG, "p_fake": 0.3, "halt": False}],
        train={"epochs": 2},
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    attack = _RecordingDMAVFL(pretrain_epochs=1, splitguard=mode)
    attack.attacked = []
    attack.check(plan.scenario)
    plan.attacks[0].attack = attack
    run = train_run(cfg, vd, attacks=plan)
    [sg] = run.federation.passives[0].defenses
    fake = [sg.is_fake(ids) for ids in attack.attacked]
    steps = 2 * math.ceil(len(run.federation.train_rows) / 32)
    assert attack.malicious_batches_ + attack.honest_batches_ == sg.count_ == steps
    if mode == "cooperative":  # DMAVFL's evaluation: the fake batches get the malicious loss on randomised labels
        assert len(attack.attacked) == sg.count_ and sum(fake) > 0.15 * sg.count_
        return
    assert not any(fake)
    assert len(attack.attacked) == attack.malicious_batches_ and attack.honest_batches_ > 0.15 * sg.count_
    # every batch not attacked was a fake one: the fake batches of the run are exactly the ones answered honestly
    refused = sum(r["refused_updates"] for r in run.history.epochs)  # SplitGuard never applies a fake batch
    assert refused == attack.honest_batches_


def test_a_detector_counts_its_decisions_and_keeps_deciding_after_it_halts():
    sg = _bind(SplitGuard(window=2, threshold=0.5, start=0, p_fake=0.0, vector="embedding"), "passive_1")
    g = torch.ones(4, 3)
    state = StepState(0, 0, torch.arange(4), "passive_1")
    assert sg.on_received_gradient(g, state) is g
    for score in (0.9, 0.9, 0.2, 0.1, 0.9, 0.9):  # decisions from the 2nd score: means 0.9, 0.55, 0.15, 0.5, 0.9
        sg.record(state, score)
    details = sg.details()
    assert (details["decisions"], details["flagged"], details["rate"]) == (5, 1, 0.2)  # 0.5 is not below 0.5
    assert details["first_flag_step"] == 1 and details["halted"]
    assert sg.on_received_gradient(g, state) is None  # halted: every update refused, the scoring goes on
    watcher = _bind(
        SplitGuard(window=1, threshold=0.5, start=0, p_fake=0.0, vector="embedding", halt=False), "passive_1"
    )
    watcher.record(state, 0.1)
    assert watcher.details()["flagged"] == 1 and not watcher.halted and watcher.on_received_gradient(g, state) is g
    assert _bind(SplitGuard(), "active").details() == {}  # the active instance only coordinates


def test_result_json_gives_both_rates_and_the_honest_reference_is_the_same_scenario_without_the_attack(tmp_path):
    # GS first and both only watching: a detector that refuses a gradient hides it from those listed after it
    detectors = [{**GS, "halt": False}, {**SG, "p_fake": 0.3, "halt": False}]
    cfg = _config({"name": "dmavfl", "pretrain_epochs": 1}, detectors, train={"epochs": 3})
    result = run_experiment(cfg, out_dir=tmp_path)
    honest, resolved = honest_config(cfg), cfg.resolved()
    assert honest.attacks == [] and (honest.seed, honest.data, honest.defenses, honest.train, honest.model) == (
        resolved.seed,
        resolved.data,
        resolved.defenses,
        resolved.train,
        resolved.model,
    )
    reference = json.loads((tmp_path / honest.hash() / "result.json").read_text())  # a run of its own, kept
    saved = json.loads((tmp_path / cfg.hash() / "result.json").read_text())
    assert saved["defense"] == [dict(d) for d in result.defense]
    for entry, theirs in zip(saved["defense"], reference["defense"], strict=True):
        own, ref = entry["details"], entry["honest_reference"]
        assert own["decisions"] >= 1 and own["rate"] == own["flagged"] / own["decisions"]
        assert ref == {
            "config_hash": honest.hash(),
            "same_run": False,
            "without": ["dmavfl"],
            **{k: theirs["details"][k] for k in ("decisions", "flagged", "rate")},
        }
        assert theirs["honest_reference"]["same_run"] and theirs["honest_reference"]["config_hash"] == honest.hash()
    # the same scenario: the same rows held out (the pool) and trained on
    vd = load_vertical_data(cfg)
    assert torch.equal(pool_rows(honest, vd.y_train), pool_rows(cfg, vd.y_train))
    rows = [
        build_federation(
            c, vd, defenses=plan_defenses(c, ["passive_1"]), held_out=validate_attacks(c, vd).held_out()
        ).train_rows
        for c in (cfg, honest)
    ]
    assert torch.equal(rows[0], rows[1])
    # an observer attack leaves the training as it is: that run is its own honest reference, with the same numbers
    observed = run_experiment(
        build_config({**cfg.model_dump(mode="json", exclude={"sweep"}), "attacks": [{"name": "model_completion"}]}),
        out_dir=tmp_path,
    )
    for entry, theirs in zip(observed.defense, reference["defense"], strict=True):
        assert entry["honest_reference"]["same_run"] and entry["details"]["decisions"] == theirs["details"]["decisions"]
        assert entry["details"]["flagged"] == theirs["details"]["flagged"]
    # a second attacked config of the same scenario reuses the honest run
    stamp = (tmp_path / honest.hash() / "result.json").stat().st_mtime_ns
    aware = run_experiment(
        _config({"name": "dmavfl", "pretrain_epochs": 1, "splitguard": "aware"}, detectors, train={"epochs": 3}),
        out_dir=tmp_path,
    )
    assert (tmp_path / honest.hash() / "result.json").stat().st_mtime_ns == stamp
    assert aware.defense[0]["honest_reference"] == result.defense[0]["honest_reference"]
    # the CLI's table names both rates
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(detector_table(result))
    text = console.export_text()
    for entry in result.defense:
        assert f"{entry['details']['flagged']} / {entry['details']['decisions']}" in text
        assert f"{entry['honest_reference']['flagged']} / {entry['honest_reference']['decisions']}" in text


# -- coordination and score functions -------------------------------------------------------


def _bind(defense, party: str, num_classes: int = 10, seed: int = 0, shared: Channel | None = None):
    """Bind ``defense``'s half for ``party`` there; ``shared`` is the federation's channel every instance talks
    through."""
    channel = Channel(PARTIES) if shared is None else shared
    defense = defense.for_role("active" if party == "active" else "passive")
    defense.bind(
        BindContext(
            party,
            "vhnn",
            num_classes,
            2,
            torch.Generator().manual_seed(seed + hash(party) % 97),
            torch.Generator().manual_seed(seed),
            link=channel.endpoint(party),
        )
    )
    return defense


def test_splitguard_sides_agree_on_fake_batches_and_randomise_their_labels():
    active, passive = _bind(SplitGuard(p_fake=0.3), "active"), _bind(SplitGuard(p_fake=0.3), "passive_1")
    y = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(3))
    objective = active.transform_labels(default_objective(y, 10, single_logit=False))
    assert len(objective.targets) == 500
    fakes = 0
    for b in range(100):
        ids = torch.randperm(500, generator=torch.Generator().manual_seed(b))[:32]
        fake = passive.is_fake(ids)
        assert fake == active.is_fake(ids)
        got = objective.targets[ids]
        if fake:
            fakes += 1
            assert (got != y[ids]).all() and ((got >= 0) & (got < 10)).all()
            assert torch.equal(got, objective.targets[ids])  # deterministic per batch
        else:
            assert torch.equal(got, y[ids])
    assert 15 <= fakes <= 45


def test_gradient_scrutinizer_passive_side_gets_the_labels_from_the_active_side():
    y = torch.arange(20) % 3
    shared = Channel(PARTIES)
    active = _bind(GradientScrutinizer(), "active", shared=shared)
    active.transform_labels(default_objective(y, 3, single_logit=False))
    passive = _bind(GradientScrutinizer(start=3, every=1), "passive_1", shared=shared)
    assert torch.equal(passive.labels_, y)
    g = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    state = StepState(0, 0, torch.arange(20), "passive_1")
    assert passive.on_received_gradient(g, state) is g
    assert len(passive.same_mean_) == 1 and 0.0 <= passive.diff_mean_[0] <= 1.0


def test_gradient_scrutinizer_federations_built_interleaved_keep_their_own_labels():
    # two runs in one process, their binds interleaved (as when federations are built side by side); with
    # the labels handed over through class state, run A's passive side got run B's labels
    y_a, y_b = torch.arange(30) % 3, (torch.arange(30) + 1) % 3
    shared_a = Channel(PARTIES)
    shared_b = Channel(PARTIES)
    _bind(GradientScrutinizer(), "active", shared=shared_a).transform_labels(
        default_objective(y_a, 3, single_logit=False)
    )
    _bind(GradientScrutinizer(), "active", shared=shared_b).transform_labels(
        default_objective(y_b, 3, single_logit=False)
    )
    passive_a = _bind(GradientScrutinizer(), "passive_1", shared=shared_a)
    passive_b = _bind(GradientScrutinizer(), "passive_1", shared=shared_b)
    assert torch.equal(passive_a.labels_, y_a) and torch.equal(passive_b.labels_, y_b)
    with pytest.raises(RuntimeError, match="expected a 'gradient_scrutinizer.labels' message from 'active'"):
        _bind(GradientScrutinizer(), "passive_1", shared=Channel(PARTIES))  # a run whose active side shared nothing


def test_gradient_scrutinizer_of_two_built_federations_audits_each_ones_training_labels():
    feds = []
    for size in (400, 500):  # two different subsamples, so two different label vectors
        cfg = build_config(minimal(data={"name": "digits", "parties": 2, "train_size": size}, defenses=[GS]))
        vd = load_vertical_data(cfg)
        feds.append((build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"])), vd))
    for fed, vd in feds:
        [gs] = fed.passives[0].defenses
        assert torch.equal(gs.labels_, vd.y_train)


def test_gradient_scrutinizer_refuses_soft_labels_from_a_defense_listed_before_it():
    data = {"name": "breast_cancer", "parties": 2}
    cfg = build_config(minimal(data=data, defenses=[{"name": "labobf"}, GS]))
    vd = load_vertical_data(cfg)
    with pytest.raises(ConfigError, match="not class indices.*List gradient_scrutinizer before"):
        build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    # listed first, it audits the true labels and the soft labels are trained on
    cfg = build_config(minimal(data=data, defenses=[GS, {"name": "labobf"}]))
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    gs = next(d for d in fed.passives[0].defenses if isinstance(d, GradientScrutinizer))
    assert torch.equal(gs.labels_, vd.y_train) and fed.active.objective.targets.dtype.is_floating_point
    soft = default_objective(torch.arange(6) % 2, 2, single_logit=False)
    soft = soft.replace(targets=torch.full((6, 2), 0.5))
    with pytest.raises(ConfigError, match="not class indices"):
        _bind(GradientScrutinizer(), "active").transform_labels(soft)


def test_splitguard_score_is_high_when_fakes_differ_and_low_when_alike():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(50, dtype=torch.float64, generator=g)

    def running(vectors):
        r = _Running()
        for v in vectors:
            r.add(v)
        return r

    def noisy(v, n, scale=0.1):
        return [v + scale * torch.randn(v.shape, dtype=torch.float64, generator=g) for _ in range(n)]

    r1, r2 = running(noisy(base, 20)), running(noisy(base, 20))
    honest = splitguard_score(running(noisy(-3 * base, 5)), r1, r2, mult=5, exp=2, shift=0)
    hijacked = splitguard_score(running(noisy(base, 5)), r1, r2, mult=5, exp=2, shift=0)
    assert honest > 0.99 and hijacked < 0.5


def test_scrutinizer_score_separates_a_label_gap_from_none():
    n = 60
    steady = [0.5] * n
    gap = scrutinizer_score(steady, [0.9] * n, [0.05] * n, [0.05] * n, 50)
    none = scrutinizer_score(steady, [0.5] * n, [0.05] * n, [0.05] * n, 50)
    # gap 0.286 -> m_gap 0.606, err 0 -> m_err 2, disjoint -> m_iou 1: sigmoid(5 (1.21 - 0.7))
    assert gap == pytest.approx(1 / (1 + math.exp(-5 * (0.2857**0.4 * 2 - 0.7))), rel=1e-3)
    assert gap > 0.9 and none < 0.05


# -- received-gradient DP -------------------------------------------------------------------


def _state():
    return StepState(0, 0, torch.arange(64), "passive_1")


def test_received_gradient_dp_is_the_identity_at_infinite_epsilon():
    dp = _bind(create_defense("received_gradient_dp", epsilon=math.inf), "passive_1")
    g = torch.randn(64, 16)
    assert dp.on_received_gradient(g, _state()) is g
    assert create_defense("received_gradient_dp", strength=0.5).epsilon == 0.5


def test_received_gradient_dp_noise_has_the_laplace_scale_and_clipping_bounds_rows():
    dp = _bind(create_defense("received_gradient_dp", epsilon=2.0, clip=1.0), "passive_1")
    b = 64
    small = torch.full((b, 16), 1e-4 / b)  # per-sample L1 norm 1.6e-3 < clip: not clipped
    noise = torch.cat([(dp.on_received_gradient(small, _state()) - small) * b for _ in range(40)]).double()
    scale = 2 * 1.0 / 2.0  # 2 clip / epsilon
    assert noise.mean().abs() < 0.02
    assert noise.abs().mean() == pytest.approx(scale, rel=0.03)  # E|Lap(b)| = b
    assert noise.std() == pytest.approx(math.sqrt(2) * scale, rel=0.05)
    big = torch.full((b, 16), 10.0 / b)  # per-sample L1 norm 160: clipped to 1
    weak = _bind(create_defense("received_gradient_dp", epsilon=1e9, clip=1.0), "passive_1")
    out = weak.on_received_gradient(big, _state()) * b
    assert torch.allclose(out.abs().sum(1), torch.ones(b, dtype=out.dtype), atol=1e-5)


def test_received_gradient_dp_rejects_bad_parameters():
    with pytest.raises(ConfigError, match="'epsilon' = 0.0 is not valid; it must be > 0"):
        create_defense("received_gradient_dp", epsilon=0.0)
