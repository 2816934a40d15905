"""Reproduce He et al., LabObf (2024): Table 3 (embedding extension attack against dCor) and
Tables 4-5 (LabObf: main accuracy, R_upper, R_lower, attack under LabObf), plus §5's false
attribute check, on UCI credit default (configs/repro/labobf_*.yaml).

Every config is run for each seed (``--seeds``). The paper reports top-1 accuracy for both the
main task and the label inference attack; the benchmark's runner scores binary attacks by AUC.
This script therefore scores every attack inference (and its local prior) under all three metrics
below: it trains with :func:`train_run` and runs the attacks itself, exactly as the runner does
(same views, same known labels, same selection rule), once per metric.

Selection rule (:data:`SELECTION`): every attack and prior is scored at its LAST fine-tuning epoch
(the library's default ``select: last``); no score is selected on the test split (``test_oracle`` is
refused). Records cached under another rule are recomputed.

* R_upper = the attack (model completion) on the raw model (no defense);
* R_lower = the attack's ``local`` prior: the attacker's architecture trained from scratch on its
  |D_aux| = 200 known labels only (no VFL model), measured on the raw run;
* LabObf  = the attack on the LabObf-trained bottom model.

Results are cached per (config, seed) as ``OUT/<name>-s<seed>.json``: an interrupted reproduction
resumes. Prints (and with ``--table`` writes) markdown tables, ours vs the paper's: every cell is the
mean over seeds with its 95% Student-t interval over the per-seed values (:mod:`vflbench.metrics.stats`;
one attack run per seed, so seeds x 1 repeat), differences (LabObf - R_lower, ...) paired by seed.

Run:  .venv/bin/python benchmarks/reproduce_labobf.py --data-root ../shared/datasets \\
          --out runs/labobf --seeds 0 1 2 --table runs/labobf/table.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import swap
import torch
from intervals import show, show_mean

from vflbench.attacks.base import LabelInference, Scores
from vflbench.attacks.label.embedding_extension import original_bottom
from vflbench.attacks.label.mixmatch import MixMatchCompletion
from vflbench.attacks.label.model_completion import ModelCompletion
from vflbench.experiment.config import load_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.results import write_atomic
from vflbench.experiment.run import TrainedRun, train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.experiment.scoring import score_inference
from vflbench.experiment.views import _view, scratch_models
from vflbench.metrics.correlation import distance_correlation
from vflbench.metrics.stats import difference_interval
from vflbench.rng import generator

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "configs" / "repro"

#: Datasets: (key, title, the paper's dataset its numbers are compared with, config stems by role).
#: Roles: t3_raw / t3_dcor / t3_ea (Table 3), raw / labobf (Tables 4-5), false (§5 false attribute); a
#: dataset may have only some (``epsilon_scaled``: raw and labobf, for Table 5 and the departure study).
DATASETS: list[tuple[str, str, str, dict[str, str]]] = [
    (
        "epsilon_like",
        "Epsilon stand-in (synthetic, 50 features, balanced)",
        "Epsilon",
        {
            "t3_raw": "labobf_epsilon_like_raw",
            "t3_dcor": "labobf_epsilon_like_dcor",
            "t3_ea": "labobf_epsilon_like_dcor_ea",
            "raw": "labobf_epsilon_like_raw",
            "labobf": "labobf_epsilon_like_labobf",
            "false": "labobf_epsilon_like_false_attribute",
        },
    ),
    (
        "credit",
        "UCI credit default (78% majority class)",
        "Bank (Tables 4-5) / Epsilon (Table 3, §5)",
        {
            "t3_raw": "labobf_credit_table3_raw",
            "t3_dcor": "labobf_credit_table3_dcor",
            "t3_ea": "labobf_credit_table3_dcor_ea",
            "raw": "labobf_credit_raw",
            "labobf": "labobf_credit_labobf",
            "false": "labobf_credit_false_attribute",
        },
    ),
    (
        "epsilon_scaled",
        "Epsilon stand-in at Epsilon's feature scale (columns standardised, x 1/sqrt(2000))",
        "Epsilon",
        {"raw": "labobf_epsilon_scaled_raw", "labobf": "labobf_epsilon_scaled_labobf"},
    ),
]
#: The paper's dataset each of ours is compared with in Tables 4-5 and the departure study.
PAPER_NAME = {"epsilon_like": "Epsilon", "credit": "Bank", "epsilon_scaled": "Epsilon"}

#: The paper's numbers (top-1 accuracy, %): Table 3 and §5 are on Epsilon; Tables 4-5 on Epsilon
#: (compared with the stand-in) and Bank (compared with credit default, the closest binary tabular task).
PAPER_T3 = {"t3_raw": (77.77, 62.73), "t3_dcor": (73.82, 51.42), "t3_ea": (74.89, 59.04)}
PAPER_T45 = {
    "epsilon_like": {"raw_acc": 77.90, "labobf_acc": 73.16, "r_upper": 63.03, "r_lower": 61.27, "labobf_attack": 50.35},
    "credit": {"raw_acc": 86.91, "labobf_acc": 85.32, "r_upper": 59.56, "r_lower": 55.34, "labobf_attack": 52.44},
}
PAPER_T45["epsilon_scaled"] = PAPER_T45["epsilon_like"]
PAPER_FALSE = (73.84, 50.25)  # §5, Epsilon: honest LabObf -> false attribute, main accuracy

#: Fig. 8-style sweep of the dCor weight lambda on the Epsilon stand-in (``--sweep``): dCor alone
#: and dCor with EA at each weight (0.08 is Table 3's and reuses its runs).
SWEEP_WEIGHTS = (0.08, 0.3, 1.0, 3.0)
SWEEP_STEMS = {"dcor": "labobf_epsilon_like_dcor", "dcor_ea": "labobf_epsilon_like_dcor_ea"}


#: ``--scales``: the Epsilon-scale stand-in's raw and LabObf runs again at other feature scales (1 = the
#: standardised stand-in, 1/sqrt(2000) = Epsilon's column scale, the configs' own value).
EPSILON_SCALE = 0.0223606797749979
SCALED_STEMS = ("labobf_epsilon_scaled_raw", "labobf_epsilon_scaled_labobf")


def scale_key(stem: str, scale: float, factor: int = 1) -> str:
    """The cache key of one run of the scale sweep (the config's own key at Epsilon's scale and its own
    epochs); ``factor``: the config's epochs times this (``--epoch-factors``)."""
    key = stem if abs(scale - EPSILON_SCALE) < 1e-9 else f"{stem}@s{scale:g}"
    return key if factor == 1 else f"{key}@x{factor}"


