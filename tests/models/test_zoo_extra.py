"""Tests for the vision (vgg13, resnet18, conv2) and embedding (emb_mlp, text_cnn) bottom models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from vflbench.data.base import PartySlice
from vflbench.errors import ConfigError
from vflbench.models import MODELS, build_bottom, linear_layers

OUT_DIM = 4
N = 8
SMALL = {"width_multiplier": 0.125}


def image_part(shape: tuple[int, ...] = (3, 32, 16), n: int = N) -> PartySlice:
    """A random image strip slice."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand((n, *shape), generator=g)
    return PartySlice(x, x.clone(), "image")


def tabular_part(
    n_features: int = 6, categorical: tuple[int, ...] = (1, 4), cardinalities: tuple[int, ...] = (5, 3), n: int = N
) -> PartySlice:
    """A random tabular slice whose categorical columns hold integer codes stored as floats."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn((n, n_features), generator=g)
    for col, card in zip(categorical, cardinalities, strict=True):
        x[:, col] = torch.randint(0, card, (n,), generator=g).float()
    meta = {"categorical": categorical, "cardinalities": cardinalities} if categorical else {}
    return PartySlice(x, x.clone(), "tabular", tuple(range(n_features)), meta)


def text_part(length: int = 12, vocab: int = 50, n: int = N, meta: dict[str, Any] | None = None) -> PartySlice:
    """A random token-id slice with some padding (id 0) at the end of each row."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(1, vocab, (n, length), generator=g)
    x[:, -2:] = 0
    return PartySlice(x, x.clone(), "text", meta={"vocab_size": vocab} if meta is None else meta)


@dataclass
class Case:
    """A model under test, its slice, options and expected layer facts."""

    name: str
    part: Callable[[], PartySlice]
    options: dict[str, Any] = field(default_factory=dict)
    n_layers: int = 0
    first_in: int = 0  # in_channels / in_features of the layer that consumes the input


CASES = [
    Case("vgg13", image_part, SMALL, 11, 3),
    Case("resnet18", image_part, SMALL, 21, 3),
    Case("conv2", lambda: image_part((1, 28, 14)), {}, 3, 1),
    Case("emb_mlp", tabular_part, {"embedding_dim": 3, "hidden": 16}, 2, 4 + 2 * 3),
    Case("text_cnn", text_part, {"embedding_dim": 8, "n_filters": 5}, 4, 8),
]
IDS = [c.name for c in CASES]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run these tiny models on one CPU thread: thread start-up dominates their cost."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gen(seed: int = 0) -> torch.Generator:
    """A generator seeded by ``seed``."""
    return torch.Generator().manual_seed(seed)


