"""Where a run's tensors live: the ``train.device`` choice and its resolution.

``train.device`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``. ``auto`` is ``$VFLBENCH_DEVICE`` when that
is set (one of the other choices), else ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

What runs where (docs/decisions/devices.md, "Devices"): every model, activation, gradient, label and feature
tensor of a run, and VMask's ring arithmetic, live on the chosen device; row ids (batch orders, auxiliary
sets) stay on the CPU, as does every ``torch.Generator``: random tensors are drawn on the CPU and then moved
(``.to(x.device)``; :func:`vflbench.rng.fill_` for initialisers), so draws and initial weights are
bit-identical on every device. Paillier's big-integer arithmetic runs on the CPU (its layers move tensors
there and back).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from vflbench.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
"""The values ``train.device`` accepts (``N`` a GPU index)."""

DEVICE_ENV = "VFLBENCH_DEVICE"
"""The environment variable ``auto`` resolves to when set (``cpu``, ``cuda`` or ``cuda:N``)."""

_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(spec: str) -> str:
    """``spec`` if it is a valid ``train.device`` value, else a :class:`ValueError` naming the valid ones."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(f"must be one of {', '.join(DEVICE_CHOICES)} (N a GPU index), got {spec!r}")
    return spec


def resolve_device(spec: str) -> torch.device:
    """The device ``spec`` names on this machine (a CUDA device with its index, as tensors report theirs); a
    one-line :class:`ConfigError` when it is not here."""
    import torch  # here, not at the top: the config imports this module, and the CLI's quick commands no torch

    check_device(spec)
    where = "train.device"
    if spec == "auto":
        env = os.environ.get(DEVICE_ENV, "").strip()
        if env:
            if env == "auto" or not _SPEC.match(env):
                raise ConfigError(
                    f"${DEVICE_ENV} must be cpu, cuda or cuda:N when set (it is what train.device "
                    f"'auto' picks), got {env!r}"
                )
            spec, where = env, f"${DEVICE_ENV} (train.device 'auto')"
        elif torch.cuda.is_available():
            spec = "cuda"
        else:
            return torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{where} {spec!r} asks for a CUDA GPU, but torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}); use cpu or auto"
        )
    device = torch.device(spec)
    count = torch.cuda.device_count()
    if device.index is None:  # indexed, as a tensor's device is (cuda:0 == cuda is False in torch)
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= count:
        raise ConfigError(
            f"{where} {spec!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1}); "
            "use one of them, cuda or auto"
        )
    return device


def device_name(device: torch.device) -> str:
    """``cpu``, or the CUDA device with its model name (for env.json and logs)."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)
