"""Reproduce DMAVFL (Yao et al., arXiv 2404.19582): Table 1 (MNIST, Credit), Tables 7-9 (MNIST),
Table 2-style reconstruction grids and Figure 6-style detector plots.

Each experiment is a config of ``configs/repro/dmavfl_{mnist,credit}.yaml`` with the attack
swapped and defenses added. Experiments run one after another; each writes
``OUT/<name>.json`` (value, prior, diagnostics, utility, detector scores) and, for images,
``OUT/<name>.npz`` (the first 8 test rows: originals and reconstructions). An experiment whose
JSON exists is not run again, so an interrupted reproduction resumes. ``--report`` then writes
the markdown table (``--table``) and the PNGs (``--img``) from what is in ``OUT``.

Run:  .venv/bin/python benchmarks/reproduce_dmavfl.py --data-root /work/shared/datasets \\
          --out /tmp/dmavfl/runs [--only NAME ...] [--report --table T.md --img docs/img]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflbench.attacks.runner import _view, score_features, validate_attacks
from vflbench.config import build_config, load_config
from vflbench.eval.run import TrainedRun
from vflbench.eval.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.rng import generator

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "configs" / "repro"
SG = {"name": "splitguard"}  # original constants: p_fake 0.1, N 20, mean of the last 10 scores < 0.9
GS = {"name": "gradient_scrutinizer"}  # original constants: every 50 steps, threshold 0.5 on each score
GRID = 8


@dataclass
class Experiment:
    """One run: a base config, the attack (``None``: honest training), defenses, paper value."""

    config: str
    attack: str | None
    defenses: list[dict[str, Any]] = field(default_factory=list)
    paper: float | None = None
    paper_acc: float | None = None
    attack_params: dict[str, Any] = field(default_factory=dict)


def _mnist(attack: str | None, defenses: list[dict[str, Any]] | None = None, paper: float | None = None,
           paper_acc: float | None = None, **params: Any) -> Experiment:
    return Experiment("dmavfl_mnist", attack, defenses or [], paper, paper_acc, params)


def _credit(attack: str | None, defenses: list[dict[str, Any]] | None = None, paper: float | None = None,
            **params: Any) -> Experiment:
    return Experiment("dmavfl_credit", attack, defenses or [], paper, None, params)


FSHA_PARAMS = {"lr": 1.0e-3}  # FSHA's lr_tilde 1e-5 is too slow for our step budget (see the docs)
EXPERIMENTS: dict[str, Experiment] = {
    # Table 1, MNIST
    "mnist_dmavfl": _mnist("dmavfl", paper=0.0152),
    "mnist_dmavfl_sync": _mnist("dmavfl_sync", paper=0.0137),
    "mnist_fsha": _mnist("fsha", paper=0.0156, **FSHA_PARAMS),
    "mnist_agn": _mnist("agn", paper=0.0929),
    "mnist_fsha_bce": _mnist("fsha", paper=0.0156, wgan=False, **FSHA_PARAMS),  # URVFL's port: non-WGAN FSHA
    "mnist_honest_sg_gs": _mnist(None, [SG, GS], paper_acc=99.11),
    "mnist_dmavfl_sg": _mnist("dmavfl", [SG], paper=0.0152),
    "mnist_dmavfl_gs": _mnist("dmavfl", [GS], paper=0.0152),
    "mnist_fsha_sg": _mnist("fsha", [SG], paper=0.4674, **FSHA_PARAMS),
    "mnist_fsha_gs": _mnist("fsha", [GS], paper=0.5029, **FSHA_PARAMS),
    "mnist_agn_sg": _mnist("agn", [SG], paper=0.5067),
    "mnist_agn_gs": _mnist("agn", [GS], paper=0.5064),
    # both detectors only watching (threshold 0: never halt), to see DMAVFL's scores after the point of detection
    "mnist_dmavfl_monitor": _mnist("dmavfl", [{**SG, "threshold": 0.0}, {**GS, "threshold": 0.0}], paper=0.0152),
    # Table 1, Credit
    "credit_dmavfl": _credit("dmavfl", paper=0.4389),
    "credit_dmavfl_sync": _credit("dmavfl_sync", paper=0.4602),
    "credit_fsha": _credit("fsha", paper=0.5152, **FSHA_PARAMS),
    "credit_agn": _credit("agn", paper=1.0934),
    "credit_dmavfl_sg": _credit("dmavfl", [SG], paper=0.4389),
    "credit_fsha_sg": _credit("fsha", [SG], paper=0.6034, **FSHA_PARAMS),
    "credit_agn_sg": _credit("agn", [SG], paper=1.5348),
    # Table 7 (NoPeek, DMAVFL Eq. 6: alpha dCor + (1 - alpha) task), Table 8 (embedding noise), Table 9 (DP):
    # the settings where the paper's defenses start to bite (CPU budget: not the whole sweeps)
    "mnist_dmavfl_nopeek_0.95": _mnist("dmavfl", [{"name": "nopeek", "alpha": 0.95, "weighting": "convex"}],
                                       paper=0.0280, paper_acc=94.72),
    "mnist_dmavfl_nopeek_1.0": _mnist("dmavfl", [{"name": "nopeek", "alpha": 1.0, "weighting": "convex"}],
                                      paper=0.4759, paper_acc=69.03),
    "mnist_dmavfl_noise_0.5": _mnist("dmavfl", [{"name": "embedding_noise", "sigma": 0.5}], paper=0.0351,
                                     paper_acc=94.84),
    "mnist_dmavfl_dp_1": _mnist("dmavfl", [{"name": "received_gradient_dp", "epsilon": 1.0}], paper=0.0443,
                                paper_acc=94.97),
    "mnist_dmavfl_dp_10": _mnist("dmavfl", [{"name": "received_gradient_dp", "epsilon": 10.0}], paper=0.0122,
                                 paper_acc=97.36),
    # honest accuracy under the same defenses (the tables' "Honest Acc")
    "mnist_honest": _mnist(None, paper_acc=99.11),
    "mnist_honest_nopeek_0.95": _mnist(None, [{"name": "nopeek", "alpha": 0.95, "weighting": "convex"}],
                                       paper_acc=94.72),
    "mnist_honest_noise_0.5": _mnist(None, [{"name": "embedding_noise", "sigma": 0.5}], paper_acc=94.84),
    "mnist_honest_dp_1": _mnist(None, [{"name": "received_gradient_dp", "epsilon": 1.0}], paper_acc=94.97),
}


def build(exp: Experiment):
    """The experiment's config: the base file with its attack swapped and defenses added."""
    base = load_config(REPRO / f"{exp.config}.yaml")
    raw = base.model_dump(mode="json")
    [base_attack] = raw["attacks"]
    if exp.attack is None:
        raw["attacks"] = []
    else:
        spec = {**{k: v for k, v in base_attack.items() if k != "name"}, **exp.attack_params, "name": exp.attack}
        if exp.attack in ("agn", "fsha"):
            spec.pop("pretrain_epochs", None)
        raw["attacks"] = [spec]
    raw["defenses"] = exp.defenses
    raw.pop("sweep", None)
    return build_config(raw)


