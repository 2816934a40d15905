"""Cut-gradient perturbations: noise, compression and discretisation of d^B (Kang et al. §7.2).

All of them act at the active party in ``transform_cut_gradient``, on the gradient of the loss
with respect to one passive party's embedding, before it is sent (eq. 13-19 of Kang et al.,
"A Framework for Evaluating Privacy-Utility Trade-off in Vertical Federated Learning").
Each party's cut gradient is transformed separately; a gradient of shape (B, ...) is treated as
B flattened rows of width m. Randomness comes only from the generator given at ``bind``.

| defense | Kang | source | knob (``strength``) | neutral value |
|---|---|---|---|---|
| ``dp_laplace`` | eq. 13 | Fu et al. noisy gradients | ``scale`` (larger stronger) | 0: identity |
| ``isotropic_noise`` | eq. 14 | Li et al. ``white_gaussian`` | ``alpha`` (larger stronger) | 0: identity |
| ``max_norm`` | eq. 15 | Li et al. expectation max-norm | none | changes all but the largest row |
| ``marvell`` | eq. 16-17 | Li et al. ``sumKL`` | ``init_scale`` (larger stronger) | 0: identity |
| ``gradient_compression`` | eq. 18 | Fu et al. GC | ``ratio`` (smaller stronger) | 1: identity |
| ``discrete_sgd`` | eq. 19 | Fu et al. multistep gradient | ``bins`` (smaller stronger) | none |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.registry import Param

FU = "Fu et al., Label Inference Attacks Against Vertical Federated Learning (USENIX Security 2022)"
LI = "Li et al., Label Leakage and Protection in Two-party Split Learning (ICLR 2022)"
LABEL_THREAT = "label inference from the cut-layer gradients a passive party receives (NS, DS, DL, RR, GI, MC)"


def _randn(shape: tuple[int, ...], generator: torch.Generator, like: Tensor) -> Tensor:
    """Standard normal draws from ``generator`` (on its device), as ``like``'s dtype and device."""
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(like.device, like.dtype)


class _CutGradientDefense(Defense):
    side = "active"
    protects = ("labels",)
    threat = LABEL_THREAT

    @property
    def _generator(self) -> torch.Generator:
        return self.context_.generator


# --------------------------------------------------------------------------------------- noise


@DEFENSES.register(summary="add i.i.d. Laplace(0, scale) noise to every cut-gradient entry (Kang eq. 13)")
class DPLaplace(_CutGradientDefense):
    """Noisy gradients: ``d + Laplace(0, scale)`` i.i.d. per entry (Kang eq. 13; Fu et al.).

    ``scale`` is the Laplace scale lambda (standard deviation ``sqrt(2)*scale``); Fu's default
    is 1e-3 and Kang sweeps 1e-4, 1e-3, 1e-2, 1e-1. ``scale=0`` is the identity. The noise is
    drawn as ``scale*(E1 - E2)`` with E1, E2 i.i.d. Exp(1) (vectorised; Fu loops over entries).
    """

    name = "dp_laplace"
    paper = FU
    strength_param = "scale"
    constraints: ClassVar[Mapping[str, Param]] = {"scale": Param("the Laplace noise's scale", ge=0)}
    strength_direction = "larger is stronger"

    def __init__(self, *, scale: float = 1e-3) -> None:
        self.scale = scale

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.scale == 0:
            return gradient
        e = torch.empty((2, *gradient.shape), dtype=torch.float64).exponential_(generator=self._generator)
        return gradient + (self.scale * (e[0] - e[1])).to(gradient.device, gradient.dtype)


