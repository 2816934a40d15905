"""VMask weight recovery: an honest-but-curious passive party solves for its masked weights, then
runs model completion on the recovered model (the ``recovered`` attacker view; review V1).

Under VMask's Algorithm 5 the passive party P_k legitimately holds its own plaintext weight before
masking, every update it applies to its share (it computes them itself), the reconstructed output
of every masked layer and the reconstructed gradient with respect to the layer's input. The active
party's share, and with it its ``N(0, sigma^2)`` noise ``R``, stays fixed while the layer stays
masked. With ``W_known`` = P_k's weight before masking plus its own updates since, every opening
is a linear equation in ``R``:

* forward: ``y - x W_known^T - b_known = x R^T + r_b`` (the same ``R`` in every batch, so stacking
  ``ceil((n_in + 1) / B)`` batches solves it, even with ``B < n_in``, the paper's §IV-D condition);
* backward: ``dL/dx - G W_known = G R`` with ``G`` the output gradient P_k fed in (one batch solves
  it when the output width is at most ``B``; the first layer gets no input gradient).

The attack records these through each masked layer's declared observation point
(:class:`~vflbench.mpc.observation.ObservationPoint`), folding the first ``max_openings`` openings of
each stage of a layer's final masking episode into normal equations, each equation weighted by
the inverse square of its rounding step (so both channels are in the same units). It then solves
both channels jointly by least squares: ``A_b R + R A_f = C`` with ``A_f`` the forward normal
matrix (the bias profiled out) and ``A_b`` the backward one. A direction of ``R`` is determined
when either channel sees it; directions neither sees (both channels rank-deficient: the layer is
reported ``solvable: false``) keep ``W_known`` (``fallback: tracked``, the minimum-norm solution),
or the whole layer becomes P_k's decoded share (``fallback: share``). Model completion then runs on
the recovered model with model completion's recipe, known labels and random stream
(``shares_draws_with``), so its value is directly comparable with ``model_completion``'s and its
scratch (or local) prior is the same number.

Reconstruction errors against the true effective weights are computed for reporting only, after
the recovery, through :meth:`MaskableLayer.evaluation_only_effective_weight` (a simulation oracle
that neither party has); nothing the attack infers depends on them.

``vmask_own_record`` (:class:`VMaskOwnRecord`) is the same attacker without the solve: every masked
layer gets ``W_known`` alone (P_k's weight before masking plus its own updates), which misses only
the active party's ``N(0, sigma^2)`` noise; it reads no opening and no evaluation oracle.
"""

from __future__ import annotations

import logging
import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import LabelInference, LabelMetric, PartyView, Prior, Selection, ThreatGrant
from vflbench.attacks.label.model_completion import ModelCompletion
from vflbench.attacks.registry import ATTACKS
from vflbench.mpc.masking import AttackerBottom, MaskableLayer, VMaskBottom
from vflbench.mpc.observation import Opening
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.party import Party
from vflbench.registry import Param

log = logging.getLogger(__name__)

MIN_INFORMATION = 1e6
"""A direction counts as determined when its weighted normal-equation eigenvalue exceeds this: the
equations are in units of their rounding step (std ~0.29), so the error std there is <= 3e-4."""
RELATIVE_RANK_TOLERANCE = 1e-10
"""...and exceeds this fraction of the largest eigenvalue (float64 round-off)."""
DENSE_LIMIT = 6000
"""Conv layers with more unknowns than this are solved from the forward channel alone."""


def _ring_delta(now: Tensor, start: Tensor, frac_bits: int) -> Tensor:
    """``decode(now - start)``: P_k's own updates to its share since masking (exact ring difference)."""
    return (now - start).to(torch.float64) * 2.0**-frac_bits


