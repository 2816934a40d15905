"""paillier_he: encrypted training equals plaintext SGD; the passive party sees only ciphertexts.

All keys here are 512-bit: TEST-ONLY (fast, and insecure; the defense defaults to 1024 bits,
production needs 2048+). Models are tiny (digits, 64 training rows, logreg bottoms, 4-dimensional
embeddings) so that the whole module runs in seconds.
"""

from __future__ import annotations

import ast
import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch
from conftest import Observer, minimal

pytest.importorskip("phe", reason="paillier_he needs the optional 'he' extra (pip install 'vflbench[he]')")

from phe import paillier as phe_paillier  # noqa: E402

import vflbench.defenses.paillier as paillier_module  # noqa: E402
from vflbench.defenses import DEFENSES, create_defense  # noqa: E402
from vflbench.defenses.paillier import (  # noqa: E402
    EncTensor,
    KeyHolderPeer,
    PaillierHE,
    PaillierKeyHolder,
    PaillierLinear,
    PaillierOps,
    encode,
)
from vflbench.errors import CompatibilityError, ConfigError  # noqa: E402
from vflbench.experiment.config import build_config  # noqa: E402
from vflbench.experiment.run import run_experiment  # noqa: E402
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses  # noqa: E402

TEST_KEY_BITS = 512  # test-only: far below any secure size
HE = {"name": "paillier_he", "key_bits": TEST_KEY_BITS}
ROWS, BATCH = 64, 16


def _federation(defenses, *, train=None, model=None, data=None, keep=None):
    cfg = build_config(minimal(data={"train_size": ROWS, "test_size": 32, **(data or {})},
                               model=model or {"bottom": "logreg", "embed_dim": 4},
                               train={"momentum": 0.0, "batch_size": BATCH, **(train or {})}, defenses=defenses))
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


def _assert_same_training(plain, he, party="passive_1", atol=1e-6):
    defense = he.active.defenses[0]
    revealed = defense.reveal(party)  # test oracle: the key holder decrypts the encrypted layer
    lin = _last_linear(next(p for p in plain.passives if p.name == party).bottom)
    torch.testing.assert_close(revealed["weight"], lin.weight.detach().T.double(), atol=atol, rtol=0)
    torch.testing.assert_close(revealed["bias"], lin.bias.detach().double(), atol=atol, rtol=0)
    for p, q in zip(plain.active.top.parameters(), he.active.top.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=atol, rtol=0)


def test_registered_with_parameters_and_validation():
    cls = DEFENSES.get("paillier_he").factory
    assert cls is PaillierHE and cls.side == "both" and cls.strength_param is None
    d = create_defense("paillier_he")
    assert d.get_params() == {"key_bits": 1024, "precision": 32, "pool": 0}
    with pytest.raises(ConfigError, match="key_bits must be"):
        create_defense("paillier_he", key_bits=100)
    with pytest.raises(ConfigError, match="precision"):
        create_defense("paillier_he", precision=3)