def scale_jobs(args: argparse.Namespace) -> list[tuple[str, tuple[str, ...], str]]:
    """The runs of ``--scales`` x ``--epoch-factors`` (raw and LabObf config of the Epsilon-scale stand-in)."""
    if not args.scales and not args.epoch_factors:
        return []
    todo = []
    for scale in args.scales or [EPSILON_SCALE]:
        for factor in args.epoch_factors or [1]:
            for stem in SCALED_STEMS:
                epochs = load_config(REPRO / f"{stem}.yaml").train.epochs * factor
                todo.append(
                    (
                        stem,
                        (f"data.options.feature_scale={scale!r}", f"train.epochs={epochs}"),
                        scale_key(stem, scale, factor),
                    )
                )
    return todo


#: The departure study: each dataset's LabObf run again with the attribute rescaled to [-1, 1]
#: (the library's earlier default) instead of Algorithm 2's raw integer 0..200.
NORMALISED = ("defenses.0.normalise=true",)


def sweep_key(role: str, weight: float) -> str:
    """The cache key of one sweep point (Table 3's own stem at lambda 0.08)."""
    stem = SWEEP_STEMS[role]
    return stem if weight == 0.08 else f"{stem}@w{weight:g}"


def embedding_dcor(run: Any, party: str = "passive_1", rows: int = 2000) -> float:
    """dCor between the attacker's ORIGINAL bottom-model embedding and the one-hot test labels."""
    p = {q.name: q for q in run.federation.parties()}[party]
    x, y = p.data.x_test[:rows], run.data.y_test[:rows]
    bottom = original_bottom(p.bottom)
    bottom.eval()
    with torch.no_grad():
        v = bottom(x)
    return float(distance_correlation(v, torch.nn.functional.one_hot(y, run.data.num_classes).float()))


#: The two label inference attacks every run is scored with (both on the configured attack's view:
#: the same D_aux rows): "mm" = Fu et al.'s MixMatch model completion, the attack LabObf evaluates
#: against (main rows); "mc" = supervised model completion (VMask Alg. 3), this benchmark's earlier
#: main rows. Each also runs with a frozen bottom model (only the head trained) and as its ``local``
#: prior (R_lower).
FLAVOURS: dict[str, tuple[type[ModelCompletion], dict[str, Any]]] = {
    "mm": (
        MixMatchCompletion,
        {"known_per_class": 100, "epochs": 10, "val_iteration": 256, "batch_size": 32, "prior": "local"},
    ),
    "mc": (ModelCompletion, {"known_per_class": 100, "epochs": 50, "batch_size": 32, "prior": "local"}),
}
#: How every attack and prior picks its reported epoch: the library's default, the last fine-tuning epoch
#: (``"validation"`` would select on the attacker's own held-out known labels; ``"test_oracle"`` is refused).
SELECTION = "last"

