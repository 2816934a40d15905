"""GRNA: the generative regression network attack (Luo et al., "Feature Inference Attack on Model
Predictions in Vertical Federated Learning", ICDE 2021; xinjianluo/featureinference-vfl), by the
honest-but-curious active party.

A generator G maps the attacker's own features of a row and random noise to the victim's
features, ``x~_p = G(x_a || r)`` with ``r ~ N(0, I)`` of the victim slice's size, and is trained so
that the joint model's outputs on the generated features match the outputs the active party
computes for the real rows (GRNA's "prediction" rows, here the target rows whose embeddings
the victim sends):

``L = sum_rows sum_k (f(x_a, G(x_a || r))_k - f(x_a, x_p)_k)^2 + var_lambda * sum_j Var_batch(G_j)``

with f the trained joint model (raw top-model outputs, GRNA's NN target), ``var_lambda`` 0.25
(GRNA's ``UnknownVarLambda``), Adam 1e-4, batch 64, 60 epochs (``config.ini``). Generator
(``AttackModels.Generator``): Linear 600 / 200 / 100, each followed by LayerNorm and ReLU, then a
Linear to the victim slice and a Sigmoid (GRNA scales features to [0, 1]). For image strips the
input and output are flattened and the output keeps the Sigmoid (pixels are in [0, 1]); for
tabular (standardised) slices the Sigmoid is rescaled to each feature's range over the aux rows.

**The victim's bottom model.** GRNA assumes the adversary holds the trained joint model, the
victim's part included (white-box; URVFL's port runs the real target model). Our view never
holds another party's model, so ``victim_model: "shadow"`` (the default) replaces the victim's
bottom model by a shadow f_s fitted to the victim's embeddings of the aux rows (received during
training; as in :mod:`vflbench.attacks.feature.gia`: ``shadow_epochs`` passes, Adam
``shadow_lr``, batch ``shadow_batch_size``): ``f(x_a, x~_p) = top(f_a(x_a) || f_s(x~_p))``, while
the real outputs use the real embeddings h. ``victim_model: "white_box"`` uses the victim's own
bottom model and needs a threat model that grants it (``view.models["victim_bottom"]``), which
the runner does not provide yet: :meth:`GRNA.check` rejects it before training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from vflbench.attacks.base import AuxData, FeatureInference, PartyView, Phase, Scale, Scenario, require
from vflbench.attacks.feature.common import seeded
from vflbench.attacks.feature.honest import (
    CuriousActiveAttack,
    apply_gradients,
    apply_in_chunks,
    fit_regression,
    flat_dim,
    permutation_batches,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.registry import BATCH, EPOCHS, LEARNING_RATE, NON_NEGATIVE, WIDTH, Param

PAPER = (
    "Luo et al., Feature Inference Attack on Model Predictions in Vertical Federated Learning (GRNA, ICDE 2021); "
    "xinjianluo/featureinference-vfl; evaluated in DMAVFL §6.2 (Yao et al., arXiv 2404.19582)"
)
VICTIM_BOTTOM = "victim_bottom"


class Generator(nn.Module):
    """GRNA's generator: (Linear, LayerNorm, ReLU) x len(hidden), Linear, Sigmoid scaled to [lo, hi]."""

    def __init__(self, in_dim: int, shape: Sequence[int], hidden: Sequence[int], lo: Tensor, hi: Tensor) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.ReLU()]
            width = h
        out = int(torch.tensor(shape).prod())
        layers += [nn.Linear(width, out), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)
        self.shape = tuple(int(s) for s in shape)
        self.register_buffer("lo", lo.reshape(-1).clone())
        self.register_buffer("span", (hi - lo).reshape(-1).clone())

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        return (self.lo + self.span * self.net(z)).view(-1, *self.shape)


