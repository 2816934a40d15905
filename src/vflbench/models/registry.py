"""Model registries.

Bottom models: ``factory(*, input_shape, out_dim, meta, **options) -> nn.Module`` where
``input_shape`` is one sample of the party's slice and ``meta`` the slice's metadata
(categorical columns for ``emb_mlp``, vocabulary size for ``text_cnn``).
Top models: ``factory(*, in_dim, num_classes, **options) -> nn.Module``.
"""

from __future__ import annotations

from torch import nn

from vflbench.registry import Registry

MODELS: Registry[nn.Module] = Registry("model")
TOP_MODELS: Registry[nn.Module] = Registry("top model")
