"""Label attacks that observe gradients during training (threat model T1 of Kang et al.).

All of them read only the attacker's own observations: the cut-layer gradients delivered to
it (its transcript) or its own bottom model's parameter gradients (RR, GI). Each returns one
score set per training batch; the runner computes the AUC per batch and averages, skipping
batches with a single class, as in Li et al.'s evaluation code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from vflbench.attacks.base import LabelAttack, LabelInference, PartyView, Scenario, Scores, binary_only, require
from vflbench.attacks.registry import ATTACKS
from vflbench.registry import LEARNING_RATE, Param


def _epochs_ok(epoch: int, epochs: Sequence[int] | None) -> bool:
    return epochs is None or epoch in epochs


class _CutGradientAttack(LabelAttack):
    reads = ("cut_gradient",)
    phase = "observer"
    repeatable = False  # a function of the transcript alone
    constraints: ClassVar[Mapping[str, Param]] = {
        "party": Param("the passive party that attacks"),
        "epochs": Param("the training epochs whose messages are used (null: all)", ge=0),
        "known_per_class": Param("labelled rows per class the attacker knows", ge=0),
        "iterations": Param("optimisation steps", ge=1),
        "lr": LEARNING_RATE,
    }

    def __init__(self, *, party: str = "passive_1", epochs: list[int] | None = None) -> None:
        self.party = party
        self.epochs = epochs

    def check(self, scenario: Scenario) -> None:
        require(self.party != "active", self.name, "it is run by a passive party")

    def messages(self, view: PartyView) -> list[tuple[Tensor, Tensor]]:
        """(ids, gradient) of every cut gradient the attacker received in the chosen epochs.

        A payload that is not a float tensor (e.g. Paillier ciphertext bytes under ``paillier_he``)
        is scored as the numbers the attacker received: it has nothing else.
        """
        return [
            (m.ids, m.payload if m.payload.is_floating_point() else m.payload.flatten(1).double())
            for m in view.transcript.of_kind("cut_gradient")
            if _epochs_ok(m.epoch, self.epochs)
        ]


@ATTACKS.register(summary="score each sample by the L2 norm of its cut-layer gradient (binary)")
class NormScoring(_CutGradientAttack):
    """Norm scoring (Li et al., ICLR 2022): positives get larger cut-gradient norms."""

    name = "norm_scoring"
    paper = "Li et al., Label Leakage and Protection in Two-party Split Learning (ICLR 2022)"
    threat = "honest-but-curious passive party observing cut-layer gradients (T1)"
    requirements = ("binary labels",)

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        super().check(scenario)
        binary_only(self.name, scenario)

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        return LabelInference(batches=[Scores(ids, g.flatten(1).norm(dim=1)) for ids, g in self.messages(view)])


@ATTACKS.register(summary="score samples by cosine with a known positive's cut gradient (binary)")
class DirectionScoring(_CutGradientAttack):
    """Direction scoring (Li et al., ICLR 2022): same-class gradients point the same way.

    The reference is the cut gradient of a known positive sample (the attacker's known labels):
    the mean over known positives in the batch, else the most recent one seen; batches before
    any known positive was seen are not scored. Known samples themselves are not scored.
    """

    name = "direction_scoring"
    repeatable = True  # its known positive is drawn anew on every repeat
    paper = "Li et al., Label Leakage and Protection in Two-party Split Learning (ICLR 2022)"
    threat = "honest-but-curious passive party observing cut-layer gradients, knowing a positive sample (T1)"
    requirements = ("binary labels",)

    def __init__(self, *, party: str = "passive_1", epochs: list[int] | None = None, known_per_class: int = 1) -> None:
        super().__init__(party=party, epochs=epochs)
        self.known_per_class = known_per_class

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        super().check(scenario)
        binary_only(self.name, scenario)

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        assert view.known is not None
        positives = view.known.ids[(view.known.labels == 1).cpu()]  # row ids are CPU tensors
        reference: Tensor | None = None
        batches = []
        for ids, g in self.messages(view):
            flat = g.flatten(1)
            hit = torch.isin(ids, positives)
            if hit.any():
                reference = flat[hit].mean(0)
            if reference is None:
                continue
            keep = ~torch.isin(ids, view.known.ids)
            batches.append(Scores(ids[keep], F.cosine_similarity(flat[keep], reference[None], dim=1)))
        return LabelInference(batches=batches)


@ATTACKS.register(summary="read labels from the signs of the cut gradient (softmax over summed logits or VLR)")
class DirectLabelInference(_CutGradientAttack):
    """Direct label inference (Fu et al., USENIX Security 2022; Kang et al. eq. 4).

    With cross-entropy on summed logits, the cut gradient is softmax - onehot: negative
    exactly at the true class; with VLR's single logit, sigma(u) - y is negative iff y = 1.
    The score of each class is the negated gradient.
    """

    name = "direct_label_inference"
    paper = "Fu et al., Label Inference Attacks Against VFL (USENIX Security 2022)"
    threat = "honest-but-curious passive party observing cut-layer gradients (T1)"
    requirements = ("VLR, or no top model (top: identity) with sum aggregation",)

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        super().check(scenario)
        require(
            scenario.algorithm == "vlr" or (scenario.top == "identity" and scenario.aggregation == "sum"),
            self.name,
            "it needs the cut gradient of a softmax over summed logits: use VLR, or "
            "model.top: identity with train.aggregation: sum",
        )

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        return LabelInference(
            batches=[Scores(ids, -(g.squeeze(1) if g.shape[1] == 1 else g)) for ids, g in self.messages(view)]
        )


class _ModelGradientAttack(_CutGradientAttack):
    reads = ("model_gradient",)
    requirements = ("VLR (a linear bottom model)",)

    def check(self, scenario: Scenario) -> None:
        require(self.party != "active", self.name, "it is run by a passive party")
        require(
            scenario.algorithm == "vlr",
            self.name,
            f"it inverts a linear bottom model's gradients, so it needs VLR (got {scenario.algorithm})",
        )

    def batches(self, view: PartyView) -> list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
        """(ids, X with a ones column, u^B, grad of [W b] as (m+1, out)) per chosen batch."""
        out = []
        for r in view.records:
            if not _epochs_ok(r.epoch, self.epochs):
                continue
            assert r.param_grads is not None
            weight, bias = r.param_grads
            x = view.data.x_train[r.ids].flatten(1)
            xb = torch.cat([x, torch.ones(len(x), 1, device=x.device, dtype=x.dtype)], 1)
            out.append((r.ids, xb, r.embedding, torch.cat([weight.T, bias[None]], 0), r.gradient))
        return out


@ATTACKS.register(summary="recover the residue d^B from VLR model gradients by least squares")
class ResidueReconstruction(_ModelGradientAttack):
    """Residue reconstruction (Kang et al. eq. 7-10): solve X^T d = grad(theta) for the
    per-sample residues d by (minimum-norm) least squares, then score by -d."""

    name = "residue_reconstruction"
    paper = "Kang et al., A Framework for Evaluating Privacy-Utility Trade-off in VFL, eq. 7-10 (after Wu et al.)"
    threat = "passive party with plaintext batch model gradients, encrypted residues (T1)"

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        batches = []
        for ids, xb, _, grad, _ in self.batches(view):
            # gelsd (SVD-based, minimum norm) exists on the CPU only: solved there whatever the device
            residue = torch.linalg.lstsq(xb.T.double().cpu(), grad.double().cpu(), driver="gelsd").solution.float()
            batches.append(Scores(ids, -(residue.squeeze(1) if residue.shape[1] == 1 else residue)))
        return LabelInference(batches=batches)


@ATTACKS.register(summary="optimise labels and the other party's logits to match VLR model gradients")
class GradientInversion(_ModelGradientAttack):
    """Gradient inversion (Kang et al. eq. 11, after Zhu et al. and CoAE's VFL variant): find
    soft labels y~ and the other party's logits u~A whose implied gradient of the attacker's
    linear model, X^T (sigma(u^B + u~A) - y~) / b, matches the observed one; score by y~.
    """

    name = "gradient_inversion"
    paper = "Kang et al., eq. 11 (gradient inversion, after Zhu et al. 2019 and Liu et al. CoAE 2022)"
    threat = "passive party with plaintext batch model gradients (T1)"

    def __init__(
        self, *, party: str = "passive_1", epochs: list[int] | None = None, iterations: int = 200, lr: float = 0.1
    ) -> None:
        super().__init__(party=party, epochs=epochs)
        self.iterations = iterations
        self.lr = lr

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        groups: dict[int, list] = {}
        for item in self.batches(view):
            groups.setdefault(len(item[0]), []).append(item)
        batches = []
        for size, items in groups.items():
            ids = [it[0] for it in items]
            xb = torch.stack([it[1] for it in items])  # (n, b, m+1)
            u_b = torch.stack([it[2] for it in items])  # (n, b, out)
            grad = torch.stack([it[3] for it in items])  # (n, m+1, out)
            scale = grad.flatten(1).norm(dim=1).clamp_min(1e-12)[:, None, None]
            label_logits = torch.zeros_like(u_b, requires_grad=True)
            u_a = torch.zeros_like(u_b, requires_grad=True)
            # fused: one kernel per step and tensor instead of ~10 (float32 rounding apart, the same update)
            opt = torch.optim.Adam([label_logits, u_a], lr=self.lr, fused=True)
            single = u_b.shape[2] == 1
            for _ in range(self.iterations):
                z = u_b + u_a
                residue = (
                    (torch.sigmoid(z) - torch.sigmoid(label_logits))
                    if single
                    else (z.softmax(2) - label_logits.softmax(2))
                )
                # X^T r as (r^T X)^T: the same sums in another order (float32 rounding apart), 5x faster
                # than a batched matrix-vector product on a CPU
                estimate = (residue.transpose(1, 2) @ xb).transpose(1, 2) / size
                loss = (((estimate - grad) / scale) ** 2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                y_soft = torch.sigmoid(label_logits).squeeze(2) if single else label_logits.softmax(2)
            batches += [Scores(i, s) for i, s in zip(ids, y_soft, strict=True)]
        return LabelInference(batches=batches)
