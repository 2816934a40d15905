"""Label defenses: label DP (RRWithPrior), KDk, CoAE, and MixUp.

They change what the active party trains on, once before training (``transform_labels``):
randomised labels (``label_dp``), soft k-anonymous labels from a teacher (``kdk``), confusing
soft labels from an autoencoder that also decodes the predictions (``coae``), or mixtures of
samples and of their labels (``mixup``, which also mixes every party's bottom-model inputs).
Randomness comes only from the generators given at ``bind``.

| defense | source | knob (``strength``) | neutral value |
|---|---|---|---|
| ``label_dp`` | Ghazi et al. RRWithPrior (google-research/label-dp) | ``epsilon`` (smaller stronger) | inf: identity |
| ``kdk`` | Arazzi et al. (Armandolando/KDk-...) | ``epsilon`` (larger stronger) | 0: identity |
| ``coae`` | Zou, Liu et al. (FLAIR-THU/TrustworthyFederatedLearning) | ``entropy_weight`` (larger stronger) | none |
| ``mixup`` | Zhang et al. mixup, as in Kang et al. §7.2 | ``n_mix`` (larger stronger) | 1: identity |
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.defenses import DEFENSES
from vflbench.errors import ConfigError
from vflbench.models import build_bottom
from vflbench.models.finetune import predict
from vflbench.protocol.hooks import BindContext, Defense
from vflbench.protocol.messages import ACTIVE
from vflbench.protocol.objective import Objective, argmax_decode, soft_cross_entropy, softmax_scores
from vflbench.registry import BATCH, LEARNING_RATE, Param

LABEL_THREAT = (
    "label inference by a passive party: model completion on its trained bottom model and "
    "gradient-based attacks (NS, DS, DL, RR, GI)"
)


def _class_labels(objective: Objective, defense: str) -> Tensor:
    """The objective's targets as class indices, or a clear error (a soft-label defense ran first)."""
    y = objective.targets
    if y.dtype != torch.long or y.dim() != 1:
        raise ConfigError(
            f"defense {defense!r} needs class-index targets, but an earlier label defense turned "
            f"them into soft rows; list {defense!r} before it in `defenses`"
        )
    return y


def _soft_objective(
    objective: Objective,
    targets: Tensor,
    name: str,
    *,
    decode: Callable[[Tensor], Tensor] = argmax_decode,
    scores: Callable[[Tensor], Tensor] = softmax_scores,
) -> Objective:
    """C outputs trained with soft cross-entropy on ``targets`` (N, C) rows."""
    if objective.name.startswith("mixup("):
        raise ConfigError(
            f"defense {name.split('(')[0]!r} replaces the loss that 'mixup' mixes; list 'mixup' after it in `defenses`"
        )
    return objective.replace(
        targets=targets, out_dim=targets.shape[1], loss=soft_cross_entropy, decode=decode, scores=scores, name=name
    )


# ------------------------------------------------------------------------------------ label DP


def rr_with_prior(labels: Tensor, prior: Tensor, epsilon: float, generator: torch.Generator) -> Tensor:
    """RRWithPrior (Ghazi et al. 2021, Alg. 2): randomised response within the best top-k of a prior.

    ``prior`` is one distribution (C,) shared by all rows, or one per row (N, C). For each row,
    k* maximises ``w_k = (sum of the k largest prior masses) / (1 + (k-1) e^-eps)``; the output is
    drawn from the top-k* set, the true label with weight 1 and every other member with weight
    e^-eps (the true label has weight 0 when it is outside the set). This is eps-label-DP for any
    prior that does not depend on the row's own label.
    """
    n, q = len(labels), math.exp(-epsilon)
    prior = prior.double().expand(n, -1) if prior.dim() == 1 else prior.double()
    c = prior.shape[1]
    order = prior.argsort(dim=1, descending=True, stable=True)
    ks = torch.arange(1, c + 1, dtype=torch.float64)
    w = prior.gather(1, order).cumsum(1) / (1 + (ks - 1) * q)
    k_star = w.argmax(1) + 1
    in_top = torch.zeros(n, c, dtype=torch.bool).scatter_(1, order, ks.expand(n, -1) <= k_star[:, None])
    weights = in_top.double() * q
    rows = torch.arange(n)
    weights[rows, labels] = in_top[rows, labels].double()
    return torch.multinomial(weights / weights.sum(1, keepdim=True), 1, generator=generator).squeeze(1)