def transposed_patches(
    g: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int], size: tuple[int, int]
) -> Tensor:
    """The design matrix of a conv layer's input gradient in its weight: rows ``(b, i, j)`` of the
    input, columns ``(o, m_u, m_v)`` with ``dx[b, c, i, j] = sum g_cols[(b,i,j), (o,m_u,m_v)] *
    W[o, c, kh-1-m_u, kw-1-m_v]``."""
    b, o, ho, wo = g.shape
    (kh, kw), (sh, sw), (ph, pw), (h, w) = kernel, stride, padding, size
    dilated = g.new_zeros(b, o, (ho - 1) * sh + 1, (wo - 1) * sw + 1)
    dilated[:, :, ::sh, ::sw] = g
    eh, ew = h - ((ho - 1) * sh + kh - 2 * ph), w - ((wo - 1) * sw + kw - 2 * pw)
    padded = F.pad(dilated, (kw - 1 - pw, kw - 1 - pw + ew, kh - 1 - ph, kh - 1 - ph + eh))
    cols = F.unfold(padded, (kh, kw))
    return cols.transpose(1, 2).reshape(b * h * w, o * kh * kw)


class LayerRecorder:
    """P_k's record of one masked layer's final masking episode, as normal equations in ``R``.

    An observer of the layer's :class:`~vflbench.mpc.observation.ObservationPoint`: it keeps P_k's weight
    before masking and its share at masking, and folds every forward and backward opening (up to
    ``max_openings`` each; ``0``: none, the record is then only what :meth:`known` needs) into weighted
    normal equations. A new masking starts a new episode. The record and
    its solve are kept on the CPU in float64 whatever device the layer runs on (small dense linear algebra; the
    openings it folds are copied there, at most ``max_openings`` per stage and episode).
    """

    def __init__(self, layer: MaskableLayer, *, max_openings: int | None) -> None:
        self.conv = layer.conv
        self.shape = layer.shape
        self.config = dict(layer.config)
        self.max_openings = max_openings
        self.episodes = 0
        self.open = False
        self._reset()

    def _reset(self) -> None:
        self.counts = {"forward": 0, "backward": 0}
        self.rows = {"forward": 0, "backward": 0}
        self.fwd: tuple[Tensor, Tensor] | None = None
        self.bwd: tuple[Tensor, Tensor] | None = None

    # -- the observer interface ---------------------------------------------------------------------

    def masked(self, weight: Tensor, bias: Tensor | None, weight_share: Tensor, bias_share: Tensor | None) -> None:
        """A new masking episode: remember P_k's plaintext weight before it and its shares after it."""
        self.weight0 = weight.detach().to("cpu", torch.float64, copy=True)
        self.bias0 = None if bias is None else bias.detach().to("cpu", torch.float64, copy=True)
        self.share0 = weight_share.to("cpu", copy=True)
        self.bias_share0 = None if bias_share is None else bias_share.to("cpu", copy=True)
        self.episodes += 1
        self.open = True
        self._reset()

    def unmasked(self) -> None:
        """The episode ended: P_k holds the plaintext again."""
        self.open = False
        self._reset()

    def known(
        self, weight_share: Tensor, bias_share: Tensor | None, frac_bits: int, scale: float = 1.0
    ) -> tuple[Tensor, Tensor | None]:
        """``W_known``: P_k's weight before masking plus its own updates since (from its share); on the CPU."""
        w = self.weight0 + _ring_delta(weight_share.cpu(), self.share0, frac_bits) * scale
        b = None
        if self.bias0 is not None and bias_share is not None and self.bias_share0 is not None:
            b = self.bias0 + _ring_delta(bias_share.cpu(), self.bias_share0, frac_bits) * scale
        return w, b

    @torch.no_grad()
    def opened(self, o: Opening) -> None:
        """Fold one opening into the normal equations of its channel."""
        if not self.open or (self.max_openings is not None and self.counts[o.stage] >= self.max_openings):
            return
        self.counts[o.stage] += 1
        w_known, b_known = self.known(o.weight_share, o.bias_share, o.frac_bits, o.scale)
        x, out = o.operand.to("cpu", torch.float64), o.opened.to("cpu", torch.float64)
        weight = 1.0 / o.resolution**2
        if o.stage == "forward":
            design, resid = self._forward_rows(x, out, w_known, b_known)
            design = torch.cat([design, torch.ones(len(design), 1, dtype=torch.float64)], 1)
            self.fwd = self._add(self.fwd, design, resid, weight)
            self.rows["forward"] += len(design)
        else:
            design, resid = self._backward_rows(x, out, w_known)
            self.bwd = self._add(self.bwd, design, resid, weight)
            self.rows["backward"] += len(design)

    @staticmethod
    def _add(acc: tuple[Tensor, Tensor] | None, design: Tensor, resid: Tensor, weight: float) -> tuple[Tensor, Tensor]:
        gram, cross = design.T @ design * weight, design.T @ resid * weight
        return (gram, cross) if acc is None else (acc[0] + gram, acc[1] + cross)

    def _forward_rows(self, x: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor]:
        """Rows of the forward channel: the input (patches) and ``y - layer(x; W_known)``."""
        if not self.conv:
            resid = y - x @ w.T - (0.0 if b is None else b)
            return x, resid
        stride, padding = self.config["stride"], self.config["padding"]
        resid = y - F.conv2d(x, w, b, stride=stride, padding=padding)
        k = w.shape[2:]
        cols = F.unfold(x, k, padding=padding, stride=stride)  # (B, C*kh*kw, L)
        return cols.transpose(1, 2).reshape(-1, cols.shape[1]), resid.flatten(2).transpose(1, 2).reshape(-1, w.shape[0])

    def _backward_rows(self, g: Tensor, dx: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """Rows of the backward channel: the output gradient (transposed patches) and ``dx - G W_known``."""
        if not self.conv:
            return g, dx - g @ w
        stride, padding = self.config["stride"], self.config["padding"]
        resid = dx - torch.nn.grad.conv2d_input(dx.shape, w, g, stride=stride, padding=padding)
        kh, kw = w.shape[2:]
        height, width = dx.shape[2:]
        design = transposed_patches(g, (kh, kw), stride, padding, (height, width))
        return design, resid.permute(0, 2, 3, 1).reshape(-1, dx.shape[1])


@dataclass
class LayerRecovery:
    """What the attack reports for one layer masked at the end of training."""

    name: str
    kind: Literal["linear", "conv"]
    unknowns: int
    forward_openings: int
    backward_openings: int
    forward_rank: int
    forward_full_rank: int
    backward_rank: int
    backward_full_rank: int
    determined_fraction: float
    solvable: bool
    used: str
    evaluation_only: dict[str, float | None] | None = None


def _threshold(*eigs: Tensor) -> float:
    peak = max((float(e.max()) for e in eigs if e.numel()), default=0.0)
    return max(RELATIVE_RANK_TOLERANCE * peak, MIN_INFORMATION)


def _profile_bias(fwd: tuple[Tensor, Tensor] | None, n: int, out: int) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    """The forward normal equations with the bias profiled out: ``A_f`` (n x n), ``B_f`` (n x out),
    and the sums that give the bias back (``sx``, ``sr``, ``s1``)."""
    zero = torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, out, dtype=torch.float64)
    if fwd is None:
        return *zero, torch.zeros(n, dtype=torch.float64), torch.zeros(out, dtype=torch.float64), 0.0
    gram, cross = fwd
    sx, s1, sr = gram[:n, n], float(gram[n, n]), cross[n]
    a_f = gram[:n, :n] - torch.outer(sx, sx) / s1
    b_f = cross[:n] - torch.outer(sx, sr) / s1
    return a_f, b_f, sx, sr, s1


