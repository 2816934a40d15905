"""Each party's process holds only its own part of the dataset: a passive party its own columns (no labels, no other
party's columns, no active-side model), the active party its columns, the labels and its models (no passive party's
columns or bottom model), apart from the rows a defense's threat model grants it. Checked on the objects a party
builds, and in a live run: a passive party's own process records every frame it sends and receives and scans every
tensor alive in it (exact values, float copies, one-hot labels, label multisets, rows of other parties' columns)."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest
import torch
from conftest import child_env
from torch import Tensor, nn

from vflbench.experiment.config import build_config
from vflbench.experiment.party import local_state
from vflbench.experiment.scenario import (
    active_side,
    build_federation,
    build_passive,
    connect,
    embed_dim_of,
    load_vertical_data,
)
from vflbench.protocol import Channel

RAW = {
    "data": {"name": "digits", "parties": 3, "train_size": 300, "test_size": 100},
    "model": {"bottom": "mlp2", "top": "mlp2"},
    "train": {"algorithm": "vhnn", "epochs": 1, "batch_size": 64, "lr": 0.1},
    "seed": 5,
}


def reachable_tensors(*roots: object) -> Iterator[Tensor]:
    """Every tensor reachable from ``roots`` through attributes, containers, modules and closures (not through a
    function's module globals)."""
    seen: set[int] = set()
    stack: list[object] = list(roots)
    while stack:
        obj = stack.pop()
        if (
            id(obj) in seen
            or obj is None
            or isinstance(
                obj, (str, bytes, int, float, bool, type, types.ModuleType, torch.Generator, torch.dtype, torch.device)
            )
        ):
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
    party = build_passive(
        cfg, local.data, defenses=local.defenses.passive["passive_1"], embed_dim=16, link=Channel().endpoint
    )
    tensors = list(reachable_tensors(local, party))
    assert tensors, "the walk must reach the party's tensors"
    own = vd.passive[0]
    assert holds(tensors, own.x_train) and holds(tensors, own.x_test)
    for other in (
        vd.y_train,
        vd.y_test,
        vd.passive[1].x_train,
        vd.passive[1].x_test,
        vd.active.x_train,
        vd.active.x_test,
    ):
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
    side = active_side(cfg, local.data, defenses=[], link=Channel().endpoint)
    fed = connect(side.party, [], Channel(), train_rows=side.train_rows)
    assert fed.passives == [] and fed.parties() == [fed.active]  # no passive party's model exists in this process
    tensors = list(reachable_tensors(local, fed))
    assert holds(tensors, vd.y_train) and holds(tensors, vd.active.x_train)
    for p in vd.passive:
        assert not holds(tensors, p.x_train) and not holds(tensors, p.x_test)
    # the same active party, bit for bit, as in one process
    reference = build_federation(cfg, vd)
    assert side.embed_dim == embed_dim_of(cfg, fed.active.objective.out_dim) == 16
    for role, model in reference.active.models().items():
        for key, value in model.state_dict().items():
            assert torch.equal(fed.active.models()[role].state_dict()[key], value)


def test_with_vmask_the_active_party_holds_the_passive_columns_of_its_auxiliary_rows_only():
    raw = {
        **RAW,
        "data": {**RAW["data"], "parties": 2, "aux_pool": 40},
        "defenses": [{"name": "vmask", "mc_epochs": 1}],
    }
    cfg = build_config(raw).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "active")
    (granted,) = local.data.passive
    assert granted.rows is not None and len(granted.rows) == 40 and len(granted.x_test) == 0
    assert torch.equal(granted.x_train, vd.passive[0].x_train[granted.rows])
    with pytest.raises(ValueError, match="holds training rows"):
        granted.train_rows(
            torch.tensor(
                [
                    int(
                        torch.ones(len(vd.y_train), dtype=torch.bool)
                        .index_put_((granted.rows,), torch.tensor(False))
                        .nonzero()[0]
                    )
                ]
            )
        )


def test_each_process_builds_its_own_defense_instances_only():
    raw = {
        **RAW,
        "data": {**RAW["data"], "parties": 3, "aux_pool": 40},
        "defenses": [{"name": "vmask", "mc_epochs": 1}, {"name": "dp_laplace"}],
    }
    cfg = build_config(raw).resolved()
    active, passive = local_state(cfg, "active").defenses, local_state(cfg, "passive_2").defenses
    assert [d.name for d in active.active] == ["vmask", "dp_laplace"] and active.passive == {}
    assert passive.active == [] and list(passive.passive) == ["passive_2"]
    assert [d.name for d in passive.passive["passive_2"]] == ["vmask"]  # dp_laplace acts at the active party only