def build(case: Case, seed: int = 0) -> nn.Module:
    """Build ``case``'s model with a generator seeded by ``seed``."""
    return build_bottom(case.name, case.part(), OUT_DIM, gen(seed), **case.options)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_output_shape(case: Case) -> None:
    model = build(case).eval()
    part = case.part()
    with torch.no_grad():
        out = model(part.x_train)
    assert out.shape == (N, OUT_DIM)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_same_seed_same_parameters(case: Case) -> None:
    a, b, c = build(case, 0), build(case, 0), build(case, 1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear_layers_in_forward_order(case: Case) -> None:
    model = build(case).eval()
    layers = linear_layers(model)
    assert len(layers) == case.n_layers
    first = layers[0]
    assert getattr(first, "in_channels", getattr(first, "in_features", None)) == case.first_in
    assert isinstance(layers[-1], nn.Linear) and layers[-1].out_features == OUT_DIM
    calls: list[nn.Module] = []
    hooks = [m.register_forward_hook(lambda m, *_: calls.append(m)) for m in layers]
    with torch.no_grad():
        model(case.part().x_train)
    for h in hooks:
        h.remove()
    assert calls == layers  # registration order is the order the forward pass uses them


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_sgd_step_reduces_loss(case: Case) -> None:
    model = build(case).train()
    part = case.part()
    y = torch.arange(N) % OUT_DIM
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = nn.functional.cross_entropy(model(part.x_train), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = nn.functional.cross_entropy(model(part.x_train), y)
    assert after.item() < loss.item()


DEFAULT_COUNTS = [("vgg13", 11), ("resnet18", 21), ("conv2", 3), ("emb_mlp", 2), ("text_cnn", 4)]


@pytest.mark.parametrize(("name", "expected"), DEFAULT_COUNTS)
def test_default_layer_counts(name: str, expected: int) -> None:
    shapes = {"vgg13": (3, 32, 16), "resnet18": (3, 32, 16), "conv2": (1, 28, 14), "emb_mlp": (6,), "text_cnn": (12,)}
    meta = {"emb_mlp": {"categorical": (1,), "cardinalities": (4,)}, "text_cnn": {"vocab_size": 10}}
    model = MODELS.create(name, input_shape=shapes[name], out_dim=10, meta=meta.get(name))
    assert len(linear_layers(model)) == expected


# --- vision specifics -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vgg13", "resnet18"])
def test_cifar_models_default_head_is_512_wide(name: str) -> None:
    model = MODELS.create(name, input_shape=(3, 32, 16), out_dim=10)
    head = linear_layers(model)[-1]
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (512, 10)


@pytest.mark.parametrize("name", ["vgg13", "resnet18"])
@pytest.mark.parametrize("shape", [(3, 1, 1), (3, 32, 1), (1, 5, 3)])
def test_cifar_models_fit_any_strip(name: str, shape: tuple[int, ...]) -> None:
    model = build_bottom(name, image_part(shape, n=2), OUT_DIM, gen(), **SMALL)
    assert model.eval()(torch.rand(2, *shape)).shape == (2, OUT_DIM)


def test_vgg13_pools_only_sides_that_can_halve() -> None:
    model = MODELS.create("vgg13", input_shape=(3, 32, 16), out_dim=OUT_DIM, **SMALL)
    pools = [m.kernel_size for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert pools == [(2, 2)] * 4 + [(2, 1)]  # width 16 -> 1 after four pools; height 2 -> 1
    tiny = MODELS.create("vgg13", input_shape=(3, 1, 1), out_dim=OUT_DIM, **SMALL)
    assert not any(isinstance(m, nn.MaxPool2d) for m in tiny.modules())


def test_resnet18_shortcut_convs_follow_their_blocks_conv2() -> None:
    model = MODELS.create("resnet18", input_shape=(3, 32, 16), out_dim=OUT_DIM, **SMALL)
    layers = linear_layers(model)
    convs = [isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in layers]
    one_by_one = [i for i, is_1x1 in enumerate(convs) if is_1x1]
    assert one_by_one == [7, 12, 17]
    assert all(layers[i].stride == (2, 2) and layers[i - 2].stride == (2, 2) for i in one_by_one)


@pytest.mark.parametrize("name", ["vgg13", "resnet18", "conv2"])
def test_image_models_reject_tabular_slices(name: str) -> None:
    with pytest.raises(ConfigError, match=r"image slice of shape \(C, H, W\)"):
        build_bottom(name, tabular_part(), OUT_DIM, gen())


def test_conv2_rejects_too_narrow_strip() -> None:
    with pytest.raises(ConfigError, match="at least 4x4 pixels, got 28x3"):
        build_bottom("conv2", image_part((1, 28, 3)), OUT_DIM, gen())


def test_width_multiplier_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="'width_multiplier' = 0 is not valid; it must be > 0"):
        build_bottom("vgg13", image_part(), OUT_DIM, gen(), width_multiplier=0)


# --- emb_mlp specifics ------------------------------------------------------------------------


def test_emb_mlp_embeds_categorical_codes() -> None:
    part = tabular_part()
    model = build_bottom("emb_mlp", part, OUT_DIM, gen()).eval()
    assert [e.num_embeddings for e in model.embeddings] == [5, 3]
    x = part.x_train.clone()
    x2 = x.clone()
    x2[:, 1] = (x2[:, 1] + 1) % 5
    with torch.no_grad():
        assert not torch.allclose(model(x), model(x2))


def test_emb_mlp_without_categorical_is_an_mlp() -> None:
    model = build_bottom("emb_mlp", tabular_part(categorical=(), cardinalities=()), OUT_DIM, gen())
    layers = linear_layers(model)
    assert [(m.in_features, m.out_features) for m in layers] == [(6, 64), (64, OUT_DIM)]
    assert len(model.embeddings) == 0


def test_emb_mlp_rejects_inconsistent_meta() -> None:
    part = tabular_part()
    bad = PartySlice(part.x_train, part.x_test, "tabular", meta={"categorical": (1, 4), "cardinalities": (5,)})
    with pytest.raises(ConfigError, match="2 categorical columns but 1 cardinalities"):
        build_bottom("emb_mlp", bad, OUT_DIM, gen())
    out_of_range = PartySlice(part.x_train, part.x_test, "tabular", meta={"categorical": (9,), "cardinalities": (5,)})
    with pytest.raises(ConfigError, match="distinct column indices"):
        build_bottom("emb_mlp", out_of_range, OUT_DIM, gen())


# --- text_cnn specifics -----------------------------------------------------------------------


def test_text_cnn_needs_vocab_size() -> None:
    with pytest.raises(ConfigError, match=r"meta\['vocab_size'\]"):
        build_bottom("text_cnn", text_part(meta={}), OUT_DIM, gen())


def test_text_cnn_skips_wide_filters_and_rejects_too_short_text() -> None:
    model = build_bottom("text_cnn", text_part(length=4), OUT_DIM, gen())
    assert [c.kernel_size for c in model.convs] == [(3,), (4,)]
    with pytest.raises(ConfigError, match="at least 3 tokens"):
        build_bottom("text_cnn", text_part(length=2), OUT_DIM, gen())


def test_text_cnn_ignores_padding_and_is_deterministic_by_default() -> None:
    part = text_part()
    model = build_bottom("text_cnn", part, OUT_DIM, gen())
    with torch.no_grad():
        train_out = model.train()(part.x_train)
        eval_out = model.eval()(part.x_train)
    assert torch.equal(train_out, eval_out)  # dropout defaults to 0
    assert torch.count_nonzero(model.embedding.weight[0]) == 0  # padding row starts at zero
    model(part.x_train).sum().backward()
    assert torch.count_nonzero(model.embedding.weight.grad[0]) == 0  # and is never trained
