"""No party holds another party's model object (issue 29): the active party's defenses look at a passive party's
bottom only as an architecture built from its slice's layout, and a passive party's defenses hold nothing of the
active party's models. Walked from each party's own objects, stopping at its endpoint (in one process the
transport joins every party; across processes it is a network link)."""

from __future__ import annotations

import types

import torch
from conftest import minimal
from torch import nn

from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import DefensePlan, build_federation, load_vertical_data, plan_defenses
from vflbench.protocol import Defense, Endpoint

DEFENSES = [{"name": "vmask", "mc_epochs": 1}, {"name": "mid"}]


def reachable_modules(*roots: object) -> set[int]:
    """The ids of every module and parameter reachable from ``roots`` through attributes, containers and closures,
    not through an :class:`Endpoint` (the party's connection to the others)."""
    seen: set[int] = set()
    found: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if (
            id(obj) in seen
            or obj is None
            or isinstance(
                obj,
                (
                    str,
                    bytes,
                    int,
                    float,
                    bool,
                    type,
                    types.ModuleType,
                    torch.Generator,
                    torch.dtype,
                    torch.device,
                    Endpoint,
                ),
            )
        ):
            continue
        seen.add(id(obj))
        if isinstance(obj, (nn.Module, nn.Parameter)):
            found.add(id(obj))
        if isinstance(obj, torch.Tensor):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
        if isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or ())
            continue
        stack.extend(getattr(obj, "__dict__", {}).values())
    return found


def owned(models: dict[str, nn.Module]) -> set[int]:
    return {id(x) for m in models.values() for x in (m, *m.modules(), *m.parameters())}


def test_no_party_holds_another_partys_model_object():
    cfg = build_config(
        minimal(
            data={"name": "digits", "parties": 3, "train_size": 300, "test_size": 60, "aux_pool": 60},
            model={"bottom": "mlp2", "top": "mlp2"},
            defenses=DEFENSES,
        )
    ).resolved()
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1", "passive_2"]))
    active, passives = fed.active, fed.passives
    theirs = set().union(*(owned(p.own_models()) for p in passives))
    assert {d.name for d in active.defenses} == {"vmask", "mid"}
    assert not reachable_modules(active) & theirs  # its defenses' shadows are architectures of their own
    for party in passives:
        others = owned(active.own_models()).union(*(owned(p.own_models()) for p in passives if p is not party))
        assert not reachable_modules(party) & others
    # the check can fail: a passive party's own objects do reach its own bottom model
    assert owned(passives[0].own_models()) & reachable_modules(passives[0])


class Looking(Defense):
    """An active-side defense that keeps every model it is shown (to see what the framework hands it)."""

    name = "looking"
    side = "active"

    def __init__(self) -> None:
        self.shown: list[tuple[str, nn.Module]] = []

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:
        self.shown.append((party, model))
        return model


def test_the_active_partys_defenses_are_shown_architectures_never_a_passive_partys_model():
    cfg = build_config(
        minimal(
            data={"name": "digits", "parties": 3, "train_size": 200, "test_size": 40},
            model={"bottom": "mlp2", "top": "mlp2"},
        )
    ).resolved()
    looking = Looking()
    fed = build_federation(
        cfg, load_vertical_data(cfg), defenses=DefensePlan([looking], {"passive_1": [], "passive_2": []})
    )
    shown = dict(looking.shown)
    assert shown.keys() == {"passive_1", "passive_2", "active"}
    for party in fed.passives:
        architecture, live = shown[party.name], party.bottom
        assert architecture is not live and not owned({"m": architecture}) & owned(party.own_models())
        # the same architecture (shapes), not the same values: what the configuration makes public
        assert [t.shape for t in architecture.state_dict().values()] == [t.shape for t in live.state_dict().values()]
    assert shown["active"] is fed.active.bottom  # its own model, as the framework hands every party's own
