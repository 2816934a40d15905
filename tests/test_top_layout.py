"""The top model's input layout is computed once (``lay_out_top``): the active party aggregates by it and its
defenses (Paillier HE, MID) read it from their context instead of inferring it."""

from __future__ import annotations

import pytest
import torch
from conftest import minimal
from torch import nn

from vflbench.defenses import create_defense
from vflbench.defenses.bottlenecks import MutualInformationDefense
from vflbench.errors import CompatibilityError
from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.protocol import BindContext, Defense, InMemoryTransport, TopLayout, TopPart
from vflbench.rng import generator


@pytest.mark.parametrize("how", ["concat", "sum"])
def test_the_layout_is_what_the_active_party_aggregates_and_what_its_defenses_see(how):
    cfg = build_config(
        minimal(
            data={"parties": 3, "train_size": 64, "test_size": 16},
            model={"embed_dim": 4},
            train={"aggregation": how},
            defenses=[{"name": "dcor"}],
        )
    )
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1", "passive_2"]))
    layout = fed.active.layout
    starts = [0, 4, 8] if how == "concat" else [0, 0, 0]
    assert layout == TopLayout(
        tuple(TopPart(p, s, 4) for p, s in zip(["active", "passive_1", "passive_2"], starts, strict=True)), how
    )
    [dcor] = fed.active.defenses
    assert dcor.context_.top_layout is layout  # the one object, not a copy or a second derivation

    seen: dict[str, torch.Tensor] = {}
    for name, bottom in [("active", fed.active.bottom), *((p.name, p.bottom) for p in fed.passives)]:
        bottom.register_forward_hook(lambda m, i, out, name=name: seen.setdefault(name, out.detach()))
    fed.active.top.register_forward_pre_hook(lambda m, args: seen.setdefault("top", args[0].detach()))
    fed.outputs("test")
    z = seen["top"]
    assert z.shape[1] == layout.width == (12 if how == "concat" else 4)
    if how == "concat":
        for part in layout.parts:
            assert torch.equal(z[:, part.start : part.end], seen[part.party])
    else:
        assert torch.equal(z, seen["active"] + seen["passive_1"] + seen["passive_2"])


def _bound(name: str, **params: object) -> Defense:
    d = create_defense(name, **params).for_role("active")  # the active party's instance (its half, if it has halves)
    d.bind(
        BindContext(
            "active",
            "vhnn",
            2,
            3,
            generator(0, "a"),
            generator(0, "b"),
            link=InMemoryTransport().endpoint("active"),
            aggregation="concat",
        )
    )
    return d


def test_mid_slices_the_top_input_by_the_given_layout_and_infers_nothing():
    mid = _bound("mid")
    assert type(mid).wrap_bottom is Defense.wrap_bottom  # it no longer records the bottoms' widths
    with pytest.raises(CompatibilityError, match="top_layout"):
        mid.wrap_top(nn.Sequential(nn.Linear(12, 2)))
    mid.bind_top(TopLayout.of([("active", 3), ("passive_1", 5), ("passive_2", 4)], "concat"))
    top = mid.wrap_top(nn.Sequential(nn.Linear(12, 2)))
    assert isinstance(mid, MutualInformationDefense)
    assert top.bounds == [(0, 3), (3, 8), (8, 12)] and top.which == [False, True, True]
    assert [m.enlarge.in_features for m in top.mids] == [5, 4]
    other = _bound("mid")
    other.bind_top(TopLayout.of([("active", 3), ("passive_1", 5)], "concat"))
    with pytest.raises(CompatibilityError, match="cannot split the top model's input of width 12"):
        other.wrap_top(nn.Sequential(nn.Linear(12, 2)))


def test_paillier_adds_the_shares_where_the_given_layout_says_without_any_key_request():
    pytest.importorskip("phe", reason="paillier_he needs the optional 'he' extra")
    he = _bound("paillier_he", key_bits=512)  # test-only key size
    with pytest.raises(CompatibilityError, match="top_layout"):
        he.wrap_top(nn.Sequential(nn.Linear(12, 2)))
    he.bind_top(TopLayout.of([("active", 4), ("passive_1", 4), ("passive_2", 4)], "sum"))
    top = he.wrap_top(nn.Sequential(nn.Linear(4, 2)))  # a width that concat would not give: nothing is inferred
    assert top.layout == [("passive_1", 0, 0), ("passive_2", 0, 0)] and top.how == "sum" and top.parts == 3
    he = _bound("paillier_he", key_bits=512)
    he.bind_top(TopLayout.of([("passive_1", 5), ("passive_2", 3)], "concat"))
    top = he.wrap_top(nn.Sequential(nn.Linear(8, 2)))
    assert top.layout == [("passive_1", 0, 5), ("passive_2", 5, 8)] and top.how == "concat" and top.parts == 2


def test_sum_and_mean_layouts_refuse_embeddings_of_different_widths():
    with pytest.raises(ValueError, match="mean aggregation needs embeddings of one width"):
        TopLayout.of([("active", 4), ("passive_1", 5)], "mean")
