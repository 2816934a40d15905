"""Bottom models for image strips: vgg13, resnet18 (CIFAR variants), conv2 (Kang et al.) and conv_map
(URVFL's pixel-aligned embedding).

Every model takes one party's strip of shape (C, H, W), e.g. (3, 32, 16) for half a CIFAR
image, and registers its Conv/Linear layers in the order the forward pass uses them, so that
:func:`vflbench.models.base.linear_layers` numbers layers as VMask does (input side first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from vflbench.models.registry import CHANNELS, MODELS, MULTIPLIER

# Simonyan & Zisserman (2015), Table 1, configuration B; "M" is a 2x2 max-pool.
VGG13_CONFIG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
RESNET18_BLOCKS: tuple[int, ...] = (2, 2, 2, 2)
RESNET18_CHANNELS: tuple[int, ...] = (64, 128, 256, 512)


def _image_shape(input_shape: Sequence[int], name: str) -> tuple[int, int, int]:
    """Return (C, H, W) or raise ValueError for a slice that is not an image strip."""
    if len(input_shape) != 3:
        raise ValueError(f"{name} needs an image slice of shape (C, H, W), got {tuple(input_shape)}")
    c, h, w = (int(s) for s in input_shape)
    if min(c, h, w) < 1:
        raise ValueError(f"{name} needs a non-empty image strip, got {tuple(input_shape)}")
    return c, h, w


def _scaled(channels: int, width_multiplier: float) -> int:
    """Channel count scaled by ``width_multiplier`` (at least 1)."""
    return max(1, int(round(channels * width_multiplier)))


class VGG13(nn.Module):
    """VGG-13 (Simonyan & Zisserman, ICLR 2015, config B) with BatchNorm, CIFAR style.

    Ten 3x3 convolutions (padding 1), each followed by BatchNorm and ReLU, with 2x2 max-pools
    after every pair; then adaptive average pooling to 1x1 and one Linear(512, out_dim), the
    light head used for CIFAR by VMask (Tan et al., NDSS 2025). A party's strip is narrower than
    the full image, so a max-pool halves only the sides that are at least 2 pixels long (a
    1-pixel side is pooled with kernel 1) and is left out when both sides are 1 pixel: any
    strip of at least 1x1 pixels fits. ``linear_layers`` lists the 10 convolutions, then the
    Linear layer.
    """

    def __init__(self, input_shape: Sequence[int], out_dim: int, width_multiplier: float = 1.0) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, "vgg13")
        layers: list[nn.Module] = []
        for item in VGG13_CONFIG:
            if item == "M":
                kh, kw = (2 if height >= 2 else 1), (2 if width >= 2 else 1)
                if kh == kw == 1:
                    continue  # both sides are 1 pixel: pooling would empty the map
                layers.append(nn.MaxPool2d((kh, kw)))
                height, width = height // kh, width // kw
            else:
                out = _scaled(int(item), width_multiplier)
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, C, H, W) strips to (N, out_dim)."""
        return self.classifier(self.pool(self.features(x)).flatten(1))


@MODELS.register(
    "vgg13",
    constraints={"width_multiplier": MULTIPLIER},
    summary="VGG-13 with BatchNorm, CIFAR variant (VMask's CIFAR model)",
)
def vgg13(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, width_multiplier: float = 1.0
) -> nn.Module:
    """VGG-13 (config B) for an image strip (C, H, W); ``width_multiplier`` scales channels."""
    return VGG13(input_shape, out_dim, width_multiplier)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + BN, identity or 1x1 conv + BN shortcut (He et al. 2016).

    Modules are registered as conv1, bn1, conv2, bn2, shortcut, so a downsampling block's
    shortcut convolution is listed after the block's conv2 (it reads the block's input, in
    parallel with conv1 and conv2).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al., CVPR 2016), CIFAR variant as used by VMask and Kang et al.

    A 3x3 stride-1 convolution stem without max-pool, four stages of two BasicBlocks with
    64, 128, 256 and 512 channels (stages 2-4 start with stride 2 and a 1x1 conv + BN
    shortcut), adaptive average pooling to 1x1 and Linear(512, out_dim). Stride-2 3x3
    convolutions with padding 1 map a 1-pixel side to 1 pixel, so any strip fits.
    ``linear_layers`` lists 21 layers: the stem, then per block conv1, conv2 and (stages 2-4,
    first block) the shortcut conv, then the Linear layer.
    """

    def __init__(self, input_shape: Sequence[int], out_dim: int, width_multiplier: float = 1.0) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "resnet18")
        stem = _scaled(RESNET18_CHANNELS[0], width_multiplier)
        self.stem = nn.Sequential(nn.Conv2d(channels, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem), nn.ReLU())
        blocks: list[nn.Module] = []
        width = stem
        stages = zip(RESNET18_BLOCKS, RESNET18_CHANNELS, strict=True)
        for stage, (n_blocks, base) in enumerate(stages):
            out = _scaled(base, width_multiplier)
            for i in range(n_blocks):
                blocks.append(BasicBlock(width, out, stride=2 if stage > 0 and i == 0 else 1))
                width = out
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, C, H, W) strips to (N, out_dim)."""
        return self.classifier(self.pool(self.layers(self.stem(x))).flatten(1))


