"""Each party's process holds only its own part of the dataset: a passive party its own columns (no labels, no other
party's columns, no active-side model), the active party its columns, the labels and its models (no passive party's
columns or bottom model), apart from the rows a defense's threat model grants it."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from vflbench.experiment.config import build_config
from vflbench.experiment.party import local_state
from vflbench.experiment.scenario import (
    DefensePlan,
    build_federation,
    build_passive,
    embed_dim_of,
    load_vertical_data,
)
from vflbench.protocol import Channel

RAW = {"data": {"name": "digits", "parties": 3, "train_size": 300, "test_size": 100},
       "model": {"bottom": "mlp2", "top": "mlp2"},
       "train": {"algorithm": "vhnn", "epochs": 1, "batch_size": 64, "lr": 0.1}, "seed": 5}


def reachable_tensors(*roots: object) -> Iterator[Tensor]:
    """Every tensor reachable from ``roots`` through attributes, containers, modules and closures (not through a
    function's module globals)."""
    seen: set[int] = set()
    stack: list[object] = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, type, types.ModuleType,
                                                              torch.Generator, torch.dtype, torch.device)):
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            yield obj
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
            stack.append(obj.__func__)
        if isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None)
            continue
        for attr in ("func", "args", "keywords"):  # functools.partial
            if isinstance(obj, __import__("functools").partial):
                stack.append(getattr(obj, attr))
        if hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                stack.append(getattr(obj, slot))


def reachable_modules(*roots: object) -> list[nn.Module]:
    """The modules among the objects reachable from ``roots`` (through their tensors' owners' walk)."""
    found: list[nn.Module] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type, types.ModuleType, Tensor)):
            continue
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            found.append(obj)
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, types.FunctionType):
            stack.append(vars(obj))
    return found


def same_values(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def holds(tensors: list[Tensor], value: Tensor) -> bool:
    """Whether any of ``tensors`` is ``value`` (its values) or shares its storage."""
    pointer = value.untyped_storage().data_ptr()
    return any(same_values(t, value) or (t.numel() and t.untyped_storage().data_ptr() == pointer) for t in tensors)


def test_a_passive_partys_process_holds_its_own_columns_only_no_labels_no_other_party():
    cfg = build_config(RAW).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "passive_1")
    assert local.ground_truth is None and local.attacks.data is None and local.attacks.y_train is None
    assert local.defenses.active == []
    party = build_passive(cfg, local.data, defenses=local.defenses.passive["passive_1"], embed_dim=16,
                          link=Channel().endpoint)
    tensors = list(reachable_tensors(local, party))
    assert tensors, "the walk must reach the party's tensors"
    own = vd.passive[0]
    assert holds(tensors, own.x_train) and holds(tensors, own.x_test)
    for other in (vd.y_train, vd.y_test, vd.passive[1].x_train, vd.passive[1].x_test, vd.active.x_train,
                  vd.active.x_test):
        assert not holds(tensors, other)
    # its slice is a copy of its own: not a view that keeps the loaded dataset's storage alive
    x = party.data.x_train
    assert x.untyped_storage().nbytes() == x.numel() * x.element_size()
    # no active-side model: only its own bottom model
    assert set(party.models()) == {"bottom"}
    assert not any(isinstance(m, nn.Module) and hasattr(m, "top") for m in reachable_modules(local, party))


def test_the_active_partys_process_holds_its_columns_and_labels_and_no_passive_columns_or_bottoms():
    cfg = build_config(RAW).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "active")
    assert local.ground_truth is None and local.attacks.data is None
    assert [len(p.x_train) + len(p.x_test) for p in local.data.passive] == [0, 0]
    fed = build_federation(cfg, local.data, defenses=DefensePlan([], {"passive_1": [], "passive_2": []}),
                           remote_passives=True)
    assert all(p.bottom is None and p.data is None and p.optimizer is None for p in fed.passives)
    tensors = list(reachable_tensors(local, fed))
    assert holds(tensors, vd.y_train) and holds(tensors, vd.active.x_train)
    for p in vd.passive:
        assert not holds(tensors, p.x_train) and not holds(tensors, p.x_test)
    # the same active party, bit for bit, as in one process
    reference = build_federation(cfg, vd)
    assert embed_dim_of(cfg, fed.active.objective.out_dim) == 16
    for role, model in reference.active.models().items():
        for key, value in model.state_dict().items():
            assert torch.equal(fed.active.models()[role].state_dict()[key], value)


def test_with_vmask_the_active_party_holds_the_passive_columns_of_its_auxiliary_rows_only():
    raw = {**RAW, "data": {**RAW["data"], "parties": 2, "aux_pool": 40},
           "defenses": [{"name": "vmask", "mc_epochs": 1}]}
    cfg = build_config(raw).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "active")
    (granted,) = local.data.passive
    assert granted.rows is not None and len(granted.rows) == 40 and len(granted.x_test) == 0
    assert torch.equal(granted.x_train, vd.passive[0].x_train[granted.rows])
    with pytest.raises(ValueError, match="holds training rows"):
        granted.train_rows(torch.tensor([int(torch.ones(len(vd.y_train), dtype=torch.bool)
                                             .index_put_((granted.rows,), torch.tensor(False)).nonzero()[0])]))


def test_a_passive_attackers_ground_truth_stays_with_the_scorer_not_its_party():
    raw = {**RAW, "attacks": [{"name": "model_completion", "party": "passive_1", "known_per_class": 2,
                               "epochs": 1}]}
    cfg = build_config(raw).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "passive_1")
    assert local.ground_truth is not None and local.positions == [0]
    party = build_passive(cfg, local.data, defenses=[], embed_dim=16, link=Channel().endpoint)
    assert not holds(list(reachable_tensors(party)), vd.y_train)
