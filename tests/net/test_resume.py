"""Coordinated epoch checkpoints of a launched run: a run stopped after epoch 2 and resumed with `--resume` gives the
uninterrupted run's result.json (apart from timing) and metrics (apart from seconds)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.launch import launch
from vflbench.experiment.resume import checkpoint_path, manifest_path

RAW = {
    "data": {"name": "digits", "parties": 3, "train_size": 600, "test_size": 200},
    "model": {"bottom": "mlp2", "top": "mlp2"},
    "train": {
        "algorithm": "vhnn",
        "epochs": 4,
        "batch_size": 64,
        "lr": 0.01,
        "optimizer": "adam",
        "schedule": "cosine",
    },
    "baselines": ["vanilla"],
    "seed": 3,
}


def metrics(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")} for line in lines]


def untimed(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "timing"}


@pytest.mark.slow
def test_a_launched_run_stopped_after_epoch_2_and_resumed_equals_the_uninterrupted_run(tmp_path):
    cfg = build_config(RAW)
    whole = launch(cfg, out_dir=tmp_path / "whole", insecure=True, timeout=120, receive_timeout=60)

    first = launch(cfg, out_dir=tmp_path / "cut", insecure=True, timeout=120, receive_timeout=60, stop_after=2)
    assert first.stopped_after == 2 and not (first.run_dir / "result.json").exists()
    manifest = json.loads(manifest_path(first.run_dir).read_text())
    assert manifest == {"epoch": 1, "parties": {"active": 1, "passive_1": 1, "passive_2": 1}}
    for party in ("active", "passive_1", "passive_2"):  # every party wrote its own file of each epoch
        assert [checkpoint_path(first.run_dir, party, e).is_file() for e in range(3)] == [True, True, False]
    own = torch.load(checkpoint_path(first.run_dir, "passive_1", 1), weights_only=True)
    assert own["epoch"] == 1 and "bottom" in own["models"] and own["optimizer"]["state"]

    resumed = launch(cfg, out_dir=tmp_path / "cut", insecure=True, timeout=120, receive_timeout=60, resume=True)
    assert untimed(resumed.result) == untimed(whole.result)
    assert metrics(resumed.run_dir) == metrics(whole.run_dir)
    assert len(resumed.net["epoch_seconds"]) == 4
    assert json.loads(manifest_path(first.run_dir).read_text())["epoch"] == 3
    # the wire counts continue across the resume (no negative epoch: counters of the first process are added)
    assert all(b > 0 for b in resumed.net["wire_per_epoch"]["bytes"])


def test_resume_without_checkpoints_says_so_before_starting_anything(tmp_path, cli):
    with pytest.raises(ConfigError, match="nothing to resume: no committed checkpoint"):
        launch(build_config(RAW), out_dir=tmp_path, insecure=True, resume=True)
    (tmp_path / "exp.yaml").write_text(json.dumps(RAW))
    proc = cli("launch", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out"), "--insecure-localhost", "--resume")
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    assert not (tmp_path / "out" / build_config(RAW).resolved().hash() / "logs").exists()


def test_resume_refuses_configs_whose_defense_or_attack_state_is_not_checkpointed(tmp_path):
    raw = {**RAW, "defenses": [{"name": "paillier_he", "key_bits": 512}]}
    with pytest.raises(ConfigError, match="covers VMask .* paillier_he keeps state"):
        launch(build_config(raw), out_dir=tmp_path, insecure=True, resume=True)
    raw = {**RAW, "attacks": [{"name": "model_completion", "known_per_class": 2}]}
    with pytest.raises(ConfigError, match="does not cover configs with attacks"):
        launch(build_config(raw), out_dir=tmp_path, insecure=True, resume=True)


VMASK = {
    "data": {"name": "digits", "parties": 2, "train_size": 500, "test_size": 150, "aux_pool": 100},
    "model": {"bottom": "mlp3", "top": "mlp2"},
    "train": {"algorithm": "vhnn", "epochs": 3, "batch_size": 64, "lr": 0.05},
    "defenses": [{"name": "vmask", "mc_epochs": 2, "budget": 0.0}],
    "seed": 2,
}


@pytest.mark.slow
def test_a_vmask_launch_stopped_after_epoch_1_and_resumed_equals_the_uninterrupted_one_and_deals_no_triple_twice(
    tmp_path,
):
    cfg = build_config(VMASK)
    whole = launch(cfg, out_dir=tmp_path / "whole", insecure=True, timeout=180, receive_timeout=60)
    first = launch(cfg, out_dir=tmp_path / "cut", insecure=True, timeout=180, receive_timeout=60, stop_after=1)
    assert json.loads(manifest_path(first.run_dir).read_text()) == {
        "epoch": 0,
        "parties": {"active": 0, "passive_1": 0, "dealer": 0},
    }
    dealt_before = json.loads((first.run_dir / "dealer.json").read_text())["dealer"]["next_triple"]
    assert dealt_before > 0
    # each half wrote its own state: P_k its masks and share generators, the active party its shadow and shares
    passive = torch.load(checkpoint_path(first.run_dir, "passive_1", 0), weights_only=True)
    active = torch.load(checkpoint_path(first.run_dir, "active", 0), weights_only=True)
    # (budget 0: every layer masked after epoch 0, while the restarted P_k masks only the first at set-up)
    assert passive["defenses"][0]["masked"] == [0, 1, 2] and "shadow" in active["defenses"][0]["parties"]["passive_1"]
    assert "dealer" in torch.load(checkpoint_path(first.run_dir, "dealer", 0), weights_only=True)

    resumed = launch(cfg, out_dir=tmp_path / "cut", insecure=True, timeout=180, receive_timeout=60, resume=True)
    assert untimed(resumed.result) == untimed(whole.result)
    assert metrics(resumed.run_dir) == metrics(whole.run_dir)
    # the restored dealer started at the triple after the last one it dealt before the stop, and dealt as many in
    # all as the uninterrupted dealer
    dealer = json.loads((resumed.run_dir / "dealer.json").read_text())["dealer"]
    assert dealer["resumed_at_triple"] == dealt_before
    assert dealer["next_triple"] == json.loads((whole.run_dir / "dealer.json").read_text())["dealer"]["next_triple"]
    assert dealer["next_triple"] > dealt_before


def test_a_restored_dealer_continues_its_counters_and_refuses_every_triple_issued_before_the_checkpoint():
    from vflbench.mpc.dealer import Dealer, DealerService, TripleReuseError
    from vflbench.protocol.channel import Channel
    from vflbench.protocol.messages import ACTIVE, DEALER

    def dealt(dealer: Dealer) -> list[int]:
        return [dealer.issue_matmul((4, 3), (3, 2)) for _ in range(3)]

    whole = Dealer(7)
    first = dealt(whole)
    for tid in first:
        whole.pair(tid)
    state = whole.state_dict()
    after = dealt(whole)

    restored = Dealer(12345)  # a fresh process: its generator is replaced by the checkpoint's
    restored.load_state_dict(state)
    assert dealt(restored) == after == [3, 4, 5] and dict(restored.issued) == {"matmul": 6}
    for tid in after:  # the same triples as the uninterrupted dealer's
        assert all(
            torch.equal(x, y)
            for h, k in zip(restored.pair(tid), whole.pair(tid), strict=True)
            for x, y in ((h.a, k.a), (h.b, k.b), (h.c, k.c))
        )
    for tid in first:
        with pytest.raises(TripleReuseError, match=f"triple {tid} was issued before the checkpoint"):
            restored.take(tid, 1)
    # over the channel: the active party's request for a triple issued before the checkpoint is refused
    channel = Channel([ACTIVE, "passive_1", DEALER])
    again = Dealer(1)
    again.load_state_dict(state)
    DealerService(again, channel.endpoint(DEALER))
    with pytest.raises(TripleReuseError, match="issued before the checkpoint"):
        channel.endpoint(ACTIVE).call("dealer.take", DEALER, meta={"triple": 1})
    # a checkpoint between a triple's issue and its take is refused (a pending half would be lost or dealt twice)
    again.issue_mul((2,))
    with pytest.raises(RuntimeError, match="issued but not taken"):
        again.state_dict()


def test_a_restored_dealer_keeps_its_weight_masks_and_deals_the_same_fixed_mask_triples():
    """fixed_mask (issue 26): a dealer restored from its checkpoint knows every current weight mask (ids, seeds,
    whether the active party took its seed), deals the next triples with the uninterrupted dealer's ids and values,
    and gives no active seed twice."""
    from vflbench.mpc.dealer import Dealer, TripleReuseError

    meta = {"op": "matmul", "a": "4,3", "b": "3,2", "transpose": True}
    whole = Dealer(7)
    old, _ = whole.open_mask("passive_1", "layer0", (2, 3))
    mask, seed = whole.open_mask("passive_1", "layer0", (2, 3))  # retires the first mask of the layer
    whole.take_mask(mask, "passive_1", "layer0")
    whole.issue_masked("passive_1", mask, meta)
    state = whole.state_dict()
    restored = Dealer(12345)
    restored.load_state_dict(state)
    for _ in range(2):
        (t1, c1), (t2, c2) = whole.issue_masked("passive_1", mask, meta), restored.issue_masked("passive_1", mask, meta)
        assert t1 == t2 and torch.equal(c1, c2)
    with pytest.raises(TripleReuseError, match="already took its seed"):
        restored.take_mask(mask, "passive_1", "layer0")
    with pytest.raises(KeyError, match="retired"):
        restored.issue_masked("passive_1", old, meta)
    assert restored.open_mask("passive_1", "layer1", (2, 3)) == whole.open_mask("passive_1", "layer1", (2, 3))
    assert seed != restored.open_mask("passive_1", "layer0", (2, 3))[1]