def run_one(name: str, exp: Experiment, data_root: str, out: Path) -> dict[str, Any]:
    """Train, attack, score; keep detector scores and the first rows' reconstructions."""
    cfg = build(exp)
    torch.set_num_threads(cfg.train.threads)
    tic = time.perf_counter()
    vd = load_vertical_data(cfg, data_root)
    plan = validate_attacks(cfg, vd)
    # train_run's steps, keeping the federation for the per-epoch (oracle) reconstruction curve
    names = [f"passive_{i + 1}" for i in range(len(vd.passive))]
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, names), keep=plan.keep, extra_dims=plan.extra_dims())
    plan.prepare(fed)
    curve: list[float | None] = []

    def epoch_end(epoch: int, record: dict[str, Any]) -> None:
        curve.append(epoch_mse(plan, fed, vd))

    started = time.perf_counter()
    history = fed.fit(epochs=cfg.train.epochs, batch_size=cfg.train.batch_size,
                      generator=generator(cfg.seed, "active", "batches"), y_test=vd.y_test,
                      eval_every=cfg.train.eval_every, on_epoch_end=epoch_end)
    run = TrainedRun(cfg, vd, fed, history, time.perf_counter() - started)
    record: dict[str, Any] = {"name": name, "config": exp.config, "attack": exp.attack, "defenses": exp.defenses,
                              "paper": exp.paper, "paper_acc": exp.paper_acc,
                              "accuracy": run.history.epochs[-1].get("test_accuracy"),
                              "accuracy_curve": [r.get("test_accuracy") for r in run.history.epochs],
                              "loss_curve": [r.get("loss") for r in run.history.epochs],
                              "refused_updates": run.history.refused_updates,
                              "train_seconds": run.train_seconds, "n_train": len(vd.y_train), "n_test": len(vd.y_test),
                      "mse_curve": curve}
    detectors = {}
    for d in run.federation.passives[0].defenses:
        if hasattr(d, "scores_"):
            detectors[d.name] = {"scores": d.scores_, "detected_step": d.detected_step_,
                                 "detected_epoch": d.detected_epoch_, "threshold": d.threshold, "window": d.window,
                                 "steps": d.count_}
    record["detectors"] = detectors
    if plan.attacks:
        [planned] = plan.attacks
        attack = planned.attack
        view = _view(run, planned)
        inference = attack.infer(view)
        value, prior, details = score_features(inference, run, attack.victim, view.aux)
        record.update(value=value, prior=prior, leakage=prior - value, details=details,
                      pretrain_losses=getattr(attack, "pretrain_losses_", None),
                      shadow_bound=shadow_bound(attack, vd, inference.ids))
        part = vd.passive[0]
        if part.kind == "image":
            rows = inference.ids[:GRID]
            np.savez(out / f"{name}.npz", ids=rows.numpy(), victim=part.x_test[rows].numpy(),
                     recon=inference.features[:GRID].detach().numpy(), own=vd.active.x_test[rows].numpy())
    record["seconds"] = time.perf_counter() - tic
    return record