def rr_keep_probability(prior: Tensor, epsilon: float) -> tuple[int, float]:
    """k* for one prior (C,) and the probability that a label inside the top-k* is kept."""
    q = math.exp(-epsilon)
    ks = torch.arange(1, len(prior) + 1, dtype=torch.float64)
    w = prior.double().sort(descending=True).values.cumsum(0) / (1 + (ks - 1) * q)
    k = int(w.argmax()) + 1
    return k, 1.0 / (1 + (k - 1) * q)


@DEFENSES.register(summary="randomise the training labels once with RRWithPrior (Ghazi et al.)")
class LabelDP(Defense):
    """Label differential privacy by RRWithPrior (Ghazi et al., NeurIPS 2021), single stage.

    Before training the active party replaces every training label by a draw of
    :func:`rr_with_prior` with privacy parameter ``epsilon`` (eps-label-DP), and trains on the
    randomised labels; nothing else changes. ``epsilon`` defaults to 3, VMask's setting (App. B(4));
    ``epsilon=inf`` is the identity (no draw is made). Smaller is stronger.

    ``prior``: ``"empirical"`` (default) uses the class frequencies of the training labels, the
    same for every row: k* is then the number of most frequent classes kept, and with balanced
    classes k* = C, i.e. plain randomised response (keep probability e^eps / (e^eps + C - 1)).
    The histogram itself is computed from the true labels and not privatised (a small leak
    outside the eps guarantee); ``"uniform"`` is exact plain RR with no such leak.

    Deviation: Ghazi's multi-stage variant (RR on a first share of the data, then RRWithPrior with
    per-row priors from a model trained on it) needs a model trained on features before the VFL
    run; ``transform_labels`` sees only the labels, so only the single-stage mechanism is here.
    """

    name = "label_dp"
    side = "active"
    paper = "Ghazi et al., Deep Learning with Label Differential Privacy (NeurIPS 2021); VMask App. B(4)"
    protects = ("labels",)
    threat = LABEL_THREAT
    strength_param = "epsilon"
    strength_direction = "smaller is stronger"

    constraints: ClassVar[Mapping[str, Param]] = {
        "epsilon": Param("the privacy budget (.inf: no protection)", ge=0, inf=True),
        "prior": Param("the label prior of RR-with-prior: empirical or uniform"),
    }

    def __init__(self, *, epsilon: float = 3.0, prior: Literal["empirical", "uniform"] = "empirical") -> None:
        self.epsilon = epsilon
        self.prior = prior

    def transform_labels(self, objective: Objective) -> Objective:  # noqa: D102
        if math.isinf(self.epsilon):
            self.flipped_ = 0.0
            return objective
        labels = _class_labels(objective, self.name)
        y = labels.cpu()  # drawn on the CPU from the CPU generator (the same draws on every device)
        c = self.context_.num_classes
        prior = (
            torch.bincount(y, minlength=c).double() / len(y)
            if self.prior == "empirical"
            else torch.full((c,), 1.0 / c, dtype=torch.float64)
        )
        noisy = rr_with_prior(y, prior, self.epsilon, self.context_.generator)
        self.flipped_ = float((noisy != y).double().mean())
        return objective.replace(targets=noisy.to(labels.device), name=f"label_dp({objective.name})")

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        return {"flipped": self.flipped_} if epoch == 0 else {}


# ------------------------------------------------------------------------------------------- KDk


def kdk_soft_labels(teacher_scores: Tensor, labels: Tensor, epsilon: float, k: int) -> Tensor:
    """KDk's soft labels: 1 - eps on the true class, eps/(k-1) on each of the teacher's k-1 best other classes.

    The original overwrites the teacher's top-k with eps/(k-1) and then the true class with
    1 - eps, so a row whose true class is outside the top-k sums to more than 1 (a quirk); here
    the k-1 classes are always the best classes other than the true one, so every row sums to 1 and
    is non-zero on exactly k classes (identical to the original whenever the true class is in the top-k).
    Computed on ``teacher_scores``' device.
    """
    n, c = teacher_scores.shape
    dev = teacher_scores.device
    rows, labels = torch.arange(n, device=dev), labels.to(dev)
    others = teacher_scores.detach().double().clone()
    others[rows, labels] = -math.inf
    soft = torch.zeros(n, c, device=dev)
    soft.scatter_(1, others.topk(k - 1, dim=1).indices, epsilon / (k - 1))
    soft[rows, labels] = 1.0 - epsilon
    return soft