def solve_linear(rec: LayerRecorder) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """``R`` (out x in) and ``r_b`` of a Linear layer from both channels (Sylvester least squares)."""
    n_in, n_out = rec.shape
    a_f, b_f, sx, sr, s1 = _profile_bias(rec.fwd, n_in, n_out)
    a_b = rec.bwd[0] if rec.bwd is not None else torch.zeros(n_out, n_out, dtype=torch.float64)
    b_b = rec.bwd[1] if rec.bwd is not None else torch.zeros(n_out, n_in, dtype=torch.float64)
    mu, v = torch.linalg.eigh(a_f)
    lam, u = torch.linalg.eigh(a_b)
    thr = _threshold(mu, lam)
    denom = lam[:, None] + mu[None, :]
    ok = denom > thr
    rt = torch.where(ok, (u.T @ (b_b + b_f.T) @ v) / torch.where(ok, denom, 1.0), 0.0)
    r = u @ rt @ v.T
    r_b = (sr - r @ sx) / s1 if s1 > 0 else torch.zeros(n_out, dtype=torch.float64)
    info = {
        "unknowns": n_in * n_out,
        "forward_rank": int((mu > thr).sum()),
        "forward_full_rank": n_in,
        "backward_rank": int((lam > thr).sum()),
        "backward_full_rank": n_out,
        "determined_fraction": float(ok.double().mean()),
        "solvable": bool(ok.all()),
        "used": "both channels",
    }
    return r, r_b, info


