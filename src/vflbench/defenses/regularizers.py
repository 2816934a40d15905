"""Regularisers and bottlenecks: dCor, MID, NoPeek, embedding noise, FedPass, PRECODE.

Each defense adds a loss term (``regularizer``), wraps a model (``wrap_bottom`` / ``wrap_top``),
or perturbs what a passive party sends (``transform_embedding``). New modules are initialised
from the defense's bound generator, and every random draw inside them (reparameterisation noise,
passport keys) comes from that generator too, so that a run is a function of its seed.

Distance correlation is computed in the "square-root form" of NoPeek/FSHA and VFLAIR
(Székely's V-statistic): double-centred Euclidean distance matrices A, B; ``dCov = sqrt(mean(A*B))``,
``dVar = sqrt(mean(A*A))``, ``dCor = dCov / sqrt(dVar_x * dVar_y)``; with VFLAIR's +1e-16 under dCov and
each dVar (pairwise distances by ``torch.cdist``, see :func:`pairwise_distances`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError
from vflbench.models.base import init_parameters, linear_layers
from vflbench.models.top import Identity
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.protocol.messages import ACTIVE

COV_EPS = 1e-16
DcorForm = Literal["dcor", "log"]


# ----------------------------------------------------------------------------------------------
# distance correlation


def _as_matrix(x: Tensor) -> Tensor:
    """Samples as rows of a floating-point matrix (1-D: one column; N-D: flattened)."""
    x = x.unsqueeze(1) if x.dim() == 1 else x.flatten(1)
    return x if x.is_floating_point() else x.float()


def pairwise_distances(x: Tensor) -> Tensor:
    """Euclidean distances between the rows of ``x`` (N, N), safe to differentiate.

    ``torch.cdist``'s gradient is ``(x_i - x_j) / d_ij`` with 0 at coincident rows; the diagonal
    is set to exactly 0 (cdist's matrix-product path leaves rounding noise there). VFLAIR's
    ``sqrt(d2 + 1e-20)`` is not used: on ``|a|^2 + |b|^2 - 2ab`` it multiplies float32 rounding
    by up to 5e9 at coincident rows, which made training diverge.
    """
    d = torch.cdist(x, x)
    return d * (1 - torch.eye(len(x), dtype=d.dtype, device=d.device))


def _double_centre(d: Tensor) -> Tensor:
    return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()


def distance_correlation(x: Tensor, y: Tensor) -> Tensor:
    """Sample distance correlation of paired rows of ``x`` and ``y`` (any shapes, same N).

    In [0, 1]: 0 for independent samples (up to the V-statistic's small-sample bias), 1 when
    ``y`` is a similarity transform of ``x`` (e.g. a scaled, shifted copy). Differentiable.
    """
    x = _as_matrix(x)
    y = _as_matrix(y).to(x.dtype)
    if len(x) != len(y):
        raise ValueError(f"distance correlation needs paired samples, got {len(x)} and {len(y)} rows")
    a, b = _double_centre(pairwise_distances(x)), _double_centre(pairwise_distances(y))
    dcov = torch.sqrt((a * b).mean().clamp_min(0) + COV_EPS)
    dvar_x = torch.sqrt((a * a).mean() + COV_EPS)
    dvar_y = torch.sqrt((b * b).mean() + COV_EPS)
    return dcov / torch.sqrt(dvar_x * dvar_y)


def _label_matrix(targets: Tensor, num_classes: int) -> Tensor:
    """One-hot rows for class indices; soft-label rows as they are; a 1-D float target as a column."""
    if not targets.is_floating_point() and targets.dim() == 1:
        return F.one_hot(targets.long(), num_classes).float()
    return _as_matrix(targets).float()


def _check_form(form: str) -> None:
    if form not in ("dcor", "log"):
        raise ValueError(f"form must be 'dcor' or 'log', got {form!r}")


def _check_non_negative(**values: float) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")


class _StoresLoss(nn.Module):
    """A wrapper that keeps its last training-forward loss term in ``loss_`` until taken.

    ``loss_`` holds autograd history, so it is left out of copies and pickles (attackers and
    checkpoints copy models).
    """

    loss_: Tensor | None

    def take_loss(self) -> Tensor | None:
        """The stored loss term (once), or ``None``."""
        loss, self.loss_ = self.loss_, None
        return loss

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["loss_"] = None
        return state


def _gaussian_kl(mu: Tensor, sigma: Tensor) -> Tensor:
    """KL(N(mu, sigma^2) || N(0, 1)): summed over dimensions, averaged over the batch."""
    return (-0.5 * (1 + 2 * torch.log(sigma) - mu.pow(2) - sigma.pow(2))).sum(1).mean()


def _normal(shape: torch.Size, generator: torch.Generator, like: Tensor) -> Tensor:
    return torch.randn(shape, generator=generator, dtype=like.dtype).to(like.device)


def _output_width(model: nn.Module) -> int | None:
    """A bottom model's embedding width: ``out_features`` of its last Linear layer (zoo models end in one)."""
    layers = linear_layers(model)
    return layers[-1].out_features if layers and isinstance(layers[-1], nn.Linear) else None


def _needs_width(model: nn.Module, defense: str) -> int:
    width = _output_width(model)
    if width is None:
        raise CompatibilityError(f"{defense} needs a bottom model that ends in a Linear layer (to know its "
                                 f"embedding width); {type(model).__name__} does not.")
    return width


# ----------------------------------------------------------------------------------------------
# dCor (label side)


@DEFENSES.register(summary="label distance correlation: loss += weight * dCor(passive embedding, one-hot y)")
class DistanceCorrelationDefense(Defense):
    """dCor label protection (Sun et al. 2022; VFLAIR): decorrelate passive embeddings from labels.

    At the active party, for every received passive embedding h_k of the batch,
    ``loss += weight * dCor(h_k, onehot(y))`` (``form="dcor"``, as LabObf's Eq. 4 and VMask
    describe it) or ``weight * log(dCor(...))`` (``form="log"``, VFLAIR's code). The term is added
    before the cut gradient is computed, so it changes what each passive party is sent.
    Default weight 0.15 is VMask's appendix setting; LabObf's Table 3 uses 0.08 and VFLAIR's
    config 1e-4 (log form). Soft-label targets (from a label defense earlier in the list) are used
    as they are instead of one-hot rows. ``weight=0`` is the identity.
    """

    name = "dcor"
    side = "active"
    paper = "Sun et al., Label Leakage and Protection from Forward Embedding in Vertical Federated Learning (2022)"
    protects = ("labels",)
    adaptive_attacks = ("embedding_extension",)
    threat = "label inference from passive embeddings or bottom models (model completion, clustering)"
    strength_param = "weight"
    strength_direction = "larger is stronger"

    def __init__(self, *, weight: float = 0.15, form: DcorForm = "dcor") -> None:
        _check_non_negative(weight=weight)
        _check_form(form)
        self.weight = weight
        self.form = form

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        if self.weight == 0 or not state.embeddings or state.targets is None:
            return None
        y = _label_matrix(state.targets, self.context_.num_classes)
        terms = [distance_correlation(h, y) for h in state.embeddings]
        if self.form == "log":
            terms = [t.log() for t in terms]
        return self.weight * torch.stack(terms).sum()


# ----------------------------------------------------------------------------------------------
# MID


class _MIDLayer(nn.Module):
    """VFLAIR's MID bottleneck on one embedding: variational encoder, sample, decoder (all ReLU'd)."""

    def __init__(self, width: int, *, bottleneck_scale: float, std_shift: float, generator: torch.Generator) -> None:
        super().__init__()
        k = max(1, int(round(width * bottleneck_scale)))
        self.k = k
        self.std_shift = std_shift
        self.enlarge = nn.Linear(width, 2 * k)
        self.decoder = nn.Sequential(nn.Linear(k, 5 * k), nn.ReLU(), nn.Linear(5 * k, width), nn.ReLU())
        self.generator = generator
        init_parameters(self, generator)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        e = F.relu(self.enlarge(h))
        mu, sigma = e[:, : self.k], F.softplus(e[:, self.k :] - self.std_shift)
        z = mu + sigma * _normal(mu.shape, self.generator, mu)  # sampled in evaluation too (VFLAIR)
        return self.decoder(z), _gaussian_kl(mu, sigma)


class _MIDTop(_StoresLoss):
    """The top model behind one MID layer per passive slice of the concatenated input."""

    def __init__(self, top: nn.Module, slices: list[tuple[int, int, _MIDLayer | None]]) -> None:
        super().__init__()
        self.top = top
        self.bounds = [(s, e) for s, e, _ in slices]
        self.mids = nn.ModuleList([m for _, _, m in slices if m is not None])
        self.which = [m is not None for _, _, m in slices]
        self.loss_ = None

    def forward(self, z: Tensor) -> Tensor:
        parts, kls = [], []
        mids = iter(self.mids)
        for (s, e), through in zip(self.bounds, self.which, strict=True):
            part = z[:, s:e]
            if through:
                part, kl = next(mids)(part)
                kls.append(kl)
            parts.append(part)
        self.loss_ = torch.stack(kls).sum() if self.training and kls else None
        return self.top(torch.cat(parts, 1))


@DEFENSES.register(summary="Mutual Information regularization Defense: a variational bottleneck per "
                                  "passive embedding at the active party (concat aggregation)")
class MutualInformationDefense(Defense):
    """MID (Zou et al., 2023), as in the authors' VFLAIR code.

    The active party passes each received passive embedding (its slice of the concatenated
    top-model input) through its own bottleneck: ``h = ReLU(Linear(d -> 2*d*s)(x))`` split into
    mu and raw sigma, ``sigma = softplus(raw - std_shift)``, ``z = mu + sigma*eps`` (eps from
    the bound generator, resampled in evaluation too), decoder
    ``Linear(d*s -> 5*d*s) -> ReLU -> Linear(-> d) -> ReLU``; its own slice is left as it is.
    ``loss += weight * sum_k mean_batch(sum_dim KL(N(mu, sigma) || N(0, 1)))``. The MID layers
    belong to the active party (its optimizer trains them).

    Needs concatenation with a real top model: not VLR (identity top) and not sum/mean
    aggregation (the slices are lost). ``std_shift`` is 0.5 by default; VFLAIR uses 5 for its
    image datasets (MNIST, CIFAR, NUS-WIDE). Weight 1e-3 is VFLAIR's default (VMask used 5e-5).
    """

    name = "mid"
    side = "active"
    paper = "Zou et al., Mutual Information Regularization for Vertical Federated Learning (2023)"
    protects = ("labels",)
    threat = "label inference from passive embeddings, cut gradients or bottom models"
    strength_param = "weight"
    strength_direction = "larger is stronger"

    def __init__(self, *, weight: float = 1e-3, std_shift: float = 0.5, bottleneck_scale: float = 1.0) -> None:
        _check_non_negative(weight=weight)
        if bottleneck_scale <= 0:
            raise ValueError(f"bottleneck_scale must be > 0, got {bottleneck_scale}")
        self.weight = weight
        self.std_shift = std_shift
        self.bottleneck_scale = bottleneck_scale

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        if context.algorithm == "vlr":
            raise CompatibilityError("mid needs a top model on concatenated embeddings; VLR has none "
                                     "(its identity top sums the bottoms' logits). Use vhnn or vsnn.")
        aggregation = context.aggregation
        if aggregation not in (None, "concat"):
            raise CompatibilityError(f"mid needs train.aggregation: concat, not {aggregation!r}")
        self.widths_: dict[str, int | None] = {}
        self.top_: _MIDTop | None = None

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        self.widths_[party] = _output_width(model)  # the active party sees every bottom's width here
        return model

    def wrap_top(self, model: nn.Module) -> nn.Module:  # noqa: D102
        layers = linear_layers(model)
        if isinstance(model, Identity) or not layers or not isinstance(layers[0], nn.Linear):
            raise CompatibilityError("mid needs a top model that starts with a Linear layer on the concatenated "
                                     "embeddings; the identity top (VLR) has none.")
        in_dim = layers[0].in_features
        order = ([ACTIVE] if ACTIVE in self.widths_ else []) + [p for p in self.widths_ if p != ACTIVE]
        widths = [self.widths_[p] for p in order]
        if any(w is None for w in widths):
            raise CompatibilityError("mid needs bottom models that end in a Linear layer (to slice the top input)")
        total = sum(w for w in widths if w is not None)
        if total != in_dim:
            if len(widths) > 1 and in_dim in widths:
                raise CompatibilityError("mid needs train.aggregation: concat; with sum or mean the per-party "
                                         "embeddings cannot be separated at the top model.")
            raise CompatibilityError(f"mid cannot split the top model's input of width {in_dim} into the parties' "
                                     f"embeddings (widths {dict(zip(order, widths, strict=True))}).")
        slices: list[tuple[int, int, _MIDLayer | None]] = []
        start = 0
        for party, width in zip(order, widths, strict=True):
            assert width is not None
            mid = None if party == ACTIVE else _MIDLayer(width, bottleneck_scale=self.bottleneck_scale,
                                                         std_shift=self.std_shift, generator=self.context_.generator)
            slices.append((start, start + width, mid))
            start += width
        self.top_ = _MIDTop(model, slices)
        return self.top_

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        kl = self.top_.take_loss() if self.top_ is not None else None
        if kl is None or self.weight == 0:
            return None
        return self.weight * kl


# ----------------------------------------------------------------------------------------------
# NoPeek


@DEFENSES.register(summary="NoPeek: passive loss += alpha * dCor(own inputs, own embedding)")
class NoPeek(Defense):
    """NoPeek (Vepakomma et al. 2020): each passive party decorrelates its embedding from its input.

    ``weighting="additive"`` (default, NoPeek's loss): the passive party adds
    ``alpha * dCor(flatten(x_k), h_k)`` to its backward. ``weighting="convex"`` is DMAVFL's Eq. 6,
    ``alpha * dCor + (1 - alpha) * task``: the received cut gradient is also scaled by
    ``1 - alpha`` (so alpha = 1 trains the bottom on dCor alone; DMAVFL sweeps 0.2 ... 1.0).
    ``form="log"`` uses log(dCor) as VFLAIR does. ``alpha=0`` is the identity.
    """

    name = "nopeek"
    side = "passive"
    paper = ("Vepakomma et al., NoPeek: Information leakage reduction to share activations in distributed "
             "deep learning (2020)")
    protects = ("features",)
    threat = "feature reconstruction from a passive party's embeddings (model inversion, FSHA/DMAVFL-style)"
    strength_param = "alpha"
    strength_direction = "larger is stronger"

    def __init__(self, *, alpha: float = 0.1, weighting: Literal["additive", "convex"] = "additive",
                 form: DcorForm = "dcor") -> None:
        _check_non_negative(alpha=alpha)
        if weighting not in ("additive", "convex"):
            raise ValueError(f"weighting must be 'additive' or 'convex', got {weighting!r}")
        if weighting == "convex" and alpha > 1:
            raise ValueError(f"with weighting 'convex' alpha must be in [0, 1], got {alpha}")
        _check_form(form)
        self.alpha = alpha
        self.weighting = weighting
        self.form = form

    def on_received_gradient(self, gradient: Tensor, state: StepState) -> Tensor | None:  # noqa: D102
        if self.weighting == "convex" and self.alpha != 0:
            return (1 - self.alpha) * gradient
        return gradient

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        if self.alpha == 0 or state.inputs is None or state.embedding is None:
            return None
        d = distance_correlation(state.inputs, state.embedding)
        return self.alpha * (d.log() if self.form == "log" else d)


# ----------------------------------------------------------------------------------------------
# embedding noise


@DEFENSES.register(summary="Gaussian noise N(0, sigma^2) on every embedding a passive party sends")
class EmbeddingNoise(Defense):
    """Obfuscation with random noise (He, Zhang, Lee 2020; DMAVFL Table 8): ``h + N(0, sigma^2 I)``.

    Added by each passive party to every embedding it sends, in training and in evaluation (the
    noise is part of the party's protocol, so test-time queries are protected too). DMAVFL sweeps
    sigma over 0.1 ... 0.7; the default 0.5 is the middle of its stated 0.2 ... 0.8 range.
    ``sigma=0`` is the identity.
    """

    name = "embedding_noise"
    side = "passive"
    paper = "He, Zhang, Lee, Attacking and Protecting Data Privacy in Edge-Cloud Collaborative Inference Systems (2020)"
    protects = ("features", "labels")
    threat = "feature reconstruction or label inference from a passive party's embeddings"
    strength_param = "sigma"
    strength_direction = "larger is stronger"

    def __init__(self, *, sigma: float = 0.5) -> None:
        _check_non_negative(sigma=sigma)
        self.sigma = sigma

    def transform_embedding(self, embedding: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.sigma == 0:
            return embedding
        return embedding + self.sigma * _normal(embedding.shape, self.context_.generator, embedding)


# ----------------------------------------------------------------------------------------------
# FedPass


class PassportLayer(nn.Module):
    """FATE's ``LinearPassportBlock``: ``tanh(gamma) * W2 W1 x + tanh(beta)``.

    gamma and beta come from the private passport keys (fixed buffers): each key goes through
    the same two linear layers, is averaged over the passports, and through an autoencoder
    ``Linear(d -> d/4, no bias) -> LeakyReLU -> Linear(d/4 -> d, no bias)``.
    """

    skey: Tensor
    bkey: Tensor

    def __init__(self, in_dim: int, out_dim: int, *, hidden: int, key_loc: float, key_scale: float,
                 num_passport: int, generator: torch.Generator) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, hidden)
        self.linear2 = nn.Linear(hidden, out_dim)
        code = max(1, out_dim // 4)
        self.encode = nn.Linear(out_dim, code, bias=False)
        self.act = nn.LeakyReLU()
        self.decode = nn.Linear(code, out_dim, bias=False)
        init_parameters(self, generator)
        shape = (num_passport, in_dim)
        self.register_buffer("skey", torch.randn(shape, generator=generator) * key_scale + key_loc)
        self.register_buffer("bkey", torch.randn(shape, generator=generator) * key_scale + key_loc)

    def _from_key(self, key: Tensor) -> Tensor:
        k = self.linear2(self.linear1(key)).mean(0, keepdim=True)
        return self.decode(self.act(self.encode(k)))

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        out = self.linear2(self.linear1(x.flatten(1)))
        return torch.tanh(self._from_key(self.skey)) * out + torch.tanh(self._from_key(self.bkey))


@DEFENSES.register(summary="FedPass: private passport layers after each bottom model "
                                      "(and at the active party)")
class FedPass(Defense):
    """FedPass (Gu et al., IJCAI 2023), after FATE's passport blocks.

    Every passive party appends a :class:`PassportLayer` (d -> hidden -> d) to its bottom model,
    with private keys drawn from ``N(key_loc, key_scale^2)`` (FATE defaults: loc -1, scale 1,
    one passport, hidden 128) by its own bound generator. The active party adds one too:
    ``active_passport="bottom"`` on its own bottom output (FATE's guest aggregation layer; no
    effect in VSNN, where it has no bottom), ``"top"`` in front of the top model (on the whole
    aggregated input), or ``"none"``. The new layers are trained end to end by their owner.
    Strength = ``key_scale``: FedPass's obfuscation grows with the passports' spread (VMask used
    loc -1, variance 0.5).
    """

    name = "fedpass"
    side = "both"
    paper = ("Gu et al., FedPass: Privacy-Preserving Vertical Federated Deep Learning with Adaptive Obfuscation "
             "(IJCAI 2023)")
    protects = ("features", "labels")
    threat = "feature reconstruction and label inference from embeddings, gradients or bottom models"
    strength_param = "key_scale"
    strength_direction = "larger is stronger"

    def __init__(self, *, key_scale: float = 1.0, key_loc: float = -1.0, hidden: int = 128, num_passport: int = 1,
                 active_passport: Literal["bottom", "top", "none"] = "bottom") -> None:
        _check_non_negative(key_scale=key_scale)
        if hidden < 1 or num_passport < 1:
            raise ValueError("hidden and num_passport must be >= 1")
        if active_passport not in ("bottom", "top", "none"):
            raise ValueError(f"active_passport must be 'bottom', 'top' or 'none', got {active_passport!r}")
        self.key_scale = key_scale
        self.key_loc = key_loc
        self.hidden = hidden
        self.num_passport = num_passport
        self.active_passport = active_passport

    def _passport(self, in_dim: int, out_dim: int) -> PassportLayer:
        return PassportLayer(in_dim, out_dim, hidden=self.hidden, key_loc=self.key_loc, key_scale=self.key_scale,
                             num_passport=self.num_passport, generator=self.context_.generator)

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if party != self.context_.party or (party == ACTIVE and self.active_passport != "bottom"):
            return model  # the active instance also sees the passive bottoms: leave them to their owners
        width = _needs_width(model, "fedpass")
        return nn.Sequential(model, self._passport(width, width))

    def wrap_top(self, model: nn.Module) -> nn.Module:  # noqa: D102
        if self.active_passport != "top":
            return model
        layers = linear_layers(model)
        if not layers or not isinstance(layers[0], nn.Linear):
            raise CompatibilityError("fedpass with active_passport: top needs a top model that starts with a "
                                     "Linear layer (to know its input width); use active_passport: bottom.")
        width = layers[0].in_features
        return nn.Sequential(self._passport(width, width), model)


# ----------------------------------------------------------------------------------------------
# PRECODE


class VariationalBottleneck(_StoresLoss):
    """PRECODE's variational bottleneck behind a bottom model.

    ``Linear(d -> 2K)``: mu = first K, ``sigma = softplus(rest)``; ``z = mu + sigma*eps`` in
    training (eps from the bound generator), ``z = mu`` in evaluation; ``Linear(K -> d)``. Keeps
    ``KL(N(mu, sigma) || N(0, 1)) / ln 2`` (bits, averaged over the batch) of each training forward.
    """

    def __init__(self, bottom: nn.Module, width: int, *, bottleneck_dim: int, generator: torch.Generator) -> None:
        super().__init__()
        self.bottom = bottom
        self.k = bottleneck_dim
        self.encoder = nn.Linear(width, 2 * bottleneck_dim)
        self.decoder = nn.Linear(bottleneck_dim, width)
        self.generator = generator
        init_parameters(self.encoder, generator)
        init_parameters(self.decoder, generator)
        self.loss_ = None

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        h = self.bottom(x)
        s = self.encoder(h.flatten(1))
        mu, sigma = s[:, : self.k], F.softplus(s[:, self.k :])
        z = mu + sigma * _normal(mu.shape, self.generator, mu) if self.training else mu
        self.loss_ = _gaussian_kl(mu, sigma) / math.log(2) if self.training else None
        return self.decoder(z).view_as(h)


@DEFENSES.register(summary="PRECODE: a variational bottleneck after each passive bottom model")
class Precode(Defense):
    """PRECODE (Scheliga et al., WACV 2022) at each passive party, as Kang et al. evaluate it.

    A :class:`VariationalBottleneck` (K = ``bottleneck_dim``, default 256 as in the authors'
    code) is appended to the passive party's bottom model and trained by it, with
    ``beta * KL / ln 2`` (beta 1e-3, the code's default) added to its backward.
    Parameter-free in Kang et al. (no strength knob).
    """

    name = "precode"
    side = "passive"
    paper = ("Scheliga, Maeder, Seeland, PRECODE - A Generic Model Extension to Prevent Deep Gradient Leakage "
             "(WACV 2022)")
    protects = ("features",)
    threat = "feature reconstruction (model inversion) from a passive party's embeddings"
    strength_param = None

    def __init__(self, *, beta: float = 1e-3, bottleneck_dim: int = 256) -> None:
        _check_non_negative(beta=beta)
        if bottleneck_dim < 1:
            raise ValueError(f"bottleneck_dim must be >= 1, got {bottleneck_dim}")
        self.beta = beta
        self.bottleneck_dim = bottleneck_dim

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.bottleneck_: VariationalBottleneck | None = None

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if party != self.context_.party:
            return model
        self.bottleneck_ = VariationalBottleneck(model, _needs_width(model, "precode"),
                                                 bottleneck_dim=self.bottleneck_dim,
                                                 generator=self.context_.generator)
        return self.bottleneck_

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        kl = self.bottleneck_.take_loss() if self.bottleneck_ is not None else None
        if kl is None or self.beta == 0:
            return None
        return self.beta * kl