def _default_teacher(part: PartySlice) -> str:
    if part.kind == "text":
        return "text_cnn"
    if part.kind == "image" and len(part.sample_shape) == 3:
        return "lenet5"
    return "emb_mlp" if part.meta.get("categorical") else "mlp2"


@DEFENSES.register(summary="train on k-anonymous soft labels from a teacher the active party trains (KDk)")
class KDk(Defense):
    """KDk (Arazzi, Nicolazzo, Nocera 2024): knowledge distillation + k-anonymity on the labels.

    As in the original code, before the VFL run the active party trains a teacher on its *own*
    feature slice with the true labels (the benign party's slice; 20 epochs, Adam lr 1e-4,
    MultiStepLR x0.1 at 50% and 80% of the epochs, cross-entropy), then trains the VFL model with
    soft cross-entropy on :func:`kdk_soft_labels` of the teacher's outputs: 1 - ``epsilon`` on the
    true class and ``epsilon/(k-1)`` on each of the k-1 classes the teacher ranks highest among the
    others. Defaults eps = 0.45, k = 3 (VMask App. B(4), "in accordance with the original paper";
    the original's own default eps is 0.65). Larger eps is stronger; ``epsilon=0`` is the identity.
    The softmax temperature of the teacher does not matter: only its ranking of classes is used.
    The teacher is ``teacher_model`` (a bottom model of the zoo with C outputs; by default LeNet-5
    for images, mlp2 where LeNet-5 does not fit the strip, emb_mlp for categorical tabular data,
    text_cnn for text, mlp2 otherwise); the original used the bottom model's MLP (tabular) or an
    ImageNet-pretrained ResNet-50 (CIFAR). ``teacher_accuracy`` (training rows) is reported at epoch 0.

    Deviations: the teacher needs the active party's features, which reach a defense only through
    ``augment_features`` (in the federation builder, after ``transform_labels``), so the soft
    labels are first made without a teacher and refined in place once both are known. Without
    features (VSNN, where the active party holds none) the teacher is a label-smoothing one: the
    k-1 other classes are drawn uniformly at random per sample. The quirk of rows summing to more
    than 1 is removed (see :func:`kdk_soft_labels`).
    """

    name = "kdk"
    side = "active"
    paper = (
        "Arazzi, Nicolazzo, Nocera, KDk: A Defense Mechanism Against Label Inference Attacks in VFL "
        "(arXiv 2404.12369, 2024); VMask App. B(4)"
    )
    protects = ("labels",)
    threat = LABEL_THREAT
    strength_param = "epsilon"
    strength_direction = "larger is stronger"

    constraints: ClassVar[Mapping[str, Param]] = {
        "epsilon": Param("the label mass moved to the k nearest classes", ge=0, lt=1),
        "k": Param("classes that share the moved mass", ge=2),
        "teacher_model": Param("the teacher's bottom model (null: the task's)"),
        "teacher_epochs": Param("the teacher's training epochs", ge=1),
        "teacher_lr": LEARNING_RATE,
        "teacher_batch_size": BATCH,
    }

    def __init__(
        self,
        *,
        epsilon: float = 0.45,
        k: int = 3,
        teacher_model: str | None = None,
        teacher_epochs: int = 20,
        teacher_lr: float = 1e-4,
        teacher_batch_size: int = 64,
    ) -> None:
        self.epsilon = epsilon
        self.k = k
        self.teacher_model = teacher_model
        self.teacher_epochs = teacher_epochs
        self.teacher_lr = teacher_lr
        self.teacher_batch_size = teacher_batch_size

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.teacher_: nn.Module | None = None
        self.teacher_accuracy_: float | None = None
        self._labels: Tensor | None = None
        self._soft: Tensor | None = None
        self._part: PartySlice | None = None

    def transform_labels(self, objective: Objective) -> Objective:  # noqa: D102
        if self.epsilon == 0:
            return objective
        y = _class_labels(objective, self.name)
        c = self.context_.num_classes
        if self.k > c:
            raise ConfigError(f"defense 'kdk': k={self.k} exceeds the number of classes ({c}); use k <= {c}")
        self._labels = y
        random_ranking = torch.rand(len(y), c, generator=self.context_.generator)
        self._soft = kdk_soft_labels(random_ranking, y, self.epsilon, self.k).to(y.device)
        self._distil()
        return _soft_objective(objective, self._soft, f"kdk({objective.name})")

    def augment_features(self, part: PartySlice) -> PartySlice:
        """Receive the active party's own slice (unchanged): the teacher is trained on it."""
        if self.context_.party == ACTIVE and self.epsilon > 0:
            self._part = part
            self._distil()
        return part

    def _distil(self) -> None:
        """Once both the labels and the features are known: train the teacher, refine the soft labels in place."""
        if self._part is None or self._soft is None or self._labels is None or self.teacher_ is not None:
            return
        part, c, g = self._part, self.context_.num_classes, self.context_.generator
        try:
            teacher = build_bottom(self.teacher_model or _default_teacher(part), part, c, g)
        except ConfigError:
            if self.teacher_model is not None:
                raise
            teacher = build_bottom("mlp2", part, c, g)  # e.g. image strips too small for LeNet-5
        self.teacher_accuracy_ = train_classifier(
            teacher,
            part.x_train,
            self._labels,
            epochs=self.teacher_epochs,
            lr=self.teacher_lr,
            batch_size=self.teacher_batch_size,
            generator=g,
        )
        self._soft.copy_(kdk_soft_labels(predict(teacher, part.x_train), self._labels, self.epsilon, self.k))
        self.teacher_ = teacher
        self._part = None

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        if epoch == 0 and self.teacher_accuracy_ is not None:
            return {"teacher_accuracy": self.teacher_accuracy_}
        return {}