#: Scores: top-1 accuracy on the whole test split ("acc", the paper's metric), AUC ("auc", the CLI's
#: default for binary tasks) and top-1 accuracy on a class-balanced subsample of the test split ("bal").
METRICS = ("acc", "auc", "bal")


def balanced_ids(y: torch.Tensor, seed: int) -> torch.Tensor:
    """A class-balanced subsample of rows of ``y``: every class cut to the smallest class's count. Row ids, so on
    the CPU (as the attacks' score ids are) wherever ``y`` lives."""
    gen = generator(seed, "labobf", "balanced_test")
    y = y.cpu()
    counts = torch.bincount(y)
    n = int(counts[counts > 0].min())
    picked = [
        rows[torch.randperm(len(rows), generator=gen)[:n]]
        for rows in (torch.nonzero(y == c).flatten() for c in range(len(counts)))
        if len(rows)
    ]
    return torch.cat(picked).sort().values


def restrict(inf: LabelInference, ids: torch.Tensor) -> LabelInference:
    """The same inference with its test scores cut to rows ``ids`` (training scores dropped)."""
    if inf.per_epoch:
        return LabelInference(per_epoch=[restrict(e, ids) for e in inf.per_epoch], details=inf.details)
    assert inf.test is not None
    keep = torch.isin(inf.test.ids, ids)
    return LabelInference(test=Scores(inf.test.ids[keep], inf.test.scores[keep], "test"), details=inf.details)


def score_all(
    inf: LabelInference, y_train: torch.Tensor, y_test: torch.Tensor, balanced: torch.Tensor, select: str
) -> dict[str, float]:
    """The inference as top-1 accuracy, AUC and balanced-test accuracy (percent, higher = more leakage)."""
    return {
        "acc": 100 * score_inference(inf, y_train, y_test, "accuracy", select)[0],
        "auc": 100 * score_inference(inf, y_train, y_test, "auc", select)[0],
        "bal": 100 * score_inference(restrict(inf, balanced), y_train, y_test, "accuracy", select)[0],
    }


@dataclass
class Reproduced:
    """What :func:`run_one` returns: the record (as cached in ``OUT/<key>-s<seed>.json``) and the trained run
    (its federation, data and history), or ``None`` when the record came from the cache (``rerun=True`` trains
    again)."""

    record: dict[str, Any]
    run: TrainedRun | None


def make_attack(cls: type[ModelCompletion], params: dict[str, Any], **extra: Any) -> ModelCompletion:
    """One attack of :data:`FLAVOURS` with the selection rule :data:`SELECTION` unless its params name another,
    never ``test_oracle`` (a score selected on the test split)."""
    attack = cls(**{"select": SELECTION, **params, **extra})
    if attack.select == "test_oracle":
        raise SystemExit(
            f"error: {attack.name} with select: test_oracle picks its epoch on the test split; use last or validation"
        )
    return attack