def test_a_passive_attackers_ground_truth_stays_with_the_scorer_not_its_party():
    raw = {**RAW, "attacks": [{"name": "model_completion", "party": "passive_1", "known_per_class": 2, "epochs": 1}]}
    cfg = build_config(raw).resolved()
    vd = load_vertical_data(cfg)
    local = local_state(cfg, "passive_1")
    assert local.ground_truth is not None and local.positions == [0]
    party = build_passive(cfg, local.data, defenses=[], embed_dim=16, link=Channel().endpoint)
    assert not holds(list(reachable_tensors(party)), vd.y_train)


# ------------------------------------------------------------------ a live run: the passive party's own process

RECORDING_PASSIVE = """
import gc, hashlib, json, sys
from pathlib import Path
import torch
from vflbench.experiment.config import load_config
from vflbench.experiment.party import party_names, party_policy, run_party
from vflbench.net import Credentials, NetChannel, NetOptions

config, address, certs, out = sys.argv[1:5]


def digest(t):
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def scan():
    # every tensor alive in this process, as it is, as float32 and row by row (float32): exact and derived copies
    whole, rows, multisets = set(), set(), set()
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor) or obj.is_sparse or obj.numel() == 0:
            continue
        t = obj.detach()
        whole.update((digest(t), digest(t.float())))
        if t.dim() >= 1:
            rows.update(digest(r) for r in t.reshape(len(t), -1).float()[:5000])
        if t.dim() == 1 and not t.is_floating_point():
            multisets.add(digest(t.sort().values.long()))
    return {"whole": sorted(whole), "rows": sorted(rows), "multisets": sorted(multisets)}


class Recording(NetChannel):
    # records what crosses its links: every frame's kind, role and tensors (values of the received ones), and scans
    # the process's memory when the active party ends training (every object of the party is alive then)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.frames, self.scanned = [], None

    def _put(self, link, frame, **kwargs):
        self.frames.append({"dir": "sent", "type": frame.type, "kind": frame.kind, "role": frame.role,
                            "tensors": [[str(t.dtype), list(t.shape)] for t in frame.tensors]})
        super()._put(link, frame, **kwargs)

    def _on_frame(self, link, frame):
        self.frames.append({"dir": "received", "peer": link.peer, "type": frame.type, "kind": frame.kind,
                            "role": frame.role, "ids": frame.ids.tolist(),
                            "tensors": [[str(t.dtype), list(t.shape), t.tolist()] for t in frame.tensors]})
        if frame.kind == "passive.done":
            self.scanned = scan()
        super()._on_frame(link, frame)


cfg = load_config(Path(config), []).resolved()
channel = Recording(name="passive_1", run=cfg.hash(), parties=party_names(cfg), addresses={"active": address},
                    credentials=Credentials.load(Path(certs)), policy=party_policy(cfg),
                    options=NetOptions(start_timeout=60))
run_party(cfg, party="passive_1", channel=channel)
Path(out).write_text(json.dumps({"frames": channel.frames, "scan": channel.scanned}))
"""