def train_classifier(
    model: nn.Module, x: Tensor, y: Tensor, *, epochs: int, lr: float, batch_size: int, generator: torch.Generator
) -> float:
    """KDk's teacher recipe: Adam, MultiStepLR x0.1 at 50%/80% of the epochs, cross-entropy; train accuracy."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    milestones = sorted({max(1, int(epochs * 0.5)), max(1, int(epochs * 0.8))})
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones, 0.1)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            ids = order[start : start + batch_size]
            loss = F.cross_entropy(model(x[ids]), y[ids])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    return float((predict(model, x).argmax(1) == y).double().mean())


# ------------------------------------------------------------------------------------------ CoAE

#: Per number of classes: (epochs, sharpening temperature T, Adam lr), from the original script.
COAE_RECIPES: dict[int, tuple[int, float, float]] = {
    2: (50, 0.025, 5e-4),
    5: (20, 0.025, 5e-4),
    10: (75, 0.025, 5e-4),
    20: (30, 0.028, 5e-4),
    100: (50, 0.05, 1e-5),
}


def coae_recipe(num_classes: int) -> tuple[int, float, float, int]:
    """(epochs, T, lr, hidden width) for C classes: the original's setting for the nearest C it covers."""
    nearest = min(COAE_RECIPES, key=lambda c: (abs(math.log(c / num_classes)), c))
    epochs, temperature, lr = COAE_RECIPES[nearest]
    encode_dim = 2 + (2 if num_classes >= 100 else 6) * num_classes
    return epochs, temperature, lr, encode_dim**2


def _onehot_ce(probabilities: Tensor, target: Tensor) -> Tensor:
    """The original's cross-entropy: log_softmax applied to already-softmaxed inputs (QUIRK, kept)."""
    return (-target * F.log_softmax(probabilities, dim=-1)).sum(1).mean()


def _mean_entropy(p: Tensor) -> Tensor:
    """Mean over all elements of -p log(p + 1e-6), as in the original."""
    return (-p * torch.log(p + 1e-6)).mean()