@pytest.mark.parametrize("train", [{}, {"momentum": 0.9, "weight_decay": 0.01}, {"lr": 0.05, "schedule": "step",
                                                                                 "step_size": 1, "gamma": 0.5}],
                         ids=["sgd", "momentum_wd_rescaling", "lr_schedule"])
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
    if train.get("momentum"):
        assert layer.rescales > 0  # the masked rescaling ran and kept training exact
    else:
        assert layer.rescales == 0
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
    he, _ = _federation([HE], train={"momentum": 0.9}, keep={"passive_1": {"cut_gradient", "embedding"}})
    passive = he.passives[0]
    seen = []
    passive.attach(Observer(lambda state, g: seen.append(g.clone())))
    _train(he, 12)
    holder = he.active.defenses[0].holder_
    n2 = holder.n**2
    ops = PaillierOps(holder.n)
    messages = passive.transcript.of_kind("cut_gradient")
    assert len(messages) == 12
    for m in messages:
        assert m.payload.dtype == torch.uint8 and m.payload.shape == (BATCH, 4, 2 * TEST_KEY_BITS // 8)
        cts = ops.from_wire(m.payload)  # every entry is an element of Z_{n^2}
        assert all(0 < int(c) < n2 for c in cts.ravel())
    # the plaintext cut gradient never appears: what the passive party's code backpropagates is zero
    assert seen and all(torch.count_nonzero(g) == 0 for g in seen)
    # the other values it received (rescaled parameters) are ciphertexts too
    peer = passive.bottom[-1].peer
    assert isinstance(peer, KeyHolderPeer) and peer.received
    assert all(0 < int(c) < n2 for arr in peer.received for c in arr.ravel())
    # its layer holds no plaintext weight: only ciphertexts and an empty marker parameter
    layer = passive.bottom[-1]
    assert not hasattr(layer, "weight") and all(p.numel() == 0 for p in layer.parameters())
    assert layer.ops._crt is None  # the passive party's arithmetic has no key factors
    # nothing of the passive party's reaches the private key, not even through a pickle
    blob = pickle.dumps(passive.bottom)
    assert b"PaillierPrivateKey" not in blob and b"private" not in blob
    assert "Disconnected" in repr(pickle.loads(blob)[-1].peer)


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
        assert getattr(d, "holder_", None) is None


def test_missing_phe_names_the_extra(monkeypatch):
    defense = create_defense("paillier_he", key_bits=TEST_KEY_BITS)  # constructing needs no phe
    monkeypatch.setitem(sys.modules, "phe", None)  # import phe now raises ImportError
    with pytest.raises(ConfigError, match=r"'he' extra.*pip install 'vflbench\[he\]'"):
        _federation([HE])
    from vflbench.protocol import BindContext
    from vflbench.rng import generator

    with pytest.raises(ConfigError, match="phe>=1.5, gmpy2>=2.1"):
        defense.bind(BindContext("active", "vhnn", 10, 2, generator(0, "a"), generator(0, "b")))


def test_the_module_imports_phe_and_gmpy2_only_lazily():
    tree = ast.parse(Path(paillier_module.__file__).read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {a.name for n in top_level for a in n.names}
    names |= {n.module for n in top_level if isinstance(n, ast.ImportFrom)}
    assert not {"phe", "gmpy2", "phe.paillier"} & names


def test_rejects_optimizers_that_are_not_linear_in_the_gradient():
    he, _ = _federation([HE], train={"optimizer": "adam", "lr": 1e-3})
    with pytest.raises(CompatibilityError, match="SGD"):
        _train(he, 1)


def test_checkpoint_state_and_end_to_end_run(tmp_path):
    he, _ = _federation([HE])
    _train(he, 2)
    layer = he.passives[0].bottom[-1]
    state = he.passives[0].bottom.state_dict()
    assert not any("private" in k for k in state)
    clone = copy.deepcopy(he.passives[0].bottom)
    clone[-1].params = {}
    clone.load_state_dict(state)
    restored, original = clone[-1].params["weight"].cts, layer.params["weight"].cts
    assert [int(c) for c in restored.ravel()] == [int(c) for c in original.ravel()]
    assert clone[-1].peer is layer.peer  # a copy talks to the same key holder; it never holds the key
    cfg = build_config(minimal(data={"train_size": ROWS, "test_size": 32}, model={"bottom": "logreg", "embed_dim": 4},
                               train={"momentum": 0.0, "batch_size": 32, "epochs": 1}, defenses=[HE]))
    result = run_experiment(cfg, out_dir=tmp_path)
    assert result is not None
    assert (tmp_path / cfg.hash() / "metrics.jsonl").read_text().count("paillier_he.side_bytes_up") == 1


def test_fixed_point_encoding_and_homomorphic_matmul():
    holder = PaillierKeyHolder(TEST_KEY_BITS)
    ops = holder.ops
    a = torch.tensor([[0.5, -1.25, 0.0], [2.0, 0.125, -3.0]], dtype=torch.float64)
    w = torch.tensor([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]], dtype=torch.float64)
    enc_w = ops.encrypt(encode(w, 20))
    prod = EncTensor(ops.matmul(encode(a, 20), enc_w), 40)
    torch.testing.assert_close(holder.reveal(prod), a @ w, atol=1e-5, rtol=0)
    wire = ops.to_wire(enc_w)
    assert wire.shape == (3, 2, 2 * TEST_KEY_BITS // 8)
    assert [int(c) for c in ops.from_wire(wire).ravel()] == [int(c) for c in enc_w.ravel()]
    with pytest.raises(ValueError, match="ciphertext"):
        ops.from_wire(torch.zeros(3, 2, 7, dtype=torch.uint8))


def test_worker_functions_of_the_pool_compute_the_same_ciphertext_products():
    from vflbench.defenses.paillier import _work_lin, _work_obfuscators

    holder = PaillierKeyHolder(TEST_KEY_BITS)
    ops = holder.ops
    x = encode(torch.tensor([[1.5, -2.0], [0.0, 0.25]]), 8)
    w = ops.encrypt(encode(torch.tensor([[0.5], [-1.0]]), 8))
    rows = _work_lin(int(ops.n2), x.tolist(), [[int(c) for c in w[:, 0]]], ops.use_gmpy2)
    arr = ops.matmul(x, w)
    assert [[int(v) for v in r] for r in rows] == [[int(v) for v in r] for r in arr.tolist()]
    expected = torch.tensor([2.75, -0.25], dtype=torch.float64)
    torch.testing.assert_close(holder.reveal(EncTensor(arr, 16)).flatten(), expected)
    obf = _work_obfuscators(int(ops.n), 3, ops.use_gmpy2, None)
    assert len(set(obf)) == 3 and all(0 < v < int(ops.n2) for v in obf)
