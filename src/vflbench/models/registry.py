"""Model registries.

Bottom models: ``factory(*, input_shape, out_dim, meta, **options) -> nn.Module`` where
``input_shape`` is one sample of the party's slice and ``meta`` the slice's metadata
(categorical columns for ``emb_mlp``, vocabulary size for ``text_cnn``).
Top models: ``factory(*, in_dim, num_classes, **options) -> nn.Module``.
"""

from __future__ import annotations

from torch import nn

from vflbench.registry import MAX_WIDTH, Param, Registry

MODELS: Registry[nn.Module] = Registry("model")
TOP_MODELS: Registry[nn.Module] = Registry("top model")
#: Sizes of a layer: at least one unit, at most :data:`~vflbench.registry.MAX_WIDTH` (a typo such as 100000000000
#: fails with a message, not in the memory allocator).
CHANNELS = Param("channels per convolution", ge=1, le=MAX_WIDTH)
EMBEDDING = Param("width of each token's (or category's) embedding", ge=1, le=MAX_WIDTH)
MULTIPLIER = Param("scales every layer's channels", gt=0)
