"""paillier_he: encrypted training equals plaintext SGD; the passive party sees only ciphertexts.

All keys here are 512-bit: TEST-ONLY (fast, and insecure; the defense defaults to 1024 bits,
production needs 2048+). Models are tiny (digits, 64 training rows, logreg bottoms, 4-dimensional
embeddings) so that the whole module runs in seconds.
"""

from __future__ import annotations

import ast
import copy
import json
import pickle
import sys
import types
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Observer, minimal
from torch import nn

pytest.importorskip("phe", reason="paillier_he needs the optional 'he' extra (pip install 'vflbench[he]')")

from phe import paillier as phe_paillier

import vflbench.defenses.paillier as paillier_module
import vflbench.he as he_package
from vflbench.defenses import DEFENSES, create_defense
from vflbench.defenses.paillier import PaillierHE, PaillierHEActive, PaillierHEPassive
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.he import KeyHolderLink, PaillierKeyHolder, PaillierLinear, PaillierOps
from vflbench.mpc._service import DisconnectedService
from vflbench.protocol.channel import Channel, Endpoint

TEST_KEY_BITS = 512  # test-only: far below any secure size
HE = {"name": "paillier_he", "key_bits": TEST_KEY_BITS}
ROWS, BATCH = 64, 16


def _federation(defenses, *, train=None, model=None, data=None, keep=None):
    cfg = build_config(
        minimal(
            data={"train_size": ROWS, "test_size": 32, **(data or {})},
            model=model or {"bottom": "logreg", "embed_dim": 4},
            train={"momentum": 0.0, "batch_size": BATCH, **(train or {})},
            defenses=defenses,
        )
    )
    vd = load_vertical_data(cfg)
    names = [f"passive_{i + 1}" for i in range(len(vd.passive))]
    return build_federation(cfg, vd, defenses=plan_defenses(cfg, names), keep=keep), vd