def solve_conv(rec: LayerRecorder) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """``R`` (O x C x kh x kw) and ``r_b`` of a Conv2d layer from both channels (dense least squares;
    the forward channel alone above :data:`DENSE_LIMIT` unknowns)."""
    c_in, c_out, k = rec.shape
    kh, kw = (k, k) if isinstance(k, int) else k
    ckk, okk, n = c_in * kh * kw, c_out * kh * kw, c_out * c_in * kh * kw
    a_f, b_f, sx, sr, s1 = _profile_bias(rec.fwd, ckk, c_out)
    a_d = rec.bwd[0] if rec.bwd is not None else torch.zeros(okk, okk, dtype=torch.float64)
    b_d = rec.bwd[1] if rec.bwd is not None else torch.zeros(okk, c_in, dtype=torch.float64)
    mu = torch.linalg.eigvalsh(a_f)
    lam = torch.linalg.eigvalsh(a_d)
    thr = _threshold(mu, lam)
    info: dict[str, Any] = {
        "unknowns": n,
        "forward_rank": int((mu > thr).sum()),
        "forward_full_rank": ckk,
        "backward_rank": int((lam > thr).sum()),
        "backward_full_rank": okk,
    }
    if n <= DENSE_LIMIT:
        m_f = torch.kron(torch.eye(c_out, dtype=torch.float64), a_f)
        a6 = a_d.reshape(c_out, kh, kw, c_out, kh, kw).flip(1, 2, 4, 5)
        m_b = torch.einsum("abcdef,gh->agbcdhef", a6, torch.eye(c_in, dtype=torch.float64)).reshape(n, n)
        rhs = b_f.T.reshape(-1) + b_d.reshape(c_out, kh, kw, c_in).flip(1, 2).permute(0, 3, 1, 2).reshape(-1)
        eig, vec = torch.linalg.eigh(m_f + m_b)
        thr_all = _threshold(eig)
        ok = eig > thr_all
        coef = torch.where(ok, (vec.T @ rhs) / torch.where(ok, eig, 1.0), 0.0)
        r_mat = (vec @ coef).reshape(c_out, ckk)
        info.update(determined_fraction=float(ok.double().mean()), solvable=bool(ok.all()), used="both channels")
    else:
        mu_f, v_f = torch.linalg.eigh(a_f)
        ok = mu_f > thr
        inv = v_f @ torch.diag(torch.where(ok, 1.0 / torch.where(ok, mu_f, 1.0), 0.0)) @ v_f.T
        r_mat = (inv @ b_f).T
        info.update(
            determined_fraction=float(ok.double().mean()),
            solvable=bool(ok.all()),
            used=f"forward channel only ({n} unknowns > {DENSE_LIMIT} for the dense joint solve)",
        )
    r_b = (sr - r_mat @ sx) / s1 if s1 > 0 else torch.zeros(c_out, dtype=torch.float64)
    return r_mat.reshape(c_out, c_in, kh, kw), r_b, info