@DEFENSES.register(summary="add N(0, (alpha*max row norm/sqrt(m))^2 I) to the cut gradient (Kang eq. 14)")
class IsotropicNoise(_CutGradientDefense):
    """Isotropic Gaussian noise: ``d + N(0, sigma^2 I)``, ``sigma = alpha*max_i ||d_i||_2/sqrt(m)``.

    Kang eq. 14; Li et al.'s ``white_gaussian`` (their ``ratio`` is ``alpha``). ``||d_i||`` are
    the per-sample norms of the batch and m the per-sample width, so sigma is recomputed every
    batch. Kang sweeps alpha in 25, 10, 5, 2.75. ``alpha=0`` is the identity.
    """

    name = "isotropic_noise"
    paper = LI
    strength_param = "alpha"
    constraints: ClassVar[Mapping[str, Param]] = {
        "alpha": Param("noise standard deviation, in units of the batch's largest gradient norm per coordinate", ge=0)
    }
    strength_direction = "larger is stronger"

    def __init__(self, *, alpha: float = 1.0) -> None:
        self.alpha = alpha

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.alpha == 0 or gradient.numel() == 0:
            return gradient
        flat = gradient.flatten(1)
        sigma = self.alpha * flat.norm(dim=1).max() / math.sqrt(flat.shape[1])
        return gradient + sigma * _randn(tuple(gradient.shape), self._generator, gradient)


@DEFENSES.register(summary="scale each row by 1 + sigma_i*xi so that every E||d_i||^2 = max norm^2 (Kang eq. 15)")
class MaxNorm(_CutGradientDefense):
    """Li et al.'s expectation max-norm (Kang eq. 15), parameter-free.

    Per sample ``sigma_i = sqrt(max(||d||max^2/||d_i||^2 - 1, 0))`` and ``d_i <- d_i*(1 + sigma_i*xi_i)``
    with one scalar ``xi_i ~ N(0, 1)`` per sample, so that ``E||d_i'||^2 = ||d||max^2`` for every row.
    Every row except the largest changes. Rows that are exactly zero stay zero (multiplicative noise
    cannot give them a norm; Li's code would produce NaN there).
    """

    name = "max_norm"
    paper = LI
    strength_param = None

    def __init__(self) -> None:
        pass

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if gradient.numel() == 0:
            return gradient
        flat = gradient.flatten(1).double()
        norms = flat.norm(dim=1)
        nonzero = norms > 0
        ratio = torch.where(nonzero, norms.max() ** 2 / torch.where(nonzero, norms, 1.0) ** 2, 1.0)
        sigma = torch.sqrt((ratio - 1).clamp(min=0))
        xi = torch.randn(flat.shape[0], generator=self._generator, dtype=torch.float64).to(flat.device)
        factor = (1 + sigma * xi).to(gradient.dtype)
        return gradient * factor.view(-1, *([1] * (gradient.dim() - 1)))


# ------------------------------------------------------------------------------------- Marvell


def marvell_objective(
    l10: float, l20: float, l11: float, l21: float, *, u: float, v: float, G: float, p: float, d: int
) -> float:
    """Li et al.'s symmetrised-KL surrogate (twice the sum of the two KLs plus 2d).

    ``(d-1)(l20+u)/(l21+v) + (d-1)(l21+v)/(l20+u) + (l10+u+G)/(l11+v) + (l11+v+G)/(l10+u)``,
    with class 1 = positive (variance v), class 0 = negative (variance u); sumKL = objective/2 - d.
    The perpendicular terms count as 2(d-1) when both variances are 0 (identical point masses).
    """
    x0, x1 = l20 + u, l21 + v
    along = _div(l10 + u + G, l11 + v) + _div(l11 + v + G, l10 + u)
    if d == 1:
        return along
    return (d - 1) * (2.0 if x0 == 0 and x1 == 0 else _ratio_sum(x0, x1)) + along


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else 0.0)


def _ratio_sum(x: float, y: float) -> float:
    return _div(x, y) + _div(y, x)


def marvell_power(l10: float, l20: float, l11: float, l21: float, *, p: float, d: int) -> float:
    """Expected noise power ``p tr Cov(eta1) + (1-p) tr Cov(eta0)`` of the four variances."""
    return p * (l11 + (d - 1) * l21) + (1 - p) * (l10 + (d - 1) * l20)


