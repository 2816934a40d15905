"""Where SplitGuard's score falls under DMAVFL on Credit (issue 14): its components per decision.

SplitGuard (Erdogan et al. 2022) scores ``sigmoid(5 x)^2`` with
``x = (angle(F, R) |m_F - m_R| - angle(R1, R2) |m_1 - m_2|) / (|m_F - m_R| + |m_1 - m_2|)``, where F,
R1, R2 are the running means of the fake and the two regular sets of gradient vectors and m their
mean norms. This script runs the Credit paper configuration (``configs/repro/dmavfl_credit_paper.yaml``)
honestly and under DMAVFL with SplitGuard watching (threshold 0: it never halts) and writes, for every
decision, the score and its four components, plus the norm of every fake and regular batch's vector,
to ``OUT/<run>.json``; it prints a summary: where the mean of the last 10 scores first falls below
0.9 and which term made x small there.

Run:  .venv/bin/python benchmarks/dmavfl_splitguard_probe.py --data-root ../shared/datasets --out runs/sg_probe
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from vflbench.defenses.detectors import SplitGuard, _angle
from vflbench.experiment.config import build_config, load_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.protocol import StepState
from vflbench.rng import generator

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "repro" / "dmavfl_credit_paper.yaml"


class ProbedSplitGuard(SplitGuard):
    """SplitGuard that also keeps the components of each score and the norm of each batch's vector."""

    def bind(self, context: Any) -> None:
        super().bind(context)
        self.components_: list[dict[str, float]] = []
        self.norms_: list[tuple[int, bool, float]] = []

    def _vector(self, gradient: torch.Tensor, state: StepState) -> torch.Tensor | None:
        v = super()._vector(gradient, state)
        if v is not None:
            self.norms_.append((self.count_, self.is_fake(state.ids), float(v.norm())))
        return v

    def record(self, state: StepState, score: float) -> None:
        f, a, b = self.fakes_.mean(), self.r1_.mean(), self.r2_.mean()
        m_f, m_1, m_2 = self.fakes_.mean_norm(), self.r1_.mean_norm(), self.r2_.mean_norm()
        m_r = (m_1 + m_2) / 2
        self.components_.append(
            {
                "step": self.count_,
                "epoch": state.epoch,
                "score": score,
                "angle_fr": _angle(f, (a + b) / 2),
                "dnorm_fr": abs(m_f - m_r),
                "angle_12": _angle(a, b),
                "dnorm_12": abs(m_1 - m_2),
                "m_f": m_f,
                "m_r": m_r,
            }
        )
        super().record(state, score)


def run(attack: bool, data_root: str, vector: str = "parameter") -> dict[str, Any]:
    """One Credit run with SplitGuard watching (``vector``: its gradient vector); its probe's records."""
    raw = load_config(CONFIG).model_dump(mode="json")
    if not attack:
        raw["attacks"] = []
    raw["defenses"] = [{"name": "splitguard", "threshold": 0.0, "vector": vector}]
    cfg = build_config(raw)
    torch.set_num_threads(cfg.train.threads)
    vd = load_vertical_data(cfg, data_root)
    plan = validate_attacks(cfg, vd)
    names = [f"passive_{i + 1}" for i in range(len(vd.passive))]
    defenses = plan_defenses(cfg, names)
    probe = ProbedSplitGuard(threshold=0.0, vector=vector)
    defenses.passive["passive_1"][0] = probe
    fed = build_federation(
        cfg, vd, defenses=defenses, keep=plan.keep, extra_dims=plan.extra_dims(), held_out=plan.held_out()
    )
    plan.prepare(fed)
    dac_stats: list[dict[str, float]] = []

    def epoch_end(epoch: int, record: dict[str, Any]) -> None:
        if plan.attacks:
            dac_stats.append(dac_answers(plan.attacks[0].attack.state_, fed, vd, epoch))

    tic = time.perf_counter()
    fed.fit(
        epochs=cfg.train.epochs,
        batch_size=cfg.train.batch_size,
        generator=generator(cfg.seed, "active", "batches"),
        y_test=vd.y_test,
        eval_every=cfg.train.eval_every,
        on_epoch_end=epoch_end,
    )
    return {
        "components": probe.components_,
        "norms": probe.norms_,
        "dac": dac_stats,
        "seconds": time.perf_counter() - tic,
    }