class RecordedVMaskAttack(ModelCompletion):
    """Base of the attacks of a passive party P_k that keeps its own record of its VMask-masked layers.

    Before training (:meth:`install`, P_k's own code) it attaches a :class:`LayerRecorder` to every
    maskable layer of P_k's VMask bottom model. After training, each layer masked at the end gets the
    weights :meth:`fill` gives it in P_k's copy of its model (in place of the paper's re-initialisation),
    and model completion runs on that model with model completion's recipe, known labels and random
    stream (``shares_draws_with``). Without VMask (or with no layer masked at the end) it is model
    completion on the trained model.
    """

    shares_draws_with = "model_completion"
    attacker_view: ClassVar[str] = "recovered"
    """What ``details.attacker_view`` says of the model the attack completes when some layer ends masked."""

    def _openings(self) -> int | None:
        """How many openings per stage and layer the recorders fold (``None``: all; ``0``: none)."""
        return 0

    def _check_every_epoch(self, every_epoch: bool) -> None:
        if every_epoch:
            raise ValueError(
                "every_epoch is not supported: the masked weights are taken from the final masking "
                "episode, at the end of training"
            )

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Attach a recorder to every maskable layer of P_k's VMask bottom model (P_k's own code, on its own layers:
        the secure layers' openings are not protocol points of the party, so there is no party hook)."""
        self.recorders_: dict[str, tuple[MaskableLayer, LayerRecorder]] = {}
        bottom = party.bottom
        vmask = [m for m in bottom.modules() if isinstance(m, VMaskBottom)] if bottom is not None else []
        for vb in vmask[:1]:
            for name, layer in vb.named_layers():
                rec = LayerRecorder(layer, max_openings=self._openings())
                layer.observation.attach(rec)
                self.recorders_[name] = (layer, rec)
        return ()

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        bottom = view.bottom()
        masked = bottom.masked if isinstance(bottom, AttackerBottom) else ()
        reports = [self._install(bottom, name) for name in masked] if isinstance(bottom, AttackerBottom) else []
        result = self.complete(view, bottom)
        result.details.update(
            attacker_view=self.attacker_view if masked else "plain",
            layers=reports,
            unsolvable=[r["name"] for r in reports if not r.get("solvable", True)],
        )
        return result

    @torch.no_grad()
    def _install(self, bottom: AttackerBottom, name: str) -> dict[str, Any]:
        """Put :meth:`fill`'s weights of masked layer ``name`` into P_k's copy ``bottom``; its report."""
        layer, rec = self.recorders_[name]
        if not rec.open:
            raise RuntimeError(f"{self.name}: no record of the masking of {name!r}")
        target = bottom.inner.get_submodule(name)
        assert isinstance(target, (nn.Linear, nn.Conv2d))
        w_hat, b_hat, report = self.fill(name, layer, rec)
        target.weight.copy_(w_hat)
        if b_hat is not None and target.bias is not None:
            target.bias.copy_(b_hat)
        self.evaluation_only(layer, rec, w_hat, b_hat, report)
        return report

    def evaluation_only(
        self, layer: MaskableLayer, rec: LayerRecorder, w_hat: Tensor, b_hat: Tensor | None, report: dict[str, Any]
    ) -> None:
        """EVALUATION ONLY, after the weights are in place: add to ``report`` what a simulation oracle says of
        them (nothing by default; no inference may depend on it)."""

    @abstractmethod
    def fill(self, name: str, layer: MaskableLayer, rec: LayerRecorder) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
        """The weight and bias P_k puts into masked layer ``name`` (``layer``, its record ``rec``), and a report."""

    @staticmethod
    def own_record(layer: MaskableLayer, rec: LayerRecorder) -> tuple[Tensor, Tensor | None]:
        """``W_known`` of ``layer`` (float64, on the CPU): P_k's weight before masking plus its own updates,
        from its record ``rec`` and its own current shares."""
        shares = layer.own_shares()
        frac = layer.shared.frac_bits if layer.shared is not None else 16
        return rec.known(shares[0], shares[1], frac)