def _train(fed, steps, seed=0):
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed))
    per_epoch = ROWS // BATCH
    for step in range(steps):
        k = step % per_epoch
        fed.train_step(order[k * BATCH : (k + 1) * BATCH], epoch=step // per_epoch, step=k)


def _last_linear(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]


def _reveal(he, party="passive_1"):
    """Test oracle: the key holder decrypts a passive party's encrypted layer (the test holds both)."""
    layer = _layer(he, party)
    return {name: he.active.defenses[0].reveal(t) for name, t in layer.params.items()}


def _layer(he, party="passive_1"):
    return next(m for p in he.passives if p.name == party for m in p.bottom.modules() if isinstance(m, PaillierLinear))


def _assert_same_training(plain, he, party="passive_1", atol=1e-6):
    revealed = _reveal(he, party)  # decrypted on the CPU, where Paillier's arithmetic runs
    lin = _last_linear(next(p for p in plain.passives if p.name == party).bottom)
    torch.testing.assert_close(revealed["weight"], lin.weight.detach().T.double().cpu(), atol=atol, rtol=0)
    torch.testing.assert_close(revealed["bias"], lin.bias.detach().double().cpu(), atol=atol, rtol=0)
    for p, q in zip(plain.active.top.parameters(), he.active.top.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=atol, rtol=0)


def test_registered_with_parameters_and_validation():
    cls = DEFENSES.get("paillier_he").factory
    assert cls is PaillierHE and cls.side == "both" and cls.strength_param is None
    d = create_defense("paillier_he")
    assert d.get_params() == {"key_bits": 1024, "precision": 32, "pool": 0}
    with pytest.raises(ConfigError, match="'key_bits' = 100 is not valid; it must be a multiple of 8 and >= 512"):
        create_defense("paillier_he", key_bits=100)
    with pytest.raises(ConfigError, match="precision"):
        create_defense("paillier_he", precision=3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "train",
    [{}, {"momentum": 0.9, "weight_decay": 0.01}, {"lr": 0.05, "schedule": "step", "step_size": 1, "gamma": 0.5}],
    ids=["sgd", "momentum_wd_rescaling", "lr_schedule"],
)
def test_encrypted_training_equals_plaintext_sgd(train):
    plain, vd = _federation([], train=train)
    he, _ = _federation([HE], train=train)
    steps = 10
    for fed in (plain, he):
        order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(0))
        for step in range(steps):
            k = step % (ROWS // BATCH)
            fed.train_step(order[k * BATCH : (k + 1) * BATCH], epoch=step // 4, step=k)
            if k == ROWS // BATCH - 1:
                for party in fed.parties():
                    party.end_epoch(step // 4)
    _assert_same_training(plain, he)
    layer = he.passives[0].bottom[-1]
    assert isinstance(layer, PaillierLinear) and layer.steps == steps
    rescales = he.channel.train.by_kind.get("paillier.rescale", {})
    if train.get("momentum"):
        assert layer.rescales > 0  # the masked rescaling ran and kept training exact
        # ... as request/reply messages through the channel, one round trip per rescaled tensor
        assert rescales["up"].messages == rescales["down"].messages == layer.rescales
    else:
        assert layer.rescales == 0 and not rescales
    # evaluation goes through the encrypted forward and gives the same outputs
    torch.testing.assert_close(plain.outputs("test"), he.outputs("test"), atol=1e-5, rtol=0)


def test_frozen_extractor_matches_plaintext_with_the_same_layers_frozen():
    model = {"bottom": "mlp2", "embed_dim": 4, "bottom_options": {"hidden": 8}}
    plain, _ = _federation([], model=model)
    he, _ = _federation([HE], model=model)
    first_plain = plain.passives[0].bottom[1]
    first_plain.requires_grad_(False)  # the HE variant does not train the extractor
    before = he.passives[0].bottom[1].weight.detach().clone()
    _train(plain, 6)
    _train(he, 6)
    _assert_same_training(plain, he)
    assert torch.equal(he.passives[0].bottom[1].weight, before)


def test_vlr_sum_aggregation_and_two_passive_parties():
    vlr = {"bottom": "logreg", "top": "identity"}
    plain, _ = _federation([], train={"algorithm": "vlr"}, model=vlr, data={"parties": 3})
    he, _ = _federation([HE], train={"algorithm": "vlr"}, model=vlr, data={"parties": 3})
    _train(plain, 4)
    _train(he, 4)
    for party in ("passive_1", "passive_2"):
        _assert_same_training(plain, he, party)


def test_passive_party_receives_only_ciphertexts():
    keep = {"passive_1": {"cut_gradient", "embedding", "paillier.rescale", "paillier.share"}}
    he, _ = _federation([HE], train={"momentum": 0.9}, keep=keep)
    passive = he.passives[0]
    seen = []
    passive.attach(Observer(lambda state, g: seen.append(g.clone())))
    _train(he, 12)
    holder = he.active.defenses[0].holder_
    n2 = holder.n**2
    ops = PaillierOps(holder.public_key)
    messages = passive.transcript.of_kind("cut_gradient")
    assert len(messages) == 12
    for m in messages:
        assert m.payload.dtype == torch.uint8 and m.payload.shape == (BATCH, 4, 2 * TEST_KEY_BITS // 8)
        cts = ops.from_wire(m.payload)  # every entry is an element of Z_{n^2}
        assert all(0 < int(c) < n2 for c in cts.ravel())
    # the plaintext cut gradient never appears: what the passive party's code backpropagates is zero
    assert seen and all(torch.count_nonzero(g) == 0 for g in seen)
    # the other values it received (rescaled parameters) are ciphertexts too; share replies are empty
    replies = [m for m in passive.transcript.messages if m.role == "reply" and m.receiver == "passive_1"]
    rescaled = [m for m in replies if m.kind == "paillier.rescale"]
    assert rescaled and all(m.payload.numel() == 0 for m in replies if m.kind == "paillier.share")
    assert all(0 < int(c) < n2 for m in rescaled for c in ops.from_wire(m.payload).ravel())
    # its layer holds no plaintext weight: only ciphertexts and an empty marker parameter
    layer = passive.bottom[-1]
    assert not hasattr(layer, "weight") and all(p.numel() == 0 for p in layer.parameters())
    assert layer.ops._crt is None  # the passive party's arithmetic has no key factors
    # nothing of the passive party's reaches the private key, not even through a pickle
    blob = pickle.dumps(passive.bottom)
    assert b"PaillierPrivateKey" not in blob and b"private" not in blob
    assert isinstance(pickle.loads(blob)[-1].link, DisconnectedService)


def test_decryption_happens_only_at_the_active_party(monkeypatch):
    callers = []
    original = phe_paillier.PaillierPrivateKey.raw_decrypt

    def recording(self, ciphertext):
        frame = sys._getframe(1)
        while frame is not None and not isinstance(frame.f_locals.get("self"), PaillierKeyHolder):
            frame = frame.f_back
        callers.append(None if frame is None else frame.f_code.co_name)
        return original(self, ciphertext)

    monkeypatch.setattr(phe_paillier.PaillierPrivateKey, "raw_decrypt", recording)
    he, vd = _federation([HE], train={"momentum": 0.9, "weight_decay": 0.01})
    _train(he, 8)
    he.evaluate(vd.y_test)
    assert callers and None not in callers  # every decryption ran inside the active party's key holder
    assert set(callers) == {"_decrypt"}
    holder = he.active.defenses[0].holder_
    assert holder.decrypted["embedding_share"] > 0 and holder.decrypted["rescale"] > 0
    for d in he.passives[0].defenses:
        assert isinstance(d, PaillierHEPassive) and not hasattr(d, "holder_")  # only its own half is built there
    assert isinstance(he.active.defenses[0], PaillierHEActive)


def test_missing_phe_names_the_extra(monkeypatch):
    defense = create_defense("paillier_he", key_bits=TEST_KEY_BITS)  # constructing needs no phe
    monkeypatch.setitem(sys.modules, "phe", None)  # import phe now raises ImportError
    with pytest.raises(ConfigError, match=r"'he' extra.*pip install 'vflbench\[he\]'"):
        _federation([HE])
    from vflbench.protocol import BindContext
    from vflbench.rng import generator

    with pytest.raises(ConfigError, match="phe>=1.5, gmpy2>=2.1"):
        defense.bind(BindContext("active", "vhnn", 10, 2, generator(0, "a"), generator(0, "b")))


def test_the_modules_import_phe_and_gmpy2_only_lazily():
    files = [Path(paillier_module.__file__), *Path(he_package.__file__).parent.glob("*.py")]
    assert len(files) > 3
    for file in files:
        tree = ast.parse(file.read_text())
        top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = {a.name for n in top_level for a in n.names}
        names |= {n.module for n in top_level if isinstance(n, ast.ImportFrom)}
        assert not {"phe", "gmpy2", "phe.paillier"} & names, file


def test_rejects_optimizers_that_are_not_linear_in_the_gradient():
    he, _ = _federation([HE], train={"optimizer": "adam", "lr": 1e-3})
    with pytest.raises(CompatibilityError, match="SGD"):
        _train(he, 1)


def test_checkpoint_state_and_end_to_end_run(tmp_path):
    he, _ = _federation([HE])
    _train(he, 2)
    layer = _layer(he)
    state = he.passives[0].bottom.state_dict()
    assert not any("private" in k for k in state)
    clone = copy.deepcopy(he.passives[0].bottom)
    clone[-1].params = {}
    clone.load_state_dict(state)
    restored, original = clone[-1].params["weight"].cts, layer.params["weight"].cts
    assert [int(c) for c in restored.ravel()] == [int(c) for c in original.ravel()]
    assert clone[-1].link is layer.link  # a copy talks to the same key holder; it never holds the key
    cfg = build_config(
        minimal(
            data={"train_size": ROWS, "test_size": 32},
            model={"bottom": "logreg", "embed_dim": 4},
            train={"momentum": 0.0, "batch_size": 32, "epochs": 1},
            defenses=[HE],
        )
    )
    result = run_experiment(cfg, out_dir=tmp_path)
    assert result is not None
    assert (tmp_path / cfg.hash() / "metrics.jsonl").read_text().count("paillier_he.side_bytes_up") == 1


# ----------------------------------------------------------------------------------------------
# Per-party halves that talk only through the channel (issue 18, items 3 and 6)


def _reachable(root):
    """Every object reachable from ``root`` through attributes and containers, stopping at a channel
    endpoint (the network: over a transport, nothing of the other party lies behind it)."""
    seen, stack, out = set(), [root], []
    leaves = (type, types.ModuleType, str, bytes, int, float, bool, torch.Tensor, torch.Generator, np.ndarray)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, leaves):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, Endpoint | Channel):
            continue
        if isinstance(obj, dict):
            stack.extend([*obj.keys(), *obj.values()])
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            stack.extend(obj)
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
        if isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or ())
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return out


def test_the_active_instance_holds_no_object_of_a_passive_party():
    """Old design: the active instance created the passive layers and kept them (``layers_``) and a
    handle to each (``KeyHolderPeer``); now it holds only its own key holder and what messages told it."""
    he, _ = _federation([HE], train={"momentum": 0.9}, data={"parties": 3})
    _train(he, 4)
    active = he.active.defenses[0]
    passive_objects = {id(o) for p in he.passives for o in (*p.bottom.modules(), *p.bottom.parameters(), *p.defenses)}
    reachable = _reachable(active)
    assert not [o for o in reachable if id(o) in passive_objects]
    assert not [o for o in reachable if isinstance(o, nn.Module | KeyHolderLink)]
    assert active.holder_.widths == {"passive_1": 4, "passive_2": 4}  # learned from the setup messages


def test_the_passive_half_holds_no_private_key_and_no_active_object():
    """Old design: the passive layer's ``KeyHolderPeer`` held the active party's key holder (and so the
    private key) as a Python object; now it holds its own channel endpoint only."""
    he, _ = _federation([HE], train={"momentum": 0.9, "weight_decay": 0.01})
    _train(he, 6)
    passive = he.passives[0]
    active_objects = {
        id(o) for o in (*he.active.defenses, he.active.defenses[0].holder_, he.active.top, *he.active.top.modules())
    }
    for root in (*passive.defenses, passive.bottom):
        reachable = _reachable(root)
        assert not [o for o in reachable if isinstance(o, phe_paillier.PaillierPrivateKey | PaillierKeyHolder)]
        assert not [o for o in reachable if id(o) in active_objects]
    layer = _layer(he)
    assert isinstance(layer.link, KeyHolderLink) and layer.ops._crt is None
    blob = pickle.dumps((passive.bottom, layer.ops, layer.params))
    assert b"PaillierPrivateKey" not in blob and b"KeyHolder\x94" not in blob
    with pytest.raises(RuntimeError, match="disconnected"):
        pickle.loads(pickle.dumps(layer.link)).rescale(layer.ops, layer.params["weight"].cts, 1)


def test_setup_sends_the_public_key_as_a_message_and_the_holder_checks_its_requests():
    he, _ = _federation([HE], data={"parties": 3})
    setup = he.channel.stats["setup"].by_kind["paillier.public_key"]
    n_bytes = TEST_KEY_BITS // 8
    assert setup["up"].messages == 2 and setup["up"].bytes == 0  # the request carries the width as meta
    assert setup["down"].messages == 2 and setup["down"].bytes == 2 * n_bytes
    holder = he.active.defenses[0].holder_
    layer = _layer(he)
    assert int(layer.ops.n) == holder.n and layer.ops.public_key == holder.public_key
    # a party that did not set up, a malformed header, an unknown kind: refused
    stranger = he.channel.endpoint("dealer")
    wire = layer.ops.to_wire(layer.params["weight"].cts)  # (inputs, 4): the shape of a share of 4 outputs
    with pytest.raises(RuntimeError, match="without asking for the public key"):
        stranger.call("paillier.share", "active", wire, meta={"scale": 64})
    link = he.channel.endpoint("passive_1")
    with pytest.raises(ValueError, match="meta\\['scale'\\]"):
        link.call("paillier.share", "active", wire, meta={"scale": "64"})
    with pytest.raises(ValueError, match="embedding share of shape"):
        link.call("paillier.share", "active", layer.ops.to_wire(layer.params["weight"].cts.T), meta={"scale": 64})
    with pytest.raises(RuntimeError, match="not 'paillier.decrypt'"):
        link.call("paillier.decrypt", "active", wire)


def test_paillier_traffic_reaches_result_json_comm(tmp_path):
    """Old design: the side exchanges were counted by a private HEComm that never reached result.json."""
    cfg = build_config(
        minimal(
            data={"train_size": ROWS, "test_size": 16},
            model={"bottom": "logreg", "embed_dim": 4},
            train={"momentum": 0.9, "weight_decay": 0.01, "batch_size": BATCH, "epochs": 2},
            defenses=[HE],
        )
    )
    run_experiment(cfg, out_dir=tmp_path)
    result = json.loads((tmp_path / cfg.hash() / "result.json").read_text())
    by_kind = result["comm"]["by_kind"]
    steps = 2 * ROWS // BATCH
    ct_bytes = 2 * TEST_KEY_BITS // 8
    share = by_kind["paillier.share"]
    # [[h - S]] per training batch, each a request: one round trip
    assert share["up"] == {"messages": steps, "bytes": ROWS * 2 * 4 * ct_bytes, "rounds": steps}
    assert share["down"] == {"messages": steps, "bytes": 0, "rounds": 0}  # empty acknowledgements
    assert by_kind["paillier.rescale"]["up"]["messages"] == by_kind["paillier.rescale"]["down"]["messages"] > 0
    assert "paillier.public_key" not in by_kind  # setup traffic is counted in its own phase
    paillier_up = sum(v["up"]["bytes"] for k, v in by_kind.items() if k.startswith("paillier.") and "up" in v)
    assert result["comm"]["bytes_up"] == paillier_up + by_kind["embedding"]["up"]["bytes"]
    epochs = [json.loads(line) for line in (tmp_path / cfg.hash() / "metrics.jsonl").read_text().splitlines()]
    last = next(e for e in reversed(epochs) if "paillier_he.side_bytes_up" in e)
    assert last["paillier_he.side_bytes_up"] == paillier_up  # the epoch report reads the channel's counter
