"""Reconstruction metrics for feature attacks: MSE, SSIM and embedding distances.

SSIM follows Wang, Bovik, Sheikh and Simoncelli, "Image Quality Assessment: From Error
Visibility to Structural Similarity" (IEEE TIP 2004), as in their reference implementation
``ssim_index.m``: an 11x11 circular-symmetric Gaussian window with sigma 1.5 (normalised to
sum 1), ``C1 = (K1 L)^2`` and ``C2 = (K2 L)^2`` with ``K1 = 0.01``, ``K2 = 0.03`` and ``L`` the
data range; local means, variances and the covariance are window-weighted (the biased
estimates, divided by the window's weight sum 1), the SSIM map is computed where the window
fits entirely inside the image ("valid" filtering) and its mean is the image's SSIM. Channels
are filtered separately and their SSIMs averaged.

Small images: when a side is shorter than the window, the window shrinks to the largest odd
size that fits (sigma unchanged). Wang et al. define no value there; this is our choice, so
that SSIM is defined for e.g. the 8x4 strips of scikit-learn's digits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

K1, K2 = 0.01, 0.03


def gaussian_window(size: int = 11, sigma: float = 1.5) -> Tensor:
    """The normalised (sum 1) 2-D Gaussian window of odd side ``size`` (float64)."""
    if size < 1 or size % 2 == 0:
        raise ValueError(f"window size must be a positive odd number, got {size}")
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    w = torch.outer(g, g)
    return w / w.sum()


def _as_nchw(x: Tensor) -> Tensor:
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    raise ValueError(f"SSIM needs images of shape (H, W), (N, H, W) or (N, C, H, W), got {tuple(x.shape)}")


def ssim(x: Tensor, y: Tensor, *, data_range: float = 1.0, window_size: int = 11, sigma: float = 1.5) -> Tensor:
    """SSIM of each image pair (Wang et al. 2004): a tensor with one value per image.

    ``x`` and ``y`` have the same shape, (H, W), (N, H, W) or (N, C, H, W); the result has shape
    (N,) (a 0-d tensor for a single (H, W) image).
    """
    if x.shape != y.shape:
        raise ValueError(f"SSIM needs images of the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    single = x.dim() == 2
    a, b = _as_nchw(x).double(), _as_nchw(y).double()
    _, c, h, w = a.shape
    size = min(window_size, h, w)
    size -= 1 - size % 2
    win = gaussian_window(size, sigma).to(a.device)[None, None].expand(c, 1, size, size)

    def filt(z: Tensor) -> Tensor:
        return F.conv2d(z, win, groups=c)

    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    mu_a, mu_b = filt(a), filt(b)
    var_a = filt(a * a) - mu_a**2
    var_b = filt(b * b) - mu_b**2
    cov = filt(a * b) - mu_a * mu_b
    smap = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    out = smap.mean(dim=(1, 2, 3)).to(x.dtype if x.is_floating_point() else torch.float64)
    return out[0] if single else out


def mse_per_row(x: Tensor, y: Tensor) -> Tensor:
    """Mean squared error of each row (over all of its features)."""
    return ((x.float() - y.float()) ** 2).flatten(1).mean(1)


def cosine_distance(x: Tensor, y: Tensor) -> Tensor:
    """``1 - cos(x_i, y_i)`` for each row pair (rows flattened; DMAVFL's "Emb Cos")."""
    return 1.0 - F.cosine_similarity(x.flatten(1).float(), y.flatten(1).float(), dim=1, eps=1e-12)