@ATTACKS.register(summary="VMask's passive party solves its masked weights from the openings; model completion on them")
class VMaskWeightRecovery(RecordedVMaskAttack):
    """Model completion on the bottom model whose masked layers P_k recovered from what VMask's
    protocol reconstructs to it (module docstring). ``max_openings`` openings per stage and layer
    (``None``: all) of the final masking episode are used; ``fallback`` is what a layer gets in
    the directions neither channel determines (``"tracked"``: P_k's weight before masking plus its
    updates; ``"share"``: the whole layer becomes P_k's decoded share). Without VMask (or with no
    layer masked at the end) it is model completion on the trained model.
    """

    name = "vmask_weight_recovery"
    reads: ClassVar[tuple[str, ...]] = ("bottom_model", "masked_layer_openings")
    paper = (
        "adaptive attack on Tan et al., VMask (NDSS 2025), Algorithm 5 / §IV-D; then Fu et al. model "
        "completion (USENIX Security 2022)"
    )
    threat = (
        "honest-but-curious passive party P_k that keeps its weight before masking, its own updates and "
        "what the secure layers reconstruct to it, and holds a few labelled samples"
    )

    constraints: ClassVar[Mapping[str, Param]] = {
        "max_openings": Param("openings of the secure layers recorded per layer (null: all)", ge=1),
        "fallback": Param("directions no channel determines: keep W_known (tracked) or take the decoded share"),
    }

    def __init__(
        self,
        *,
        party: str = "passive_1",
        known_per_class: int = 4,
        epochs: int = 50,
        optimizer: Literal["adam", "sgd"] = "adam",
        lr: float = 1e-3,
        batch_size: int | None = 16,
        head_hidden: int = 64,
        finetune_bottom: bool = True,
        select: Selection = "last",
        val_per_class: int = 1,
        prior: Prior = "local",
        every_epoch: bool = False,
        momentum: float = 0.9,
        metric: LabelMetric = "auto",
        max_openings: int | None = 64,
        fallback: Literal["tracked", "share"] = "tracked",
    ) -> None:
        super().__init__(
            party=party,
            known_per_class=known_per_class,
            epochs=epochs,
            optimizer=optimizer,
            lr=lr,
            batch_size=batch_size,
            head_hidden=head_hidden,
            finetune_bottom=finetune_bottom,
            select=select,
            val_per_class=val_per_class,
            prior=prior,
            every_epoch=every_epoch,
            momentum=momentum,
            metric=metric,
        )
        self._check_every_epoch(every_epoch)
        self.max_openings = max_openings
        self.fallback = fallback

    def _openings(self) -> int | None:
        return self.max_openings

    def fill(self, name: str, layer: MaskableLayer, rec: LayerRecorder) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
        """The recovered weights ``W_known + R`` of the masked layer, and its :class:`LayerRecovery` (as a dict)."""
        w_known, b_known = self.own_record(layer, rec)
        r, r_b, info = (solve_conv if rec.conv else solve_linear)(rec)
        w_hat, b_hat = w_known + r, (None if b_known is None else b_known + r_b)
        used = info.pop("used")
        if not info["solvable"] and self.fallback == "share":
            shares = layer.own_shares()
            frac = layer.shared.frac_bits if layer.shared is not None else 16
            w_hat = shares[0].to("cpu", torch.float64) * 2.0**-frac
            b_hat = None if shares[1] is None else shares[1].to("cpu", torch.float64) * 2.0**-frac
            used = "P_k's decoded share (fallback: share; neither channel has full rank)"
        elif not info["solvable"]:
            used += "; directions neither channel sees keep W_known (fallback: tracked)"
        report = LayerRecovery(
            name=name,
            kind="conv" if rec.conv else "linear",
            forward_openings=rec.counts["forward"],
            backward_openings=rec.counts["backward"],
            used=used,
            **info,
        )
        if not report.solvable:
            log.info(
                "vmask_weight_recovery: layer %s not solvable (forward rank %d/%d, backward rank %d/%d)",
                name,
                report.forward_rank,
                report.forward_full_rank,
                report.backward_rank,
                report.backward_full_rank,
            )
        return w_hat, b_hat, asdict(report)

    def evaluation_only(
        self, layer: MaskableLayer, rec: LayerRecorder, w_hat: Tensor, b_hat: Tensor | None, report: dict[str, Any]
    ) -> None:
        """EVALUATION ONLY: the recovered layer's errors against the true effective weights
        (:func:`_evaluation_only_errors`), in ``report["evaluation_only"]``."""
        w_known, b_known = self.own_record(layer, rec)
        report["evaluation_only"] = _evaluation_only_errors(layer, rec, w_hat, b_hat, w_known, b_known)