@MODELS.register(
    "resnet18",
    constraints={"width_multiplier": MULTIPLIER},
    summary="ResNet-18, CIFAR variant (VMask's and Kang et al.'s CIFAR model)",
)
def resnet18(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, width_multiplier: float = 1.0
) -> nn.Module:
    """ResNet-18 for an image strip of shape (C, H, W); ``width_multiplier`` scales channels."""
    return ResNet18(input_shape, out_dim, width_multiplier)


class Conv2(nn.Module):
    """Two-convolution bottom model for FMNIST (Kang et al., "A Framework for Evaluating
    Privacy-Utility Trade-off in Vertical Federated Learning", Table 9: "2 Conv").

    The paper names only two convolution layers; channels, kernels and the projection are
    our choice: conv(C->32, 5x5, pad 2)-ReLU-maxpool 2 -> conv(32->64, 5x5, pad 2)-ReLU-
    maxpool 2 -> flatten -> Linear(out_dim). A 1x28x14 strip gives a 64x7x3 map; strips
    need at least 4x4 pixels.
    """

    def __init__(self, input_shape: Sequence[int], out_dim: int, channels: Sequence[int] = (32, 64)) -> None:
        super().__init__()
        in_channels, height, width = _image_shape(input_shape, "conv2")
        if len(channels) != 2:
            raise ValueError(f"conv2: channels must be two counts, got {tuple(channels)}")
        c1, c2 = (int(c) for c in channels)
        h, w = height // 4, width // 4
        if h < 1 or w < 1:
            raise ValueError(f"conv2 needs strips of at least 4x4 pixels, got {height}x{width}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * h * w, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, C, H, W) strips to (N, out_dim)."""
        return self.classifier(self.features(x))


@MODELS.register(
    "conv2", constraints={"channels": CHANNELS}, summary="2 conv layers + projection (Kang et al.'s FMNIST model)"
)
def conv2(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, channels: Sequence[int] = (32, 64)
) -> nn.Module:
    """Two 5x5 conv + ReLU + max-pool stages and a Linear projection for a strip (C, H, W)."""
    return Conv2(input_shape, out_dim, channels)


class ConvMap(nn.Module):
    """A pixel-aligned convolutional embedding, URVFL's ``ClientNet`` in spirit (duanyiyao/URVFL,
    ``cifar10/models.py``: conv3x3 + BN + ReLU and residual blocks, no pooling and no Linear layer).

    One 3x3 convolution (padding 1, stride 1) + BatchNorm + ReLU per entry of ``channels``; the
    output is the last ``channels[-1] x H x W`` map of the strip, flattened in (C, H, W) order, so
    each embedding value belongs to one pixel position of the strip (over-complete: a 1x28x14
    MNIST half with 16 channels gives 6,272 values). ``out_dim`` must equal ``channels[-1] * H * W``;
    ``map_shape`` is the (C, H, W) map a decoder or a CNN discriminator reads the embedding as.
    """

    def __init__(self, input_shape: Sequence[int], out_dim: int, channels: Sequence[int] = (16, 16)) -> None:
        super().__init__()
        in_channels, height, width = _image_shape(input_shape, "conv_map")
        if len(channels) < 1:
            raise ValueError(f"conv_map: channels must be one or more counts, got {tuple(channels)}")
        last = int(channels[-1])
        if out_dim != last * height * width:
            raise ValueError(
                f"conv_map outputs channels[-1] x H x W = {last} x {height} x {width} = "
                f"{last * height * width} values per row, so model.embed_dim must be "
                f"{last * height * width}, got {out_dim}"
            )
        layers: list[nn.Module] = []
        c = in_channels
        for ch in (int(x) for x in channels):
            layers += [nn.Conv2d(c, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU()]
            c = ch
        self.features = nn.Sequential(*layers)
        self.map_shape = (last, height, width)

    def forward(self, x: Tensor) -> Tensor:
        """Map (N, C, H, W) strips to (N, channels[-1] * H * W)."""
        return self.features(x).flatten(1)


@MODELS.register(
    "conv_map",
    constraints={"channels": CHANNELS},
    summary="3x3 conv + BN + ReLU layers, no pooling/Linear: a pixel-aligned map (URVFL's ClientNet)",
)
def conv_map(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, channels: Sequence[int] = (16, 16)
) -> nn.Module:
    """Pixel-aligned embedding of a strip (C, H, W): ``out_dim`` must be ``channels[-1] * H * W``."""
    return ConvMap(input_shape, out_dim, channels)