def digest(t: Tensor) -> str:
    import hashlib

    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_a_live_passive_process_receives_only_its_surface_and_holds_no_labels_or_other_columns(tmp_path):
    """A real 3-party run: the active party and passive_2 on threads here, passive_1 in its own process recording
    every frame it sends and receives and, at the end of training, every tensor alive in it."""
    import json
    import subprocess
    import sys
    import threading

    import yaml

    pytest.importorskip("grpc")
    from vflbench.experiment.party import party_policy, run_party
    from vflbench.net import SURFACE, Credentials, NetChannel, NetOptions, provision

    raw = {**RAW, "train": {**RAW["train"], "epochs": 2}}
    cfg = build_config(raw).resolved()
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    provision(tmp_path / "certs", ["active", "passive_1", "passive_2"])
    options = NetOptions(start_timeout=60, receive_timeout=60, close_timeout=2)
    parties = ["active", "passive_1", "passive_2"]
    active = NetChannel(
        name="active",
        run=cfg.hash(),
        parties=parties,
        addresses={"active": "127.0.0.1:0"},
        credentials=Credentials.load(tmp_path / "certs" / "active"),
        policy=party_policy(cfg),
        options=options,
    )
    address = active.listen()
    assert address is not None
    passive_2 = NetChannel(
        name="passive_2",
        run=cfg.hash(),
        parties=parties,
        addresses={"active": address},
        credentials=Credentials.load(tmp_path / "certs" / "passive_2"),
        policy=party_policy(cfg),
        options=options,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RECORDING_PASSIVE,
            str(tmp_path / "exp.yaml"),
            address,
            str(tmp_path / "certs" / "passive_1"),
            str(tmp_path / "wire.json"),
        ],
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    results: dict[str, object] = {}

    def party(name: str, channel: NetChannel) -> None:
        try:
            results[name] = run_party(cfg, party=name, channel=channel)
        except BaseException as exc:
            results[name] = exc

    threads = [
        threading.Thread(target=party, args=item, daemon=True)
        for item in (("active", active), ("passive_2", passive_2))
    ]
    for t in threads:
        t.start()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    for t in threads:
        t.join(30)
    assert proc.returncode == 0, err[-3000:]
    assert not any(isinstance(v, BaseException) for v in results.values()), results
    recorded = json.loads((tmp_path / "wire.json").read_text())
    frames, scanned = recorded["frames"], recorded["scan"]

    # 1. what crossed the wire: only the kinds the protocol's surface lets reach a passive party, and only its own
    received = [f for f in frames if f["dir"] == "received" and f["type"] == "message"]
    allowed_in = {r.kind for r in SURFACE if r.receiver == "passive" and not r.granted}
    allowed_out = {r.kind for r in SURFACE if r.sender == "passive" and r.receiver == "active" and not r.granted}
    assert {f["kind"] for f in received} <= allowed_in
    assert {f["kind"] for f in frames if f["dir"] == "sent" and f["type"] == "message"} <= allowed_out
    assert {f["peer"] for f in received} == {"active"}  # nothing from passive_2: passive parties have no link
    assert {
        "passive.setup",
        "passive.forward",
        "cut_gradient",
        "passive.backward",
        "passive.end_epoch",
        "passive.done",
    } <= {f["kind"] for f in received}
    vd = load_vertical_data(cfg).to("cpu")  # the ground truth beside the values the frames recorded (CPU tensors)
    y = vd.y_train
    onehot = torch.nn.functional.one_hot(y, vd.num_classes).float()
    ids = torch.empty(0, dtype=torch.long)
    for f in received:
        # a backward request is for the rows of the forward before it (it carries no ids of its own)
        ids = torch.tensor(f["ids"], dtype=torch.long) if f["ids"] else ids
        for dtype, shape, values in f["tensors"]:
            if f["kind"] == "cut_gradient":  # the cut gradient of the batch: float32, the embedding's shape
                assert (dtype, shape) == ("torch.float32", [len(ids), 16])
            else:  # everything else carries its content in the header (and row ids): an empty payload
                assert shape == [0], (f["kind"], shape)
            if shape == [0]:
                continue
            t = torch.tensor(values).float()
            for forbidden in (
                y[ids].float(),
                onehot[ids],
                vd.active.x_train[ids].reshape(len(ids), -1).float(),
                vd.passive[1].x_train[ids].reshape(len(ids), -1).float(),
            ):
                assert t.shape != forbidden.shape or not torch.equal(t, forbidden), f["kind"]

    # 2. what the process held at the end of training: its own columns (the control), no labels, no other columns,
    # not even as a float copy, a one-hot encoding, a permutation or a subset of rows
    whole, rows, multisets = set(scanned["whole"]), set(scanned["rows"]), set(scanned["multisets"])
    own = vd.passive[0].x_train
    assert {digest(r) for r in own.reshape(len(own), -1).float()[:50]} <= rows
    for labels in (vd.y_train, vd.y_test):
        for form in (labels, labels.float(), torch.nn.functional.one_hot(labels, vd.num_classes).float()):
            assert digest(form) not in whole
        assert digest(labels.sort().values.long()) not in multisets
    for other in (vd.active, vd.passive[1]):
        for x in (other.x_train, other.x_test):
            assert digest(x) not in whole and digest(x.float()) not in whole
            # rows that say something (a constant row, e.g. blank pixels, is in every party's data and every buffer)
            assert not {digest(r) for r in x.reshape(len(x), -1).float() if r.unique().numel() > 1} & rows