@ATTACKS.register(
    summary="VMask's passive party runs model completion on its own record of its masked weights (no solve)"
)
class VMaskOwnRecord(RecordedVMaskAttack):
    """Model completion on the bottom model whose masked layers P_k fills with its own record:
    ``W_known``, its weight before masking plus the updates it applied to its share since (it computes
    them itself from its inputs and the reconstructed gradients). No opening is folded and nothing is
    solved; the only thing missing from the effective weight is the active party's fixed
    ``N(0, sigma^2)`` noise ``R`` (Algorithm 1), which VMask's §IV-D says keeps P_k from tracking its
    weights. Reads no evaluation oracle. Same recipe, known labels and random stream as
    ``model_completion`` (``shares_draws_with``), so its value compares directly with the paper's
    attacker (``model_completion``) and with ``vmask_weight_recovery`` (the exact solve).
    """

    name = "vmask_own_record"
    reads: ClassVar[tuple[str, ...]] = ("bottom_model", "own_masked_weights")
    attacker_view: ClassVar[str] = "own_record"
    paper = (
        "adaptive attack on Tan et al., VMask (NDSS 2025), Algorithm 1 / §IV-D (P_k's own record, no "
        "solve); then Fu et al. model completion (USENIX Security 2022)"
    )
    threat = (
        "honest-but-curious passive party P_k that keeps its weight before masking and its own updates, and "
        "holds a few labelled samples"
    )

    def __init__(
        self,
        *,
        party: str = "passive_1",
        known_per_class: int = 4,
        epochs: int = 50,
        optimizer: Literal["adam", "sgd"] = "adam",
        lr: float = 1e-3,
        batch_size: int | None = 16,
        head_hidden: int = 64,
        finetune_bottom: bool = True,
        select: Selection = "last",
        val_per_class: int = 1,
        prior: Prior = "local",
        every_epoch: bool = False,
        momentum: float = 0.9,
        metric: LabelMetric = "auto",
    ) -> None:
        super().__init__(
            party=party,
            known_per_class=known_per_class,
            epochs=epochs,
            optimizer=optimizer,
            lr=lr,
            batch_size=batch_size,
            head_hidden=head_hidden,
            finetune_bottom=finetune_bottom,
            select=select,
            val_per_class=val_per_class,
            prior=prior,
            every_epoch=every_epoch,
            momentum=momentum,
            metric=metric,
        )
        self._check_every_epoch(every_epoch)

    def fill(self, name: str, layer: MaskableLayer, rec: LayerRecorder) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
        """``W_known`` of the masked layer (:meth:`RecordedVMaskAttack.own_record`) and what was used."""
        w_known, b_known = self.own_record(layer, rec)
        return (
            w_known,
            b_known,
            {
                "name": name,
                "kind": "conv" if rec.conv else "linear",
                "used": "P_k's own record: its weight before masking plus its own updates (no solve)",
            },
        )


def _evaluation_only_errors(
    layer: MaskableLayer,
    rec: LayerRecorder,
    w_hat: Tensor,
    b_hat: Tensor | None,
    w_known: Tensor,
    b_known: Tensor | None,
) -> dict[str, float | None]:
    """EVALUATION ONLY, after the recovery: errors against the true effective weights (a simulation
    oracle neither party has) of the recovered layer and, for scale, of ``W_known`` alone.

    ``relative_error``: of the weights and bias (Frobenius); ``output_relative_error``: of the layer's
    outputs on the inputs P_k recorded (directions of the weight that no recorded input excites, e.g.
    a pixel that is always zero, do not count there).
    """
    w_true, b_true = layer.evaluation_only_effective_weight()
    out = w_true.shape[0]

    def aug(w: Tensor, b: Tensor | None) -> Tensor:
        col = (b if b is not None else torch.zeros(out, dtype=torch.float64)).to("cpu", torch.float64).reshape(out, 1)
        return torch.cat([w.to("cpu", torch.float64).reshape(out, -1), col], 1)

    truth = aug(w_true, b_true)
    err, known = aug(w_hat, b_hat) - truth, aug(w_known, b_known) - truth
    norm = float(truth.norm()) or 1.0
    output_error = None
    if rec.fwd is not None:
        gram = rec.fwd[0]
        output_error = math.sqrt(
            max(float(torch.trace(err @ gram @ err.T)), 0.0) / max(float(torch.trace(truth @ gram @ truth.T)), 1e-300)
        )
    return {
        "relative_error": float(err.norm()) / norm,
        "max_abs_error": float(err.abs().max()),
        "output_relative_error": output_error,
        "relative_error_known_only": float(known.norm()) / norm,
    }