def dac_answers(state: Any, fed: Any, vd: Any, epoch: int, rows: int = 1024) -> dict[str, float]:
    """The DAC on the victim's embeddings of the first ``rows`` test rows: its probability of the "real"
    (shadow) classes, of the true class's pair, and the mean per-row norm of the malicious gradient
    ``dCE(D(h), 2y+1)/dh`` for the true label y and for a shifted label (what a SplitGuard fake batch gets)."""
    ids = torch.arange(min(rows, len(vd.y_test)))
    victim = fed.passives[0]
    with torch.no_grad():
        h = victim.forward(ids, epoch=-1, step=-1, split="test", train=False)
    y = vd.y_test[ids].long()
    c = state.discriminator(h).shape[1] // 2
    shifted = (y + 1) % c
    dac = state.discriminator
    mode = dac.training
    dac.eval()
    out: dict[str, float] = {"epoch": epoch}
    with torch.no_grad():
        p = torch.softmax(dac(h), 1).view(-1, c, 2)
    out["p_real"] = float(p[:, :, 1].sum(1).mean())
    out["p_true_class"] = float(p[torch.arange(len(y)), y].sum(1).mean())
    for name, labels in (("true", y), ("shifted", shifted)):
        hh = h.clone().requires_grad_()
        loss = torch.nn.functional.cross_entropy(dac(hh), 2 * labels + 1, reduction="sum")
        (g,) = torch.autograd.grad(loss, hh)
        out[f"grad_norm_{name}"] = float(g.norm(dim=1).mean())
    dac.train(mode)
    return out


def summary(name: str, rec: dict[str, Any], window: int = 10, threshold: float = 0.9) -> str:
    """Where the rolling mean first falls below the threshold, and the components there."""
    comps = rec["components"]
    scores = [c["score"] for c in comps]
    means = [sum(scores[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(scores))]
    below = [i for i in range(window - 1, len(scores)) if means[i] < threshold]
    fakes = [n for _, fake, n in rec["norms"] if fake]
    regular = [n for _, fake, n in rec["norms"] if not fake]
    lines = [
        f"{name}: {len(scores)} decisions, rolling mean below {threshold} at {len(below)}; "
        f"mean |fake| {sum(fakes) / len(fakes):.4g}, mean |regular| {sum(regular) / len(regular):.4g}"
    ]
    for i in ([below[0]] if below else []) + [len(comps) - 1]:
        c = comps[i]
        lines.append(
            "  decision {} (step {}, epoch {}): score {:.3f}, rolling mean {:.3f}; angle(F,R) {:.3f} rad, "
            "|m_F-m_R| {:.4g}; angle(R1,R2) {:.3f} rad, |m_1-m_2| {:.4g}; m_F {:.4g}, m_R {:.4g}".format(
                i,
                c["step"],
                c["epoch"],
                c["score"],
                means[i],
                c["angle_fr"],
                c["dnorm_fr"],
                c["angle_12"],
                c["dnorm_12"],
                c["m_f"],
                c["m_r"],
            )
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--out", default="runs/sg_probe")
    parser.add_argument(
        "--vector",
        choices=("parameter", "embedding"),
        default="parameter",
        help="SplitGuard's gradient vector: the first layer's weights (original) or the cut gradient (URVFL's port)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, attack in (("honest", False), ("dmavfl", True)):
        path = out / (f"{name}.json" if args.vector == "parameter" else f"{name}_{args.vector}.json")
        if not path.exists():
            path.write_text(json.dumps(run(attack, args.data_root, args.vector)))
        rec = json.loads(path.read_text())
        print(summary(name, rec))
        for d in rec.get("dac", []):
            print(
                "  epoch {epoch}: DAC p(real) {p_real:.3f}, p(true class) {p_true_class:.3f}; per-row |grad| true "
                "label {grad_norm_true:.4f}, shifted label {grad_norm_shifted:.4f}".format(**d)
            )


if __name__ == "__main__":
    main()
