"""Model completion with MixMatch (Fu et al., USENIX Security 2022, §4.2), as in their code.

Fu et al.'s ``model_completion.py`` fine-tunes the attacker's bottom model plus an inference
head semi-supervised with a single-view MixMatch (Berthelot et al., NeurIPS 2019): no data
augmentation, the current model guesses the labels of an unlabelled batch, the guesses are
sharpened, labelled and unlabelled rows are mixed up together, and an EMA of the model is
evaluated after every epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import (
    LabelInference,
    LabelMetric,
    PartyView,
    Prior,
    Scale,
    Scenario,
    Scores,
    Selection,
    check_selection,
    require,
    split_validation,
)
from vflbench.attacks.label.model_completion import ModelCompletion, class_scores, predict
from vflbench.attacks.registry import ATTACKS
from vflbench.errors import CompatibilityError
from vflbench.models import inference_head, init_parameters
from vflbench.registry import BATCH, LEARNING_RATE, POSITIVE, Param

#: Bottom models whose inputs are integer codes or token ids: mixing them up is meaningless.
MIXUP_INCOMPATIBLE_BOTTOMS = frozenset({"text_cnn", "emb_mlp"})


def shuffled_batches(n: int, size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless shuffled batches of ``range(n)``, dropping the last partial batch and reshuffling
    when exhausted (Fu's ``DataLoader(shuffle=True, drop_last=True)`` restarted on
    ``StopIteration``)."""
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - size + 1, size):
            yield order[start : start + size]