def run_one(
    stem: str,
    seed: int,
    out: Path,
    data_root: str | None,
    overrides: tuple[str, ...] = (),
    key: str | None = None,
    rerun: bool = False,
) -> Reproduced:
    """Train one config at one seed (or load its cached record) and score both attack flavours.

    For each flavour (:data:`FLAVOURS`) it records the attack on the attacker's original bottom
    model (without the EA generator), the same attack with a FROZEN bottom model
    (``finetune_bottom=False``: the label information of the embedding itself) and its ``local``
    prior (R_lower), each under :data:`METRICS`, at the epoch the selection rule picks (:data:`SELECTION`, recorded as
    ``selection``); keys ``<flavour>_<attack|frozen|prior>_<metric>``, and the attack and prior at their LAST
    fine-tuning epoch (``<flavour>_<last|priorlast>_<metric>``; the same values under ``select: last``). A cached
    record is reused only with the same config hash and selection rule.
    """
    path = out / f"{key or stem}-s{seed}.json"
    cfg = load_config(REPRO / f"{stem}.yaml", [*overrides, f"seed={seed}"]).resolved()
    if path.exists() and not rerun:
        cached = json.loads(path.read_text())
        if cached.get("config_hash") == cfg.hash() and cached.get("selection") == SELECTION:
            return Reproduced(cached, None)
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)
    try:
        tic = time.perf_counter()
        vd = load_vertical_data(cfg, data_root)
        plan = validate_attacks(cfg, vd)
        run = train_run(cfg, vd, attacks=plan)
        last = run.history.epochs[-1]
        balanced = balanced_ids(vd.y_test, seed)
        objective = run.federation.active.objective
        predicted = objective.decode(run.federation.outputs("test"))
        record: dict[str, Any] = {
            "config": stem,
            "seed": seed,
            "config_hash": cfg.hash(),
            "n_train": len(vd.y_train),
            "n_test": len(vd.y_test),
            "n_balanced_test": len(balanced),
            "epochs": cfg.train.epochs,
            "model_acc": 100 * last["test_accuracy"],
            "model_auc": 100 * last.get("test_auc", float("nan")),
            "model_bal": 100 * float((predicted[balanced] == vd.y_test[balanced]).float().mean()),
            "majority": 100 * float(torch.bincount(vd.y_test).max() / len(vd.y_test)),
            "train_seconds": run.train_seconds,
            "dcor_attacker_embedding": embedding_dcor(run),
            "selection": SELECTION,
        }
        [planned] = plan.attacks
        record["configured_attack"] = planned.attack.name
        for flavour, (cls, params) in FLAVOURS.items():
            attack_tic = time.perf_counter()
            for variant, finetune in (("attack", True), ("frozen", False)):
                attack = make_attack(cls, params, finetune_bottom=finetune)
                view = _view(run, planned)
                inference = attack.complete(view, original_bottom(view.bottom()))
                for m, v in score_all(inference, vd.y_train, vd.y_test, balanced, attack.select).items():
                    record[f"{flavour}_{variant}_{m}"] = v
                if finetune:
                    for m, v in score_all(inference, vd.y_train, vd.y_test, balanced, "last").items():
                        record[f"{flavour}_last_{m}"] = v
            attack = make_attack(cls, params)
            view = _view(run, planned)
            local = attack.local(view.with_models(scratch_models(run, attack.party)))
            for m, v in score_all(local, vd.y_train, vd.y_test, balanced, attack.select).items():
                record[f"{flavour}_prior_{m}"] = v
            for m, v in score_all(local, vd.y_train, vd.y_test, balanced, "last").items():
                record[f"{flavour}_priorlast_{m}"] = v
            record[f"{flavour}_selection"] = attack.select
            record[f"{flavour}_seconds"] = time.perf_counter() - attack_tic
        record["seconds"] = time.perf_counter() - tic
    finally:
        torch.set_num_threads(previous)
    write_atomic(path, json.dumps(record, indent=1))
    return Reproduced(record, run)


def _by_seed(records: list[dict[str, Any]], key: str) -> dict[int, list[float]]:
    """seed -> [the record's ``key``] (one attack run per seed and config)."""
    return {r["seed"]: [float(r[key])] for r in records if key in r}


def _cell(records: list[dict[str, Any]], key: str) -> str:
    """The mean of ``key`` over the records' seeds with its 95% t interval over the per-seed values."""
    return show_mean(_by_seed(records, key), missing="-")


def _gap(treated: list[dict[str, Any]], treated_key: str, control: list[dict[str, Any]], control_key: str) -> str:
    """The mean of ``treated_key − control_key`` paired by seed, with its 95% t interval over the per-seed
    differences (seeds present in both)."""
    return show(difference_interval(_by_seed(treated, treated_key), _by_seed(control, control_key)), "+", missing="-")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _triple(records: list[dict[str, Any]] | None, prefix: str) -> str:
    """``acc | bal | auc`` cells of one quantity (``prefix`` = e.g. ``mm_attack``)."""
    if not records:
        return "- | - | -"
    return " | ".join(_cell(records, f"{prefix}_{m}") for m in ("acc", "bal", "auc"))


def _gap_triple(
    treated: list[dict[str, Any]], treated_prefix: str, control: list[dict[str, Any]], control_prefix: str
) -> str:
    """``acc | bal | auc`` cells of a difference paired by seed (e.g. the attack under LabObf − R_lower)."""
    return " | ".join(
        _gap(treated, f"{treated_prefix}_{m}", control, f"{control_prefix}_{m}") for m in ("acc", "bal", "auc")
    )