@torch.no_grad()
def epoch_mse(plan: Any, fed: Any, vd: Any, rows: int = 1000) -> float | None:
    """Diagnostic (ground truth): reconstruction MSE of the first ``rows`` test rows after an epoch.

    URVFL's ``cls_pretrain`` evaluates this after every epoch and keeps the victim model of the
    epoch with the lowest test MSE; we report the last epoch as the result and this curve (and
    its minimum, an oracle selection the attacker could not make) for comparison.
    """
    if not plan.attacks:
        return None
    attack = plan.attacks[0].attack
    state = getattr(attack, "state_", None)
    if state is None:
        return None
    victim = fed.passives[0]
    ids = torch.arange(min(rows, len(vd.y_test)))
    models = [m for m in (state.own, state.shadow, state.decoder, victim.bottom) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    h = victim.forward(ids, epoch=-1, step=-1, split="test", train=False)
    own = vd.active.x_test[ids] if state.own is not None else None
    recon = attack.decode({"bottom": state.own, "decoder": state.decoder} if own is not None
                          else {"decoder": state.decoder}, own, h)
    for m, mode in zip(models, modes, strict=True):
        m.train(mode)
    return float(((recon - vd.passive[0].x_test[ids]) ** 2).mean())


@torch.no_grad()
def shadow_bound(attack: Any, vd: Any, ids: torch.Tensor) -> float | None:
    """Diagnostic (ground truth): the recon MSE if the victim's bottom were the attacker's shadow.

    ``f_d(f_a(x_a) || f_e(x_p))`` on the target rows, i.e. what a perfect embedding transfer
    would give; the gap to the attack's MSE is the transfer's share of the error.
    """
    state = getattr(attack, "state_", None)
    if state is None or state.shadow is None:
        return None
    models = [m for m in (state.own, state.shadow, state.decoder) if m is not None]
    for m in models:
        m.eval()
    victim = vd.passive[0].x_test[ids]
    parts = ([state.own(vd.active.x_test[ids])] if state.own is not None else []) + [state.shadow(victim)]
    return float(((state.decoder(torch.cat(parts, 1)) - victim) ** 2).mean())


# -- report ----------------------------------------------------------------------------------


def _load(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def _fmt(x: float | None, digits: int = 4) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _detected(r: dict[str, Any]) -> str:
    flags = [f"{n} @ step {d['detected_step']}" for n, d in r.get("detectors", {}).items()
             if d["detected_step"] is not None]
    return ", ".join(flags) if flags else ("none" if r.get("detectors") else "")


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown table: ours vs the paper."""
    lines = ["| experiment | recon MSE (ours) | paper | prior (aux mean) | best epoch (oracle) | shadow bound | SSIM | "
             "Emb MSE | Emb Cos | test acc | paper acc | detected | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in EXPERIMENTS:
        r = results.get(name)
        if r is None:
            continue
        d = r.get("details", {})
        acc = r.get("accuracy")
        finite = [v for v in r.get("mse_curve") or [] if v is not None]
        best = min(finite) if finite else None
        lines.append(f"| {name} | {_fmt(r.get('value'))} | {_fmt(r.get('paper'))} | {_fmt(r.get('prior'))} | "
                     f"{_fmt(best)} | {_fmt(r.get('shadow_bound'))} | {_fmt(d.get('ssim'), 3)} | "
                     f"{_fmt(d.get('emb_mse'))} | {_fmt(d.get('emb_cos'))} | "
                     f"{_fmt(100 * acc if acc is not None else None, 2)} | {_fmt(r.get('paper_acc'), 2)} | "
                     f"{_detected(r)} | {r['train_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def grid_png(out: Path, path: Path) -> None:
    """Originals and reconstructions (victim half reconstructed, attacker half true), one row each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(n, lbl) for n, lbl in (("mnist_dmavfl", "DMAVFL"), ("mnist_dmavfl_sync", "DMAVFL_sync"),
                                     ("mnist_fsha", "FSHA"), ("mnist_fsha_bce", "FSHA (BCE)"), ("mnist_agn", "AGN"),
                                     ("mnist_dmavfl_sg", "DMAVFL-SG"),
                                     ("mnist_fsha_sg", "FSHA-SG"), ("mnist_agn_sg", "AGN-SG"))
            if (out / f"{n}.npz").exists()]
    if not rows:
        return
    first = np.load(out / f"{rows[0][0]}.npz")
    results = _load(out)
    fig, axes = plt.subplots(len(rows) + 1, 1, figsize=(GRID * 0.9 + 1.2, 1.05 * (len(rows) + 1)))

    def strip(victim: np.ndarray, own: np.ndarray) -> np.ndarray:
        gap = np.ones((victim.shape[-2], 1))
        tiles = []
        for v, o in zip(victim, own, strict=True):
            tiles += [v[0], o[0], gap, gap]
        return np.concatenate(tiles[:-2], axis=1)

    axes[0].imshow(strip(first["victim"], first["own"]), cmap="gray", vmin=0, vmax=1)
    axes[0].set_ylabel("original", rotation=0, ha="right", va="center", fontsize=9)
    for ax, (name, label) in zip(axes[1:], rows, strict=True):
        data = np.load(out / f"{name}.npz")
        mse = results.get(name, {}).get("value")
        ax.imshow(strip(np.clip(data["recon"], 0, 1), data["own"]), cmap="gray", vmin=0, vmax=1)
        ax.set_ylabel(f"{label}\nMSE {_fmt(mse, 3)}", rotation=0, ha="right", va="center", fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("MNIST: left half reconstructed by the attacker, right half its own (true)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def detector_png(out: Path, path: Path, dataset: str = "mnist") -> None:
    """Detection statistic (mean of the last ``window`` scores) per step, with the threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _load(out)
    runs = {"honest": f"{dataset}_honest_sg_gs", "DMAVFL": f"{dataset}_dmavfl_{{}}",
            "DMAVFL_sync": f"{dataset}_dmavfl_sync_{{}}", "FSHA": f"{dataset}_fsha_{{}}", "AGN": f"{dataset}_agn_{{}}",
            "DMAVFL, watched only": f"{dataset}_dmavfl_monitor"}
    colors = {"honest": "black", "DMAVFL": "tab:blue", "DMAVFL_sync": "tab:cyan", "FSHA": "tab:red",
              "AGN": "tab:orange", "DMAVFL, watched only": "tab:purple"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (short, det, title) in zip(axes, (("sg", "splitguard", "SplitGuard"),
                                              ("gs", "gradient_scrutinizer", "Gradients Scrutinizer")), strict=True):
        threshold = None
        for label, pattern in runs.items():
            r = results.get(pattern.format(short))
            if r is None or det not in r.get("detectors", {}):
                continue
            d = r["detectors"][det]
            steps = [s for s, _, _ in d["scores"]]
            scores = np.array([v for _, _, v in d["scores"]])
            if not len(scores):
                continue
            w = d["window"]
            stat = np.array([scores[max(0, i - w + 1): i + 1].mean() for i in range(len(scores))])
            ax.plot(steps, scores, color=colors[label], alpha=0.25, lw=0.8)
            ax.plot(steps, stat, color=colors[label], lw=1.8, ls="--" if d["threshold"] == 0 else "-",
                    label=label + (" (halted)" if d["detected_step"] else ""))
            if d["detected_step"]:
                ax.axvline(d["detected_step"], color=colors[label], ls=":", lw=1)
            if d["threshold"]:
                threshold = d["threshold"]
        if threshold is not None:
            ax.axhline(threshold, color="gray", ls="--", lw=1, label=f"threshold {threshold}")
        ax.set_title(f"{title} ({dataset.upper()})", fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("training step of the victim (log scale)")
        ax.set_ylabel("score (thin) / decision mean (thick)")
        ax.set_ylim(-0.02, 1.02)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--out", default="runs/dmavfl")
    parser.add_argument("--only", nargs="*", help="experiment names (default: all)")
    parser.add_argument("--report", action="store_true", help="only write the table and figures")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--img", help="write the PNGs into this folder")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for name in args.only or list(EXPERIMENTS):
            if (out / f"{name}.json").exists():
                continue
            record = run_one(name, EXPERIMENTS[name], args.data_root, out)
            tmp = out / f".{name}.json.tmp"
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(out / f"{name}.json")
    results = _load(out)
    text = table(results)
    if args.table:
        Path(args.table).write_text(text)
    if args.img:
        img = Path(args.img)
        img.mkdir(parents=True, exist_ok=True)
        grid_png(out, img / "dmavfl_mnist_reconstructions.png")
        detector_png(out, img / "dmavfl_mnist_detectors.png")
        detector_png(out, img / "dmavfl_credit_detectors.png", "credit")
    import sys

    sys.stdout.write(text)


if __name__ == "__main__":
    main()