def interleave(chunks: list[Tensor], batch: int) -> list[Tensor]:
    """MixMatch's interleaving: swap the i-th slice of chunk 0 with the i-th slice of chunk i so
    that every forward pass sees labelled and unlabelled rows (BatchNorm statistics). The
    operation is its own inverse, so it also puts the outputs back."""
    groups = len(chunks)
    sizes = [batch // groups] * groups
    for j in range(batch - sum(sizes)):
        sizes[-j - 1] += 1
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    parts = [[c[offsets[i] : offsets[i + 1]] for i in range(groups)] for c in chunks]
    for i in range(1, groups):
        parts[0][i], parts[i][i] = parts[i][i], parts[0][i]
    return [torch.cat(p) for p in parts]


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` holds a BatchNorm layer (whose batch statistics interleaving protects)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@ATTACKS.register(summary="model completion fine-tuned semi-supervised with MixMatch (Fu et al.'s code)")
class MixMatchCompletion(ModelCompletion):
    """Passive model completion with MixMatch, as in Fu et al.'s ``model_completion.py``.

    The attacker attaches an inference head (the MLP2 head of :class:`ModelCompletion`, not
    Fu's BN-ReLU-Linear head with all-ones weights) to its trained bottom model and fine-tunes
    both (the head only if ``finetune_bottom`` is false) on its ``known_per_class`` labels per
    class plus every other training row of its own feature slice as unlabelled data. Each of
    the ``val_iteration`` steps of an epoch draws a labelled and an unlabelled batch of
    ``batch_size`` rows and:

    * guesses the unlabelled labels with the current (not the EMA) model in training mode,
      ``p = softmax(model(u))``, and sharpens them, ``p**(1/temperature)`` renormalised;
    * mixes up the concatenated labelled + unlabelled batch with a random permutation of itself,
      ``lam ~ Beta(alpha, alpha)``, ``lam = max(lam, 1 - lam)``;
    * minimises ``Lx + w * Lu``: soft cross-entropy on the mixed labelled rows, the mean squared
      error between ``softmax`` of the mixed unlabelled logits and their mixed targets, and
      ``w = lambda_u * clip((epoch + step / val_iteration) / epochs, 0, 1)``, with Adam;
    * updates an EMA model (decay ``ema_decay``) over every floating-point entry of the
      state dict (parameters and BatchNorm running statistics; integer buffers such as
      ``num_batches_tracked`` are left as they are, which is what Fu's float cast amounts to),
      then multiplies every floating-point entry of the live model's state dict by
      ``1 - 0.02 * lr`` (Fu's weight decay; like Fu's, it also shrinks a frozen bottom).

    The EMA model is evaluated after every epoch on the test split (and, as a diagnostic, on
    all training rows, Fu's "label inference accuracy"); the runner reports the epoch the
    selection rule picks (``select``: the last by default; ``"validation"`` holds ``val_per_class``
    known labels per class out of the labelled set and picks the epoch that scores best on them;
    ``"test_oracle"`` is Fu's best test epoch, an oracle).

    Departures, all forced or behaviour-preserving: the labelled and unlabelled chunks are
    interleaved and forwarded separately only when the model has BatchNorm; without it one
    forward pass over the mixed batch gives the same logits (our MLP models have none).
    ``torch.distributions.Beta`` takes no generator, so ``lam`` comes from a NumPy generator
    seeded by one draw from ``view.generator`` (no global RNG is used). ``batch_size`` may not
    exceed the number of known labels (Fu's code raises the same error).

    In VLR the attacker's bottom model already outputs the logits and there is no room for an
    inference head, so this attack refuses VLR; use ``model_completion`` there. Inputs that are
    integer codes or token ids (``emb_mlp``, ``text_cnn``) cannot be mixed up and are refused.
    The ``local`` prior runs the same procedure from a freshly initialised bottom model.
    ``metric`` is :class:`ModelCompletion`'s.
    """

    name = "model_completion_mixmatch"
    reads = ("bottom_model",)
    phase = "post_training"
    paper = (
        "Fu et al., Label Inference Attacks Against VFL (USENIX Security 2022), passive model completion "
        "with MixMatch (Berthelot et al., NeurIPS 2019); FuChong-cyber/label-inference-attacks "
        "model_completion.py"
    )
    threat = "honest-but-curious passive party holding a few labelled samples and its own unlabelled rows (T1)"
    batch_size: int
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "lr": (5e-4, 2e-3, 8e-3),
        "epochs": (Scale(0.5), Scale(1.0), Scale(2.0)),
        "lambda_u": (10.0, 50.0, 100.0),
    }
    constraints: ClassVar[Mapping[str, Param]] = {
        "epochs": Param("MixMatch epochs", ge=1),
        "val_iteration": Param("steps per MixMatch epoch", ge=1),
        "batch_size": BATCH,
        "lr": LEARNING_RATE,
        "alpha": Param("the Beta(alpha, alpha) of the mixing", gt=0),
        "lambda_u": Param("weight of the unlabelled loss"),
        "temperature": POSITIVE,
        "ema_decay": Param("decay of the weights' moving average", ge=0, le=1),
    }

    def __init__(
        self,
        *,
        party: str = "passive_1",
        known_per_class: int = 4,
        epochs: int = 10,
        val_iteration: int = 1024,
        batch_size: int = 16,
        lr: float = 2e-3,
        alpha: float = 0.75,
        lambda_u: float = 50.0,
        temperature: float = 0.8,
        ema_decay: float = 0.999,
        head_hidden: int = 64,
        finetune_bottom: bool = True,
        select: Selection = "last",
        val_per_class: int = 1,
        prior: Prior = "local",
        every_epoch: bool = False,
        metric: LabelMetric = "auto",
    ) -> None:
        self.party = party
        self.known_per_class = known_per_class
        self.epochs = epochs
        self.val_iteration = val_iteration
        self.batch_size = batch_size
        self.lr = lr
        self.alpha = alpha
        self.lambda_u = lambda_u
        self.temperature = temperature
        self.ema_decay = ema_decay
        self.head_hidden = head_hidden
        self.finetune_bottom = finetune_bottom
        self.select = select
        self.val_per_class = val_per_class
        self.prior = prior
        self.every_epoch = every_epoch
        self.metric = metric
        check_selection(self.name, select, val_per_class, known_per_class)

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        super().check(scenario)
        require(
            scenario.algorithm != "vlr",
            self.name,
            "MixMatch needs an inference head, but in VLR the bottom model outputs the logits; "
            "use model_completion (a sigmoid on the bottom model) instead",
        )
        require(
            scenario.bottom not in MIXUP_INCOMPATIBLE_BOTTOMS,
            self.name,
            f"the {scenario.bottom!r} bottom model reads integer codes or token ids, which mixup cannot mix",
        )
        per_class = self.known_per_class - (self.val_per_class if self.select == "validation" else 0)
        known = per_class * scenario.num_classes
        require(
            self.batch_size <= known,
            self.name,
            f"batch_size ({self.batch_size}) exceeds the {known} known labels it fine-tunes on "
            f"({per_class} per class); lower batch_size or raise known_per_class",
        )

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        return self.complete(view, view.bottom())

    def local(self, view: PartyView) -> LabelInference:
        """J_loc: the same MixMatch procedure from a freshly initialised bottom model."""
        return self.complete(view, view.bottom())

    def complete(self, view: PartyView, bottom: nn.Module) -> LabelInference:
        """Attach an inference head to ``bottom`` and fine-tune it with MixMatch."""
        assert view.known is not None
        x_all = view.data.x_train
        if not x_all.is_floating_point():
            raise CompatibilityError(
                f"attack {self.name!r} cannot run here: the features are integer "
                "codes or token ids, which mixup cannot mix"
            )
        k = view.scenario.num_classes
        gen = view.generator
        head = init_parameters(inference_head(view.scenario.embed_dim, k, self.head_hidden), gen).to(x_all.device)
        model = nn.Sequential(bottom, head)
        if not self.finetune_bottom:
            bottom.requires_grad_(False)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=self.lr)
        ema = copy.deepcopy(model).requires_grad_(False)
        live_state, ema_state = list(model.state_dict().values()), list(ema.state_dict().values())
        decay = 1.0 - 0.02 * self.lr
        beta = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=gen)))
        interleaved = has_batchnorm(model)

        fit, val = split_validation(view.known, self.select, self.val_per_class, gen, view.holdout)
        labelled = torch.zeros(len(x_all), dtype=torch.bool)
        labelled[view.known.ids] = True
        x_l, x_u = x_all[fit.ids], x_all[~labelled]
        t_l = F.one_hot(fit.labels, k).to(x_all.dtype)
        size = self.batch_size
        train_ids, test_ids = torch.arange(len(x_all)), torch.arange(len(view.data.x_test))
        per_epoch = []
        for epoch in range(self.epochs):
            model.train()
            batches_l = shuffled_batches(len(x_l), size, gen)
            batches_u = shuffled_batches(len(x_u), size, gen)
            for step in range(self.val_iteration):
                bl, bu = next(batches_l), next(batches_u)
                inputs_u = x_u[bu]
                with torch.no_grad():
                    sharpened = model(inputs_u).softmax(1) ** (1.0 / self.temperature)
                    guessed = sharpened / sharpened.sum(1, keepdim=True)
                inputs = torch.cat([x_l[bl], inputs_u])
                targets = torch.cat([t_l[bl], guessed])
                lam = float(beta.beta(self.alpha, self.alpha))
                lam = max(lam, 1.0 - lam)
                perm = torch.randperm(len(inputs), generator=gen)
                mixed_x = lam * inputs + (1.0 - lam) * inputs[perm]
                mixed_t = lam * targets + (1.0 - lam) * targets[perm]
                if interleaved:
                    chunks = interleave(list(torch.split(mixed_x, size)), size)
                    logits = torch.cat(interleave([model(c) for c in chunks], size))
                else:
                    logits = model(mixed_x)
                loss_x = -(F.log_softmax(logits[:size], 1) * mixed_t[:size]).sum(1).mean()
                loss_u = ((logits[size:].softmax(1) - mixed_t[size:]) ** 2).mean()
                weight = self.lambda_u * float(np.clip((epoch + step / self.val_iteration) / self.epochs, 0.0, 1.0))
                loss = loss_x + weight * loss_u
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    for live, avg in zip(live_state, ema_state, strict=True):
                        if avg.is_floating_point():
                            avg.mul_(self.ema_decay).add_(live, alpha=1.0 - self.ema_decay)
                            live.mul_(decay)
            train_scores = class_scores(predict(ema, x_all))
            per_epoch.append(
                LabelInference(
                    train=Scores(train_ids, train_scores, "train"),
                    test=Scores(test_ids, class_scores(predict(ema, view.data.x_test)), "test"),
                    validation=None if val is None else Scores(val.ids, train_scores[val.ids]),
                )
            )
        return LabelInference(
            per_epoch=per_epoch,
            details={
                "known_labels": len(x_l),
                "unlabelled": len(x_u),
                "trained": True,
                "validation_labels": 0 if val is None else len(val.ids),
                "interleaved": interleaved,
            },
        )