def notes(results: dict[str, list[dict[str, Any]]]) -> str:
    """What every cell is: the selection rule and what the interval is over."""
    records = [r for rs in results.values() for r in rs]
    rules = sorted({str(r.get(f"{f}_selection", r.get("selection"))) for r in records for f in FLAVOURS})
    seeds = sorted({r["seed"] for r in records})
    return "\n".join(
        [
            f"Selection rule: every attack and prior is scored at the epoch `select: {', '.join(rules)}` picks (the "
            "library's default: the last fine-tuning epoch; nothing is selected on the test split).",
            f"Cells: mean over seeds {seeds} [95% Student-t interval over the per-seed values, "
            f"{max(len(seeds) - 1, 0)} degrees of freedom] (vflbench.metrics.stats); one training and one attack run "
            "per seed (seeds x 1 repeat: the interval covers training and attack randomness together, not the "
            "sampling of the fixed test split). Differences (rows 'A - B') are paired by seed: the interval of the "
            "per-seed differences. In %, higher = more label leakage for attacks, better for main accuracy; the "
            "paper's values are top-1 accuracy, single runs.",
            "",
        ]
    )


def tables(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown tables, main rows = MixMatch (Fu et al.), ours (mean [95% interval] over seeds) vs the paper.

    Every attack cell is given as top-1 accuracy on the test split (the paper's metric), top-1
    accuracy on a class-balanced subsample of the test split, and AUC, all in %, higher = more leakage.
    """
    head = "ours acc | ours bal. acc | ours AUC"
    lines = [
        notes(results),
        "### Table 3: embedding extension attack (EA) against dCor (lambda 0.08); paper: Epsilon",
        "",
        f"| dataset | column | attack | Model Acc (ours) | Model Acc (paper) | Attack Acc (paper) | {head} | "
        "dCor(attacker emb., y) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"t3_raw": "Raw Model", "t3_dcor": "Discorloss w/o EA", "t3_ea": "Discorloss & EA"}
    for key, _, _, stems in DATASETS:
        for flavour, label in (("mm", "MixMatch"), ("mc", "supervised MC")):
            for role, column in names.items():
                rs = results.get(stems[role]) if role in stems else None
                if rs:
                    acc, attack = PAPER_T3[role]
                    lines.append(
                        f"| {key} | {column} | {label} | {_cell(rs, 'model_acc')} | {_f(acc)} | {_f(attack)} "
                        f"| {_triple(rs, flavour + '_attack')} | {_cell(rs, 'dcor_attacker_embedding')} |"
                    )
    lines += [
        "",
        "### Tables 4-5: LabObf (R_upper = attack on the raw model, R_lower = attacker's D_aux only, "
        "LabObf = attack under LabObf, Algorithm 2's raw attribute) and the §5 false-attribute check",
        "",
        f"| dataset (paper's) | row | paper (acc) | {head} |",
        "|---|---|---|---|---|---|",
    ]
    for key, _, _, stems in DATASETS:
        raw, obf = results.get(stems["raw"]), results.get(stems["labobf"])
        false = results.get(stems["false"]) if "false" in stems else None
        paper = PAPER_T45[key]
        ds = f"{key} ({PAPER_NAME[key]})"
        if raw:
            lines += [
                f"| {ds} | Table 4 Raw Model: main accuracy | {_f(paper['raw_acc'])} | {_triple(raw, 'model')} |",
                f"| {ds} | Table 5 R_upper (MixMatch) | {_f(paper['r_upper'])} | {_triple(raw, 'mm_attack')} |",
                f"| {ds} | Table 5 R_lower (MixMatch) | {_f(paper['r_lower'])} | {_triple(raw, 'mm_prior')} |",
                f"| {ds} | (extra) R_upper, supervised MC | - | {_triple(raw, 'mc_attack')} |",
                f"| {ds} | (extra) R_lower, supervised MC | - | {_triple(raw, 'mc_prior')} |",
                f"| {ds} | (extra) R_upper, MixMatch, frozen bottom | - | {_triple(raw, 'mm_frozen')} |",
            ]
        if obf:
            lines += [
                f"| {ds} | Table 4 LabObf: main accuracy | {_f(paper['labobf_acc'])} | {_triple(obf, 'model')} |",
                f"| {ds} | Table 5 LabObf (MixMatch) | {_f(paper['labobf_attack'])} | {_triple(obf, 'mm_attack')} |",
                f"| {ds} | (extra) LabObf, supervised MC | - | {_triple(obf, 'mc_attack')} |",
                f"| {ds} | (extra) LabObf, MixMatch, frozen bottom | - | {_triple(obf, 'mm_frozen')} |",
            ]
        if raw and obf:
            lines += [
                f"| {ds} | R_upper - R_lower (MixMatch) | {paper['r_upper'] - paper['r_lower']:+.2f} | "
                f"{_gap_triple(raw, 'mm_attack', raw, 'mm_prior')} |",
                f"| {ds} | LabObf - R_lower (MixMatch) | {paper['labobf_attack'] - paper['r_lower']:+.2f} | "
                f"{_gap_triple(obf, 'mm_attack', raw, 'mm_prior')} |",
                f"| {ds} | LabObf - R_upper (MixMatch) | {paper['labobf_attack'] - paper['r_upper']:+.2f} | "
                f"{_gap_triple(obf, 'mm_attack', raw, 'mm_attack')} |",
                f"| {ds} | (extra) LabObf - R_lower, supervised MC | - | "
                f"{_gap_triple(obf, 'mc_attack', raw, 'mc_prior')} |",
                f"| {ds} | (extra) LabObf - R_upper, supervised MC | - | "
                f"{_gap_triple(obf, 'mc_attack', raw, 'mc_attack')} |",
                f"| {ds} | Table 4 main accuracy, LabObf - Raw | {paper['labobf_acc'] - paper['raw_acc']:+.2f} | "
                f"{_gap_triple(obf, 'model', raw, 'model')} |",
            ]
        if false:
            lines += [
                f"| {key} (Epsilon, §5) | false attribute: main accuracy | {_f(PAPER_FALSE[1])} (honest "
                f"{_f(PAPER_FALSE[0])}) | {_triple(false, 'model')} |"
            ]
    lines.append("")
    for key, title, _, stems in DATASETS:
        rs = next((results[s] for s in stems.values() if s in results), None)
        if rs:
            r = rs[0]
            lines.append(
                f"- {key}: {title}; {r['n_train']} training / {r['n_test']} test rows "
                f"({r['n_balanced_test']} in the balanced subsample); majority class {r['majority']:.2f}% "
                f"of the test rows; seeds {sorted({x['seed'] for x in rs})}."
            )
    return "\n".join(lines) + "\n"


#: Departure study rows: (row, flavour, LabObf run: raw attribute?, score key, variant). Row 0 is the
#: earlier reproduction's setting; rows 1-5 remove one departure each (4 and 6 are checks of readings
#: the paper leaves open); the last rows remove several. Variant "attack": fine-tuned bottom, the epoch
#: :data:`SELECTION` picks (earlier revisions: the best on the test split); "frozen": head only; "last":
#: fine-tuned, last epoch.
DEPARTURE_ROWS = (
    ("0. earlier setting: supervised MC, attribute in [-1, 1], AUC", "mc", False, "auc", "attack"),
    ("1. Fu et al.'s MixMatch attack instead of supervised MC", "mm", False, "auc", "attack"),
    ("2. Algorithm 2's raw attribute 0..200", "mc", True, "auc", "attack"),
    ("3. top-1 accuracy instead of AUC", "mc", False, "acc", "attack"),
    ("4. (check) frozen bottom: head only, as a reading of Eq. 2", "mc", False, "auc", "frozen"),
    ("5. top-1 accuracy on a class-balanced test subsample", "mc", False, "bal", "attack"),
    ("6. (check) last fine-tuning epoch (earlier revisions: the best on the test split)", "mc", False, "auc", "last"),
    ("1+2. MixMatch and raw attribute, AUC", "mm", True, "auc", "attack"),
    ("1+2+3. MixMatch, raw attribute, top-1 accuracy (the paper's setting)", "mm", True, "acc", "attack"),
    ("1+2+5. MixMatch, raw attribute, balanced top-1 accuracy", "mm", True, "bal", "attack"),
    ("1+2+5+6. as above, last MixMatch epoch", "mm", True, "bal", "last"),
)


def departures_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Which departure accounts for the gap: each removed alone, then together.

    A dataset without its LabObf run with the [-1, 1] attribute (``@normalised``) shows only the rows
    with Algorithm 2's raw attribute.
    """
    lines = []
    for key, _, _, stems in DATASETS:
        raw, obf = results.get(stems["raw"]), results.get(stems["labobf"])
        norm = results.get(f"{stems['labobf']}@normalised")
        if not raw or not obf:
            continue
        paper = PAPER_T45[key]
        seeds = sorted({r["seed"] for r in raw} & {r["seed"] for r in obf} & {r["seed"] for r in norm or obf})
        lines += [
            "",
            f"### Departure study, {key} (paper: {PAPER_NAME[key]}: "
            f"R_upper {paper['r_upper']}, R_lower {paper['r_lower']}, LabObf {paper['labobf_attack']} "
            f"(top-1 acc); main acc raw {paper['raw_acc']} -> LabObf {paper['labobf_acc']}); seeds {seeds}",
            "",
            "| departure removed | unit | R_upper | R_lower | attack under LabObf | LabObf - R_lower | "
            "main acc raw -> LabObf |",
            "|---|---|---|---|---|---|---|",
        ]
        units = {"acc": "top-1 acc %", "bal": "balanced-test acc %", "auc": "AUC %"}
        for row, flavour, raw_attr, metric, variant in DEPARTURE_ROWS:
            run = obf if raw_attr else norm
            if not run:
                continue
            prior = "priorlast" if variant == "last" else "prior"
            upper, lower, under = (
                f"{flavour}_{variant}_{metric}",
                f"{flavour}_{prior}_{metric}",
                f"{flavour}_{variant}_{metric}",
            )
            if not all(under in r for r in (*raw, *run)):
                continue
            gap = _gap(run, under, raw, lower)
            main = "model_bal" if metric == "bal" else "model_acc"
            lines.append(
                f"| {row} | {units[metric]} | {_cell(raw, upper)} | {_cell(raw, lower)} | "
                f"{_cell(run, under)} | {gap} | {_cell(raw, main)} -> {_cell(run, main)} |"
            )
        lines.append(
            f"\nmajority class: {_cell(raw, 'majority')}% of the test rows; main acc in the rows scored "
            "on the balanced subsample is the main model's accuracy on that subsample."
        )
    return "\n".join(lines) + "\n"


def sweep_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """The dCor weight sweep: dCor alone vs dCor with EA at each weight (Fig. 8's axes), MixMatch attack."""
    lines = [
        "",
        "### Fig. 8-style sweep of the dCor weight on the Epsilon stand-in (the paper only plots it)",
        "",
        "| lambda | Model Acc dCor | Model Acc dCor & EA | Attack Acc dCor | Attack Acc dCor & EA | "
        "Attack AUC dCor | Attack AUC dCor & EA | dCor(emb., y) dCor | dCor(emb., y) dCor & EA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for weight in SWEEP_WEIGHTS:
        a, b = results.get(sweep_key("dcor", weight)), results.get(sweep_key("dcor_ea", weight))
        if a and b:
            cells = [
                f"{_cell(a, k)} | {_cell(b, k)}"
                for k in ("model_acc", "mm_attack_acc", "mm_attack_auc", "dcor_attacker_embedding")
            ]
            lines.append(f"| {weight:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def departure_jobs(args: argparse.Namespace) -> list[tuple[str, tuple[str, ...], str]]:
    """The departure study's runs (raw, LabObf, LabObf with the [-1, 1] attribute) of the datasets asked for."""
    todo: list[tuple[str, tuple[str, ...], str]] = []
    if args.departures:
        for key, _, _, roles in DATASETS:
            if args.datasets is None or key in args.datasets:
                todo += [
                    (roles["raw"], (), roles["raw"]),
                    (roles["labobf"], (), roles["labobf"]),
                    (roles["labobf"], NORMALISED, f"{roles['labobf']}@normalised"),
                ]
    return todo


def scale_table(results: dict[str, list[dict[str, Any]]], scales: list[float], factors: list[int]) -> str:
    """Table 5 on the stand-in at each feature scale and epoch factor: the paper's setting (MixMatch,
    Algorithm 2's raw attribute, top-1 accuracy; the epoch :data:`SELECTION` picks, and the last epoch =
    departure 6), main
    accuracy raw -> LabObf."""
    paper = PAPER_T45["epsilon_scaled"]
    lines = [
        "",
        "### Table 5 on the Epsilon stand-in by feature scale (MixMatch, raw attribute, top-1 acc %)",
        "",
        "| feature scale | epochs raw / LabObf | MixMatch epoch | R_upper | R_lower | LabObf | LabObf - R_lower | "
        "main acc raw -> LabObf |",
        "|---|---|---|---|---|---|---|---|",
        f"| paper, Epsilon (~{EPSILON_SCALE:.4f}) | 50 / 100 (400,000 rows) | - | {paper['r_upper']} | "
        f"{paper['r_lower']} | "
        f"{paper['labobf_attack']} | {paper['labobf_attack'] - paper['r_lower']:+.2f} | "
        f"{paper['raw_acc']} -> {paper['labobf_acc']} |",
    ]
    for scale, factor in ((s, f) for s in scales for f in factors):
        raw, obf = (results.get(scale_key(stem, scale, factor)) for stem in SCALED_STEMS)
        if not raw or not obf:
            continue
        for epoch, attack, prior in (
            (SELECTION, "mm_attack_acc", "mm_prior_acc"),
            ("last", "mm_last_acc", "mm_priorlast_acc"),
        ):
            lines.append(
                f"| {scale:.4g} | {raw[0]['epochs']} / {obf[0]['epochs']} | {epoch} | {_cell(raw, attack)} | "
                f"{_cell(raw, prior)} | "
                f"{_cell(obf, attack)} | {_gap(obf, attack, raw, prior)} | "
                f"{_cell(raw, 'model_acc')} -> {_cell(obf, 'model_acc')} |"
            )
    return "\n".join(lines) + "\n"


def jobs(args: argparse.Namespace) -> list[tuple[str, tuple[str, ...], str]]:
    """(stem, overrides, cache key) of every run asked for, seed-independent, in running order."""
    todo = departure_jobs(args)
    stems = list(
        dict.fromkeys(
            stem
            for key, _, _, roles in DATASETS
            for stem in roles.values()
            if args.datasets is None or key in args.datasets
        )
    )
    todo += [(stem, (), stem) for stem in stems if args.only is None or stem in args.only]
    if args.sweep:
        todo += [
            (SWEEP_STEMS[role], (f"defenses.0.weight={weight}",), sweep_key(role, weight))
            for weight in SWEEP_WEIGHTS
            for role in SWEEP_STEMS
        ]
    todo += scale_jobs(args)
    # one job per cache key: a config asked for twice (e.g. by --only and by --scales at its own scale, with
    # overrides that restate its values) is run and counted once
    first: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for job in todo:
        first.setdefault(job[2], job)
    return list(first.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", default="runs/labobf")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="config stems to run besides --departures/--sweep (default: all; none: only those)",
    )
    parser.add_argument("--table", default=None, help="also write the markdown tables here")
    parser.add_argument("--rerun", nargs="*", default=None, help="cache keys to recompute despite a cached record")
    parser.add_argument(
        "--departures",
        action="store_true",
        help="first run the departure study (raw, LabObf, LabObf with the [-1, 1] attribute), seed by seed",
    )
    parser.add_argument("--sweep", action="store_true", help="also run the Fig. 8-style dCor weight sweep")
    parser.add_argument(
        "--scales",
        type=float,
        nargs="+",
        default=None,
        help=f"also run the Epsilon-scale stand-in's raw and LabObf configs at these feature scales "
        f"(1 = standardised, {EPSILON_SCALE:.7f} = Epsilon's, the configs' own)",
    )
    parser.add_argument(
        "--epoch-factors",
        type=int,
        nargs="+",
        default=None,
        help="with --scales: also run them with the configs' epochs times these factors (default 1)",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        choices=[key for key, _, _, _ in DATASETS],
        help="restrict --departures and the default config stems to these settings (default: all)",
    )
    swap.add_arguments(parser)
    args = parser.parse_args(argv)
    swapped = swap.overrides(args)
    out = Path(args.out) / f"swap{swap.tag(swapped)}" if swapped else Path(args.out)
    results: dict[str, list[dict[str, Any]]] = {}
    todo = jobs(args)
    n_departure = len(departure_jobs(args))
    order = [(seed, job) for seed in args.seeds for job in todo[:n_departure]] + [
        (seed, job) for job in todo[n_departure:] for seed in args.seeds
    ]
    if swapped and todo:
        swap.check(REPRO / f"{todo[0][0]}.yaml", [*swapped, *todo[0][1]])
        write_atomic(out / "swap.json", json.dumps({"overrides": swapped}, indent=1))
    for seed, (stem, overrides, key) in order:
        record = run_one(
            stem, seed, out, args.data_root, (*swapped, *overrides), key, rerun=key in (args.rerun or ())
        ).record
        results.setdefault(key, []).append(record)
        sys.stderr.write(
            f"{key} seed {seed}: model {record['model_acc']:.2f}, MixMatch acc "
            f"{record['mm_attack_acc']:.2f} / AUC {record['mm_attack_auc']:.2f}, MC acc "
            f"{record['mc_attack_acc']:.2f} / AUC {record['mc_attack_auc']:.2f}, "
            f"{record['seconds']:.0f}s\n"
        )
        sys.stderr.flush()
    text = (
        tables(results)
        + (departures_table(results) if args.departures else "")
        + (sweep_table(results) if args.sweep else "")
        + (
            scale_table(results, args.scales or [EPSILON_SCALE], args.epoch_factors or [1])
            if args.scales or args.epoch_factors
            else ""
        )
    )
    sys.stdout.write(text)
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