@ATTACKS.register(summary="GRNA: generator of the victim's features trained to match the joint model's outputs")
class GRNA(CuriousActiveAttack):
    """GRNA by the honest-but-curious active party (see the module docstring).

    Parameters: ``victim``, ``aux_size``/``aux_fraction`` (default 10%; used for the shadow),
    ``aux_classes``, ``target_split``/``n_targets``, ``epochs`` (60), ``batch_size`` (64), ``lr``
    (1e-4), ``var_lambda`` (0.25), ``hidden`` ((600, 200, 100)), ``victim_model`` (``"shadow"``
    or ``"white_box"``), ``shadow_epochs`` (50), ``shadow_lr`` (1e-3), ``shadow_batch_size``
    (64), ``shadow_model``/``shadow_options`` (the shadow's architecture).
    """

    name = "grna"
    paper = PAPER
    aux_disjoint = False  # GRNA has no aux set; our shadow needs the victim's training-time aux embeddings
    phase: ClassVar[Phase] = "observer"  # it keeps the victim's embeddings of the aux rows during training
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "lr": (1e-4, 1e-3),
        "epochs": (Scale(0.5), Scale(1.0), Scale(2.0)),
        "var_lambda": (0.0, 0.25, 1.0),
    }
    """The generator's training after training (what it kept during training is not searched)."""

    constraints: ClassVar[Mapping[str, Param]] = {
        "epochs": EPOCHS,
        "batch_size": BATCH,
        "lr": LEARNING_RATE,
        "var_lambda": NON_NEGATIVE,
        "mean_lambda": NON_NEGATIVE,
        "hidden": Param("the generator's hidden widths", ge=1, le=WIDTH.le),
        "victim_model": Param("a shadow model trained on the auxiliary set, or the victim's own (white box)"),
        "shadow_epochs": EPOCHS,
        "shadow_lr": LEARNING_RATE,
        "shadow_batch_size": BATCH,
    }

    def __init__(
        self,
        *,
        victim: str = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = 0.1,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        epochs: int = 60,
        batch_size: int = 64,
        lr: float = 1e-4,
        var_lambda: float = 0.25,
        mean_lambda: float = 0.0,
        hidden: Sequence[int] = (600, 200, 100),
        victim_model: Literal["shadow", "white_box"] = "shadow",
        shadow_epochs: int = 50,
        shadow_lr: float = 1e-3,
        shadow_batch_size: int = 64,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            victim=victim,
            aux_size=aux_size,
            aux_fraction=aux_fraction,
            aux_classes=aux_classes,
            target_split=target_split,
            n_targets=n_targets,
            shadow_model=shadow_model,
            shadow_options=shadow_options,
        )
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.var_lambda = var_lambda
        self.mean_lambda = mean_lambda
        self.hidden = hidden
        self.victim_model = victim_model
        self.shadow_epochs = shadow_epochs
        self.shadow_lr = shadow_lr
        self.shadow_batch_size = shadow_batch_size

    def check(self, scenario: Scenario) -> None:
        """Also: the runner grants no threat model the victim's bottom model yet."""
        super().check(scenario)
        require(
            self.victim_model != "white_box",
            self.name,
            "victim_model 'white_box' needs the victim's trained bottom model, which no threat model of the "
            "runner grants the attacker yet; use victim_model: shadow",
        )

    def records_aux(self) -> bool:  # noqa: D102
        return self.victim_model == "shadow"

    def victim_function(self, view: PartyView, aux: AuxData) -> tuple[nn.Module, dict[str, Any]]:
        """The model the generated features go through: the granted victim model or a shadow of it."""
        if self.victim_model == "white_box":
            require(VICTIM_BOTTOM in view.models, self.name, "the view holds no victim bottom model")
            return view.models[VICTIM_BOTTOM], {}
        rows, h_aux = self.aux_embeddings(view)
        shadow = self.build_shadow(aux, view.generator)
        losses = fit_regression(
            shadow,
            aux.victim[rows],
            h_aux,
            epochs=self.shadow_epochs,
            lr=self.shadow_lr,
            batch_size=self.shadow_batch_size,
            generator=view.generator,
        )
        return shadow, {"aux_embeddings": len(rows), "shadow_loss": losses[-1] if losses else None}

    def infer(self, view: PartyView) -> FeatureInference:
        """Train the generator on the target rows' outputs; generate their victim features."""
        aux = view.aux
        assert aux is not None
        models = view.models
        for m in models.values():
            m.eval()
        victim_fn, details = self.victim_function(view, aux)
        victim_fn.eval()
        top = models["top"]
        for m in (top, victim_fn, *models.values()):
            for p in m.parameters():
                p.requires_grad_(False)
        r, own_x = self.targets(view)
        own_bottom = self.own_bottom(models, own_x)
        own_h = apply_in_chunks(own_bottom, own_x) if own_bottom is not None and own_x is not None else None
        with torch.no_grad():
            real = apply_in_chunks(lambda o, h: self.joint_outputs(top, o, h), own_h, r.embeddings)
        shape = aux.victim.shape[1:]
        if aux.victim.dim() == 4:
            lo, hi = torch.zeros(shape), torch.ones(shape)
        else:
            lo, hi = aux.victim.min(0).values, aux.victim.max(0).values
        own_flat = own_x.flatten(1).float() if own_x is not None else None
        in_dim = (own_flat.shape[1] if own_flat is not None else 0) + flat_dim(aux.victim[0])
        gen = seeded(Generator(in_dim, shape, self.hidden, lo, hi), view.generator, aux.victim)
        opt = torch.optim.Adam(gen.parameters(), lr=self.lr)
        params = list(gen.parameters())
        n_vic = flat_dim(aux.victim[0])
        known_mean = aux.victim.flatten(1).mean(0)

        def generator_input(rows: Tensor) -> Tensor:
            noise = torch.randn((len(rows), n_vic), generator=view.generator).to(aux.victim.device)
            return noise if own_flat is None else torch.cat([own_flat[rows], noise], 1)

        losses = []
        for _ in range(self.epochs):
            gen.train()
            total = []
            for rows in permutation_batches(len(r.ids), self.batch_size, view.generator):
                fake = gen(generator_input(rows))
                out = self.joint_outputs(top, own_h[rows] if own_h is not None else None, victim_fn(fake))
                loss = (out - real[rows]).pow(2).sum()
                if self.var_lambda and len(rows) > 1:
                    loss = loss + self.var_lambda * fake.flatten(1).var(0).sum()
                if self.mean_lambda:
                    loss = loss + self.mean_lambda * (fake.flatten(1).mean(0) - known_mean).pow(2).sum()
                apply_gradients(loss, params, opt)
                total.append(float(loss.detach()) / len(rows))
            losses.append(sum(total) / len(total))
        gen.eval()
        with torch.no_grad():
            features = (
                torch.cat(
                    [
                        gen(generator_input(torch.arange(i, min(i + 1024, len(r.ids)))))
                        for i in range(0, len(r.ids), 1024)
                    ]
                )
                if len(r.ids)
                else torch.empty(0)
            )
        shadow = victim_fn if self.victim_model == "shadow" else None
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=shadow,
            details={"aux_rows": len(aux.ids), **details, "generator_loss": losses[-1] if losses else None},
        )