def _along(D: np.ndarray, u: float, v: float, G: float, p: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best (l10, l11) with ``(1-p)l10 + p l11 = D`` (vectorised over D); also the objective part.

    With x = l10+u, y = l11+v, C = D + (1-p)u + pv and t = y/x on the constraint line, the along-
    direction terms equal ``(1+pG/C) t + (1+(1-p)G/C)/t + G/C``, convex in t with its minimum at
    ``E = sqrt((C+(1-p)G)/(C+pG))`` (Li's closed form); non-negativity bounds t to an interval,
    so the optimum is E clipped to it.
    """
    C = D + (1 - p) * u + p * v
    E = np.sqrt((C + (1 - p) * G) / (C + p * G))
    x_lo, x_hi = u, u + D / (1 - p)  # l10 = 0 and l11 = 0 respectively
    with np.errstate(divide="ignore", invalid="ignore"):
        t_hi = np.where(x_lo > 0, (C - (1 - p) * x_lo) / p / x_lo, np.inf)
        t_lo = v / x_hi
    t = np.clip(E, t_lo, t_hi)
    x = C / ((1 - p) + p * t)
    l10 = np.clip(x - u, 0.0, None)
    l10 = np.minimum(l10, D / (1 - p))
    l11 = np.clip((D - (1 - p) * l10) / p, 0.0, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        xx, yy = l10 + u, l11 + v
        value = (xx + G) / yy + (yy + G) / xx
    return l10, l11, np.where(np.isfinite(value), value, np.inf)


def _solve_small(u: float, v: float, G: float, p: float, d: int, P: float) -> tuple[float, float, float]:
    """Li's ``solve_small_neg``: class 0 has the smaller variance (u <= v), so l21 = 0.

    Returns (l10, l11, l20). The along-direction pair has a closed form for every budget left
    after l20 (see :func:`_along`); l20 is found by a dense grid over its feasible range, then
    repeated finer grids around the best point (the problem is not jointly convex in general, so
    the first grid guards against a local minimum).
    """
    K = (1 - p) * (d - 1)
    if K == 0 or v == 0:  # no perpendicular directions, or u = v = 0: all power along g_diff
        l10, l11, _ = _along(np.array([P]), u, v, G, p)
        return float(l10[0]), float(l11[0]), 0.0
    c_max = P / K

    def phi(c: np.ndarray) -> np.ndarray:
        D = np.clip(P - K * c, 0.0, None)
        _, _, along = _along(D, u, v, G, p)
        return (d - 1) * ((c + u) / v + v / (c + u)) + along

    grid = np.unique(np.concatenate([np.linspace(0.0, c_max, 257), c_max * np.geomspace(1e-12, 1.0, 129)]))
    for _ in range(9):  # zoom: each round keeps the two cells around the best point (x 1/32 per round)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = phi(grid)
        i = int(np.nanargmin(values))
        c = float(grid[i])
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        if hi - lo <= 1e-13 * c_max:
            break
        grid = np.linspace(lo, hi, 65)
    c = min(max(float(c), 0.0), c_max)
    l10, l11, _ = _along(np.array([max(P - K * c, 0.0)]), u, v, G, p)
    return float(l10[0]), float(l11[0]), c


def marvell_solve(u: float, v: float, G: float, p: float, d: int, P: float) -> tuple[float, float, float, float]:
    """Marvell's optimal noise variances ``(l10, l20, l11, l21)`` for power budget ``P``.

    Minimises :func:`marvell_objective` subject to ``marvell_power(...) == P`` and all variances
    >= 0, with Li et al.'s case split: if u <= v then l21 = 0 (``solve_small_neg``), else l20 = 0
    (``solve_small_pos``, the same problem with the classes swapped). When u = v = 0 all power
    goes along g_diff, in closed form. ``l1y`` is class y's noise variance along g_diff, ``l2y``
    its variance in each of the d-1 perpendicular directions. Inputs are normalised by
    ``u + v + G`` (the objective is scale-free), so tiny gradients are solved in float64 safely.
    """
    if P <= 0:
        return 0.0, 0.0, 0.0, 0.0
    s = u + v + G
    if s <= 0:  # all gradients in the batch identical: nothing distinguishes the classes
        return 0.0, 0.0, 0.0, 0.0
    u, v, G, P = u / s, v / s, G / s, P / s
    if u <= v:
        l10, l11, l20 = _solve_small(u, v, G, p, d, P)
        l21 = 0.0
    else:
        l11, l10, l21 = _solve_small(v, u, G, 1 - p, d, P)
        l20 = 0.0
    return l10 * s, l20 * s, l11 * s, l21 * s


def _binary_labels(targets: Tensor) -> Tensor:
    if targets.dim() > 1:  # soft or one-hot rows from a label defense: the most likely class
        return targets.argmax(1)
    return targets.round().long() if targets.is_floating_point() else targets.long()


@DEFENSES.register(summary="Li et al.'s optimal label-dependent Gaussian noise for binary labels (Kang eq. 16-17)")
class Marvell(_CutGradientDefense):
    """Marvell (Li et al., ICLR 2022; Kang eq. 16-17): optimal label-dependent Gaussian noise.

    Per batch, with pos/neg the rows of label 1/0 (flattened to B x m): ``v``/``u`` = mean over
    coordinates of the per-coordinate (population) variance of the positive/negative rows,
    ``g_diff = mean(pos) - mean(neg)``, ``G = ||g_diff||^2``, ``p`` = fraction of positives. The
    power budget is ``P = init_scale * G`` (Li's ``--init_scale``, default 1.0). Kang's eq. 16 bounds
    the noise power by tau; his sweep tau in 12, 8, 4, 2 is this relative scale (init_scale = tau),
    not an absolute trace, and the bound is met with equality (more power never raises the
    objective). :func:`marvell_solve` gives the variances, and class y's
    rows get noise with variance ``l1y`` along ``g_diff`` and ``l2y`` in every other direction.
    Li samples it as ``xi*sqrt(l1y - l2y)*g_diff/||g_diff|| + N(0, l2y I)``; we draw
    ``sqrt(l2y) z + (sqrt(l1y) - sqrt(l2y))(z.e) e`` with z ~ N(0, I), e = g_diff/||g_diff||: the same
    distribution when l1y >= l2y, and still the right covariance when l1y < l2y (where Li's
    square root would be of a negative number). The optimiser is deterministic (no warm start,
    no dynamic rescaling of the budget). Batches with a single class pass unchanged (Li's solver
    needs both) and are counted in the per-epoch metric ``single_class_batches``.
    Needs binary labels (class indices 0/1; soft rows are decoded by argmax).
    """

    name = "marvell"
    paper = LI
    threat = "label inference from cut-layer gradients in binary tasks (NS, DS)"
    strength_param = "init_scale"
    constraints: ClassVar[Mapping[str, Param]] = {"init_scale": Param("the noise power bound's scale", ge=0)}
    strength_direction = "larger is stronger"

    def __init__(self, *, init_scale: float = 1.0) -> None:
        self.init_scale = init_scale

    def bind(self, context: BindContext) -> None:  # noqa: D102
        if context.num_classes != 2:
            raise CompatibilityError(
                f"defense 'marvell' needs binary labels (Li et al.'s noise is derived for two "
                f"classes), but the task has {context.num_classes} classes; use a binary "
                f"dataset or another defense"
            )
        super().bind(context)
        self.single_class_batches_ = 0
        self.last_solution_: dict[str, float] = {}

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.init_scale == 0 or gradient.numel() == 0:
            return gradient
        if state.targets is None:
            raise ValueError("marvell needs the batch labels (StepState.targets)")
        y = _binary_labels(state.targets).to(gradient.device)
        pos, neg = y == 1, y == 0
        n_pos, n_neg = int(pos.sum()), int(neg.sum())
        if n_pos == 0 or n_neg == 0:
            self.single_class_batches_ += 1
            return gradient
        flat = gradient.flatten(1).double()
        d = flat.shape[1]
        v = float(flat[pos].var(0, correction=0).mean())
        u = float(flat[neg].var(0, correction=0).mean())
        g_diff = flat[pos].mean(0) - flat[neg].mean(0)
        G = float(g_diff.square().sum())
        p = n_pos / (n_pos + n_neg)
        P = self.init_scale * G
        if P <= 0:
            return gradient
        l10, l20, l11, l21 = marvell_solve(u, v, G, p, d, P)
        self.last_solution_ = {"u": u, "v": v, "G": G, "p": p, "P": P, "l10": l10, "l20": l20, "l11": l11, "l21": l21}
        e = g_diff / math.sqrt(G)
        along = torch.where(pos, math.sqrt(l11), math.sqrt(l10)).double()
        perp = torch.where(pos, math.sqrt(l21), math.sqrt(l20)).double()
        z = torch.randn(flat.shape, generator=self._generator, dtype=torch.float64).to(flat.device)
        noise = perp[:, None] * z + ((along - perp) * (z @ e))[:, None] * e[None]
        return gradient + noise.to(gradient.dtype).view_as(gradient)

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        count, self.single_class_batches_ = self.single_class_batches_, 0
        return {"single_class_batches": count}


# --------------------------------------------------------------------------------- compression


@DEFENSES.register(summary="keep the fraction `ratio` of largest-magnitude cut-gradient entries (Kang eq. 18)")
class GradientCompression(_CutGradientDefense):
    """Gradient compression (Kang eq. 18; Fu et al.): keep the largest-|d| entries, zero the rest.

    Per gradient tensor (the whole batch), ``k = int(numel*ratio)`` and the threshold t is the k-th
    largest ``|d|``; entries with ``|d| > t`` (strictly, as in Fu's code and Kang's eq. 18) are kept,
    so about k-1 survive when there are no ties. Kang's eq. 18 compares d itself with t; Fu's code,
    which Kang evaluates, compares magnitudes, and so do we. ``ratio=1`` is the identity (special-
    cased: the strict rule would drop the smallest entry); k = 0 zeroes everything. Kang sweeps
    ratio in 0.1, 0.25, 0.5, 0.75 (Fu's default 0.75).
    """

    name = "gradient_compression"
    paper = FU
    strength_param = "ratio"
    constraints: ClassVar[Mapping[str, Param]] = {"ratio": Param("the share of gradient entries kept", gt=0, le=1)}
    strength_direction = "smaller is stronger"

    def __init__(self, *, ratio: float = 0.75) -> None:
        self.ratio = ratio

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.ratio >= 1 or gradient.numel() == 0:
            return gradient
        k = int(gradient.numel() * self.ratio)
        if k == 0:
            return torch.zeros_like(gradient)
        magnitude = gradient.abs()
        threshold = magnitude.flatten().topk(k).values[-1]
        return torch.where(magnitude > threshold, gradient, torch.zeros_like(gradient))


@DEFENSES.register(summary="snap cut-gradient entries to N+1 levels in mu +- 2 sigma, zero outliers (Kang eq. 19)")
class DiscreteSGD(_CutGradientDefense):
    """DiscreteSGD (Kang eq. 19; Fu et al.'s multistep gradient): discretise every entry.

    ``mode="kang"`` (default, the version Kang evaluates): per gradient tensor, ``lb = mu - 2 sigma``
    and ``ub = mu + 2 sigma`` (mean and population standard deviation of all entries); the range
    is cut into ``bins`` equal bins whose ``bins+1`` endpoints are the only values kept: entries in
    [lb, ub] snap to the nearest endpoint, the others become 0. A constant tensor (sigma = 0) is
    returned as is. ``mode="fu"``: Fu's code, ``interval = 2*bound/bins`` and
    ``d' = round(d/interval)*interval``, without clipping to +-bound (Fu's quirk). Kang sweeps bins
    in 18, 12, 6, 4 (Fu's default 6). There is no setting that is exactly the identity.
    """

    name = "discrete_sgd"
    paper = FU
    strength_param = "bins"
    constraints: ClassVar[Mapping[str, Param]] = {
        "bins": Param("quantisation levels", ge=1),
        "mode": Param("kang (Kang et al.'s grid) or fu (Fu et al.'s)"),
        "bound": Param("the grid's bound", gt=0),
    }
    strength_direction = "smaller is stronger"

    def __init__(self, *, bins: int = 6, mode: Literal["kang", "fu"] = "kang", bound: float = 3e-2) -> None:
        self.bins = bins
        self.mode = mode
        self.bound = bound

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if gradient.numel() == 0:
            return gradient
        if self.mode == "fu":
            interval = 2 * self.bound / int(self.bins)
            return torch.round(gradient / interval) * interval
        g = gradient.double()
        mu, sigma = g.mean(), g.std(correction=0)
        if sigma == 0:
            return gradient
        lb, ub = mu - 2 * sigma, mu + 2 * sigma
        bins = int(self.bins)
        width = (ub - lb) / bins
        index = torch.round((g - lb) / width).clamp(0, bins)
        snapped = lb + index * width
        inside = (g >= lb) & (g <= ub)
        return torch.where(inside, snapped, torch.zeros_like(g)).to(gradient.dtype)