class ConfusionalAutoEncoder(nn.Module):
    """CoAE: encoder C -> hidden -> C with softmax (the fake soft label), decoder back to the class."""

    def __init__(self, num_classes: int, hidden: int, generator: torch.Generator) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.encoder = nn.Sequential(nn.Linear(num_classes, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        self.decoder = nn.Sequential(nn.Linear(num_classes, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, 0.01, generator=generator)
                    m.bias.zero_()

    def encode(self, y: Tensor) -> Tensor:
        """Soft fake labels (rows of probabilities) from (near) one-hot rows."""
        return self.encoder(y).softmax(1)

    def decode(self, p: Tensor) -> Tensor:
        """Class probabilities recovered from soft fake labels (or predictions of them)."""
        return self.decoder(p).softmax(1)

    def fit(
        self,
        *,
        entropy_weight: float,
        epochs: int,
        temperature: float,
        lr: float,
        samples: int,
        batch_size: int,
        generator: torch.Generator,
    ) -> None:
        """The original training: random near-one-hot rows, loss 10 CE(dec, y) - lambda H(enc) - CE(enc, y).
        Trains where the autoencoder's parameters are (the rows are drawn on the CPU and moved there)."""
        c = self.num_classes
        device = next(self.parameters()).device
        # sharpen(softmax(u), T) = softmax(u / T), computed without underflow
        data = (torch.rand(samples, c, generator=generator).to(device) / temperature).softmax(1)
        opt = torch.optim.Adam(self.parameters(), lr=lr)
        self.train()
        for _ in range(epochs):
            for start in range(0, samples, batch_size):
                y = data[start : start + batch_size]
                fake = self.encode(y)
                loss = (
                    10 * _onehot_ce(self.decode(fake), y) - entropy_weight * _mean_entropy(fake) - _onehot_ce(fake, y)
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        self.eval()


@DEFENSES.register(summary="train on confusing soft labels from an autoencoder, decode predictions (CoAE)")
class CoAE(Defense):
    """Confusional autoencoder (CoAE; Liu et al. 2022, as used in VFLAIR's CAE defense).

    Before training, the active party trains an autoencoder over C classes as in the original
    script: 30000 random near-one-hot rows softmax(U[0,1]^C / T), batch 128, Adam, loss
    ``10 CE(dec(enc(y)), y) - entropy_weight * H(enc(y)) - CE(enc(y), y)`` (the last term pushes the
    soft fake label away from the true class, the entropy term spreads it; H is the mean over
    elements of -p log p, and both CEs apply log_softmax to probabilities, the original's quirk,
    kept). Width, epochs, T and lr follow the original per C (``coae_recipe``; hidden width
    (2 + 6C)^2, (2 + 2C)^2 for C >= 100; epochs 75 for C = 10); ``epochs`` overrides the epochs.
    The VFL model is then trained with soft cross-entropy on ``enc(onehot(y))`` and its outputs are
    decoded as ``dec(softmax(outputs))`` for predictions and scores.

    ``entropy_weight`` is the original's lambda (swept over 0, 0.05, 0.1, 0.5, 1, 2); the default 1.0
    is VFLAIR's shipped CAE (``autoencoder_10_1.0``). Larger is stronger (more confusing labels);
    there is no neutral value (the contrastive term confuses even at 0). Cost: the original recipe
    for C = 10 is about 17,600 Adam steps on a 10-3844-10 encoder and decoder, minutes on a CPU;
    lower ``epochs``/``samples`` for quick runs (decode_accuracy at epoch 0 says whether it sufficed).
    """

    name = "coae"
    side = "active"
    paper = (
        "Zou, Liu et al., Defending Batch-Level Label Inference and Replacement Attacks in VFL "
        "(IEEE Trans. Big Data 2022; arXiv 2112.05409, CoAE); VFLAIR CAE"
    )
    protects = ("labels",)
    threat = LABEL_THREAT
    strength_param = "entropy_weight"
    strength_direction = "larger is stronger"

    constraints: ClassVar[Mapping[str, Param]] = {
        "entropy_weight": Param("the entropy term's weight"),
        "epochs": Param("the autoencoder's training epochs (null: the paper's recipe)", ge=1),
        "samples": Param("label vectors drawn to train the autoencoder", ge=1),
        "batch_size": BATCH,
    }

    def __init__(
        self, *, entropy_weight: float = 1.0, epochs: int | None = None, samples: int = 30000, batch_size: int = 128
    ) -> None:
        self.entropy_weight = entropy_weight
        self.epochs = epochs
        self.samples = samples
        self.batch_size = batch_size

    def transform_labels(self, objective: Objective) -> Objective:  # noqa: D102
        y = _class_labels(objective, self.name)
        c = self.context_.num_classes
        epochs, temperature, lr, hidden = coae_recipe(c)
        dev = y.device
        ae = ConfusionalAutoEncoder(c, hidden, self.context_.generator).to(dev)  # seeded on the CPU, then moved
        ae.fit(
            entropy_weight=self.entropy_weight,
            epochs=self.epochs or epochs,
            temperature=temperature,
            lr=lr,
            samples=self.samples,
            batch_size=self.batch_size,
            generator=self.context_.generator,
        )
        self.autoencoder_ = ae
        with torch.no_grad():
            codes = ae.encode(torch.eye(c, device=dev))
            classes = torch.arange(c, device=dev)
            self.decode_accuracy_ = float((ae.decode(codes).argmax(1) == classes).double().mean())
            self.confused_classes_ = float((codes.argmax(1) != classes).double().mean())
        self.codes_ = codes

        def scores(outputs: Tensor) -> Tensor:
            with torch.no_grad():
                return ae.decode(outputs.softmax(1))

        return _soft_objective(
            objective,
            codes[y],
            f"coae({objective.name})",
            scores=scores,
            decode=lambda outputs: scores(outputs).argmax(1),
        )

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        if epoch == 0:
            return {"decode_accuracy": self.decode_accuracy_, "confused_classes": self.confused_classes_}
        return {}


# ----------------------------------------------------------------------------------------- MixUp


@dataclass(frozen=True)
class MixDraw:
    """One step's mixing: row i becomes sum_j weights[j] * row perms[j][i] (perms[0] is the identity)."""

    index: int
    weights: Tensor
    perms: tuple[Tensor, ...]

    def mix(self, x: Tensor) -> Tensor:
        """Mix the rows of a batch ``x``."""
        if len(x) != len(self.perms[0]):
            raise ValueError(f"mixup draw for a batch of {len(self.perms[0])} rows applied to {len(x)} rows")
        w = self.weights.to(x.device, x.dtype)
        out = w[0] * x
        for wj, perm in zip(w[1:], self.perms[1:], strict=True):
            out = out + wj * x[perm]
        return out


class MixUpBottom(nn.Module):
    """A bottom model whose training-mode inputs are mixed by its party's MixUp instance.

    One draw per training forward; evaluation mode passes inputs through. Copies (``deepcopy``,
    e.g. the attacker's private copy of its bottom model) never mix: they are plain models with the
    same ``state_dict`` as the wrapped one.
    """

    def __init__(self, inner: nn.Module, defense: MixUp | None) -> None:
        super().__init__()
        self.inner = inner
        self.defense = defense

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        if self.training and self.defense is not None:
            if not torch.is_floating_point(x):
                raise ConfigError(
                    "defense 'mixup' mixes input features, but this party's inputs are integer "
                    "codes (token ids or categories); remove mixup for this dataset"
                )
            x = self.defense.bottom_draw(len(x)).mix(x)
        return self.inner(x)

    def __deepcopy__(self, memo: dict[int, Any]) -> MixUpBottom:
        clone = MixUpBottom(copy.deepcopy(self.inner, memo), None)
        return clone.train(self.training)


@DEFENSES.register(summary="train on mixtures of n_mix samples at every party, labels mixed alike (MixUp)")
class MixUp(Defense):
    """MixUp (Zhang et al., ICLR 2018) in VFL, as in Kang et al. §7.2 (eq. 20).

    Every training batch is replaced by mixtures of ``n_mix`` of its samples: row i becomes
    ``sum_j w_j x[perm_j[i]]`` with perm_0 the identity, n_mix - 1 random permutations and weights
    w ~ Dirichlet(alpha, ..., alpha) (Beta(alpha, alpha) for two samples), one draw per batch as in
    Zhang's code. Every party's bottom model mixes its own inputs with the same draw (the parties
    agree on it in advance: each instance draws from its copy of the shared generator, once per
    training step), and the active party mixes the loss with the same weights,
    ``sum_j w_j L(outputs, y[perm_j])``, which equals the loss on mixed (one-hot or soft) targets
    for the cross-entropy and logistic losses. Evaluation is unmixed. Kang sweeps n_mix = 2, 3, 4
    (larger is stronger); n_mix = 1 is the identity. Kang gives no alpha (only gamma in (0, 1));
    alpha = 1 (uniform weights, Zhang's CIFAR setting) is the default.

    In VSNN (no active bottom model) the active party's loss makes the step's draw; otherwise its
    bottom model does and the loss reuses it. A loss computed outside a training step (with an
    active bottom model) is unmixed and draws nothing. Discrete inputs (token ids, categorical
    codes: bottoms with an embedding layer, or integer inputs) cannot be mixed and raise an error.
    List ``mixup`` after label defenses that replace the loss (``kdk``, ``coae``).
    """

    name = "mixup"
    side = "both"
    paper = "Zhang et al., mixup: Beyond Empirical Risk Minimization (ICLR 2018); Kang et al. §7.2 eq. 20, §8.5.3"
    protects = ("features",)
    threat = (
        "feature reconstruction of a passive party's inputs by the active party (model inversion; "
        "Kang et al. §8.5.3); the mixed labels also blur label inference"
    )
    strength_param = "n_mix"
    strength_direction = "larger is stronger"

    constraints: ClassVar[Mapping[str, Param]] = {
        "n_mix": Param("rows mixed into each row", ge=1),
        "alpha": Param("the Dirichlet's concentration", gt=0),
    }

    def __init__(self, *, n_mix: int = 2, alpha: float = 1.0) -> None:
        self.n_mix = n_mix
        self.alpha = alpha

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.draws_ = 0
        self.last_draw_: MixDraw | None = None
        self._pending: MixDraw | None = None
        self._own_bottom = False

    def draw(self, n: int) -> MixDraw:
        """The next step's draw for a batch of ``n`` rows, from the shared generator."""
        g = self.context_.shared_generator
        perms = (torch.arange(n), *(torch.randperm(n, generator=g) for _ in range(int(self.n_mix) - 1)))
        seed = int(torch.randint(0, 2**62, (1,), generator=g))
        weights = torch.from_numpy(np.random.default_rng(seed).dirichlet([self.alpha] * int(self.n_mix)))
        self.draws_ += 1
        self.last_draw_ = MixDraw(self.draws_, weights, perms)
        return self.last_draw_

    def bottom_draw(self, n: int) -> MixDraw:
        """Called by this party's bottom model on a training forward; the active party keeps it for its loss."""
        d = self.draw(n)
        if self.context_.party == ACTIVE:
            self._pending = d
        return d

    def _loss_draw(self, n: int) -> MixDraw | None:
        if not self._own_bottom:
            return self.draw(n)
        d, self._pending = self._pending, None
        return d

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if self.n_mix == 1 or party != self.context_.party:
            return model
        if any(isinstance(m, nn.Embedding) for m in model.modules()):
            raise ConfigError(
                f"defense 'mixup' mixes input features, but {party}'s bottom model embeds discrete "
                "codes (token ids or categories), which cannot be mixed; remove mixup here"
            )
        self._own_bottom = party == ACTIVE
        return MixUpBottom(model, self)

    def transform_labels(self, objective: Objective) -> Objective:  # noqa: D102
        if self.n_mix == 1:
            return objective
        inner = objective.loss

        def mixed_loss(outputs: Tensor, targets: Tensor) -> Tensor:
            d = self._loss_draw(len(targets))
            if d is None:
                return inner(outputs, targets)
            w = d.weights.to(outputs.device, outputs.dtype)
            total = w[0] * inner(outputs, targets)
            for wj, perm in zip(w[1:], d.perms[1:], strict=True):
                total = total + wj * inner(outputs, targets[perm])
            return total

        return objective.replace(loss=mixed_loss, name=f"mixup({objective.name})")
