"""Which part of DMAVFL's malicious gradient makes it label-independent (issue 14, Gradients Scrutinizer).

The victim receives ``g = dL_M/dh`` with ``L_M = CE(D(h), 2y + 1)``; through the logits,
``dL_M/dz = (p - e_{2y+1}) / B``, which splits into the **real/fake part** ``p_{2y} (e_{2y} -
e_{2y+1})`` (move from "victim embedding of class y" to "shadow embedding of class y") and the
**class part** (the rest: away from the other classes' logits). After every epoch of a run of
``cause_mnist_conv_map_gs_dmavfl`` (reduced MNIST setting, ``conv_map``; or another experiment
of ``reproduce_dmavfl.py``), this script takes copies of the victim's bottom and of the DAC and,
on 8 batches of 64 training rows (victim in training mode, as in training), reports:

* ``fake``: the DAC's mean probability that a victim embedding is the victim's (``p_{2y} /
  (p_{2y} + p_{2y+1})``);
* ``share``: the mean ratio ``|g_realfake| / |g|`` per row;
* mean cosine between rows of different labels of ``g``, of its real/fake part and of its class
  part (Gradients Scrutinizer's "different-label" statistic).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/dmavfl_gradient_parts.py --epochs 4 [--name ROW] [--out F.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reproduce_dmavfl as rd

from vflbench.attacks.feature.common import class_indices
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.rng import generator


def _diff_cos(g: torch.Tensor, y: torch.Tensor) -> float:
    unit = g.flatten(1) / g.flatten(1).norm(dim=1, keepdim=True).clamp_min(1e-30)
    cos = unit @ unit.T
    return float(cos[y[:, None] != y[None, :]].mean())


def parts(attack: Any, bottom: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The real/fake and class parts of the malicious gradient on one batch (copies: nothing is updated)."""
    bottom, dac = copy.deepcopy(bottom).train(), copy.deepcopy(attack.state_.discriminator).train()
    h = bottom(x).detach().requires_grad_()
    z = dac(h)
    p = z.softmax(1).detach()
    rows = torch.arange(len(y))
    real_fake = torch.zeros_like(p)
    real_fake[rows, 2 * y] = p[rows, 2 * y]
    real_fake[rows, 2 * y + 1] = -p[rows, 2 * y]
    full = p.clone()
    full[rows, 2 * y + 1] -= 1
    assert torch.allclose(
        torch.autograd.grad(F.cross_entropy(z, 2 * y + 1), h, retain_graph=True)[0],
        torch.autograd.grad(z, h, grad_outputs=full / len(y), retain_graph=True)[0],
        atol=1e-6,
    )
    g_full, g_rf = (torch.autograd.grad(z, h, grad_outputs=d / len(y), retain_graph=True)[0] for d in (full, real_fake))
    g_class = g_full - g_rf
    share = (g_rf.flatten(1).norm(dim=1) / g_full.flatten(1).norm(dim=1).clamp_min(1e-30)).mean()
    fake = (p[rows, 2 * y] / (p[rows, 2 * y] + p[rows, 2 * y + 1])).mean()
    return {
        "fake": float(fake),
        "share": float(share),
        "cos_diff_full": _diff_cos(g_full, y),
        "cos_diff_real_fake": _diff_cos(g_rf, y),
        "cos_diff_class": _diff_cos(g_class, y),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="cause_mnist_conv_map_gs_dmavfl")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--data-root", default=str(rd.ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--out")
    args = parser.parse_args()
    cfg = rd.build(rd.EXPERIMENTS[args.name])
    torch.set_num_threads(cfg.train.threads)
    vd = load_vertical_data(cfg, args.data_root)
    plan = validate_attacks(cfg, vd)
    names = [f"passive_{i + 1}" for i in range(len(vd.passive))]
    held = plan.held_out()
    fed = build_federation(
        cfg, vd, defenses=plan_defenses(cfg, names), keep=plan.keep, extra_dims=plan.extra_dims(), held_out=held
    )
    plan.prepare(fed)
    attack = plan.attacks[0].attack
    victim = fed.passives[0]
    pool = torch.tensor(sorted(set(range(len(vd.y_train))) - set(held.tolist() if held is not None else [])))
    picks = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))[: 8 * 64]].view(8, 64)
    rows: list[dict[str, float]] = []

    def measure(epoch: int, record: dict[str, Any] | None = None) -> None:
        per = [
            parts(
                attack,
                victim.bottom,
                victim.features("train")[ids],
                class_indices(attack.state_.party.objective.targets[ids]),
            )
            for ids in picks
        ]
        row = {"epoch": float(epoch + 1), **{k: sum(r[k] for r in per) / len(per) for k in per[0]}}
        rows.append(row)
        sys.stdout.write(json.dumps({k: round(v, 3) for k, v in row.items()}) + "\n")
        sys.stdout.flush()

    measure(-1)  # before training: the DAC has only been initialised
    fed.fit(
        epochs=args.epochs,
        batch_size=cfg.train.batch_size,
        generator=generator(cfg.seed, "active", "batches"),
        y_test=vd.y_test,
        eval_every=cfg.train.eval_every,
        on_epoch_end=measure,
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"name": args.name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
