"""`vflbench launch`: every party (and VMask's dealer) as its own process over loopback mutual TLS gives the
in-process run's result.json (apart from timing) and metrics (apart from seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.launch import _failure, _PartyProcess, _wait, launch, party_context
from vflbench.experiment.party import comm_from_dict, merged_comm, party_names
from vflbench.experiment.run import run_experiment, undefended_config
from vflbench.net.linkmodel import LINK_PROFILES, project
from vflbench.protocol.channel import CommStats
from vflbench.protocol.messages import Message


def metrics(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")} for line in lines]


def in_process(raw: dict, tmp_path) -> tuple[dict, list[dict]]:
    cfg = build_config(raw)
    torch.set_num_threads(1)
    result = run_experiment(cfg, out_dir=tmp_path / "one")
    return result.to_dict(), metrics(tmp_path / "one" / cfg.hash())


def check_same(raw: dict, tmp_path) -> tuple[dict, dict]:
    launched = launch(build_config(raw), out_dir=tmp_path / "many", timeout=120, receive_timeout=60)
    reference, records = in_process(raw, tmp_path)
    assert {k: v for k, v in launched.result.items() if k != "timing"} == {
        k: v for k, v in reference.items() if k != "timing"
    }
    assert metrics(launched.run_dir) == records
    assert len(launched.net["epoch_seconds"]) == raw["train"]["epochs"]
    return launched.result, launched.net


@pytest.mark.slow
def test_launched_demo_vhnn_three_parties_equals_one_process(tmp_path):
    raw = {
        "data": {"name": "digits", "parties": 3},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1},
        "baselines": ["vanilla", "alone"],
        "seed": 0,
    }
    result, net = check_same(raw, tmp_path)
    assert result["comm"]["by_kind"].keys() == {"embedding", "cut_gradient"}
    assert set(net["wire_total"]) == {"active-passive_1", "active-passive_2"}
    # the wire carries more than the loop's messages (row ids, headers, acknowledgements)
    assert sum(net["wire_per_epoch"]["bytes"]) > result["comm"]["bytes_up"] + result["comm"]["bytes_down"]


@pytest.mark.slow
def test_launched_vlr_breast_cancer_three_parties_equals_one_process(tmp_path):
    raw = {
        "data": {"name": "breast_cancer", "parties": 3},
        "model": {"bottom": "logreg", "top": "identity"},
        "train": {"algorithm": "vlr", "epochs": 2, "batch_size": 64, "lr": 0.05},
        "seed": 1,
    }
    check_same(raw, tmp_path)


@pytest.mark.slow
def test_a_label_transform_that_sizes_the_bottoms_reaches_the_passive_process_and_equals_one_process(tmp_path):
    # labobf trains VLR by regression on one output: the passive party's bottom outputs 1 value, not the 3 classes,
    # which its process, holding no labels, learns from the active party's passive.setup
    raw = {
        "data": {"name": "wine", "parties": 2},
        "model": {"bottom": "logreg", "top": "identity"},
        "train": {"algorithm": "vlr", "epochs": 2, "batch_size": 32, "lr": 0.05},
        "defenses": [{"name": "labobf"}],
        "seed": 2,
    }
    result, _ = check_same(raw, tmp_path)
    # one float32 per row and epoch: the width the active party's label transform set
    assert result["comm"]["by_kind"]["embedding"]["up"]["bytes"] == 4 * 1 * result["data"]["n_train"] * 2


@pytest.mark.slow
def test_launched_vmask_with_its_dealer_process_equals_one_process(tmp_path):
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 600, "test_size": 200, "aux_pool": 100},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1},
        "defenses": [{"name": "vmask", "mc_epochs": 2}],
        "seed": 1,
    }
    assert party_names(build_config(raw)) == ["active", "passive_1", "dealer"]
    result, net = check_same(raw, tmp_path)
    kinds = result["comm"]["by_kind"]
    # VMask's own messages and the dealer's triples (counted at the passive party's process) are in comm
    assert {"vmask.forward", "dealer.triple"} <= kinds.keys()
    # each product (fixed_mask): P_k's triple request and the dealer's reply (neither to the active party), one round
    # trip, most of them asked ahead; then P_k's request to the active party and its reply, another; the active party
    # takes no triple half. Each masked layer (at most 2) leaves the next forward's triple, asked ahead, unused at each
    # of the 2 epochs' ends. P_k sends each product's operand in 4 row blocks (row_blocks; every batch here has more
    # than 4 rows), each a round trip of its own
    blocks = sum(kinds.get(k, {}).get("up", {}).get("rounds", 0) for k in ("vmask.forward", "vmask.backward"))
    assert blocks % 4 == 0
    products = blocks // 4
    triples = kinds["dealer.triple"]["down"]
    assert triples["messages"] == 2 * triples["rounds"] and products > 0
    assert 1 <= triples["rounds"] - products <= 2 * 2
    assert "dealer.take" not in kinds
    assert {"active-passive_1", "active-dealer", "passive_1-dealer"} <= net["wire_total"].keys()


@pytest.mark.slow
def test_launched_attacks_run_in_their_parties_processes_and_equal_one_process(tmp_path):
    # on the CPU: bit-for-bit equality needs deterministic kernels, and on an H100 two in-process runs of this config
    # already differ in the attacks' last bits (cuBLAS/cuDNN pick non-deterministic kernels unless
    # torch.use_deterministic_algorithms is set; docs/decisions/devices.md "Devices"); the tests above run on any device
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 600, "test_size": 200, "aux_pool": 100},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1, "device": "cpu"},
        "attacks": [
            {"name": "model_completion", "known_per_class": 4, "epochs": 2},
            {"name": "dmavfl", "aux_batch_size": 100},
        ],
        "seed": 2,
    }
    result, _ = check_same(raw, tmp_path)
    # model completion ran in the passive process (its bottom model), DMAVFL in the active one (its shadow,
    # compared with the victim's real model through the scorer's oracle)
    assert [a["name"] for a in result["attacks"]] == ["model_completion", "dmavfl"]
    assert "emb_mse" in result["attacks"][1]["details"]


@pytest.mark.slow
def test_launched_paillier_keeps_its_keys_in_the_active_process_and_equals_one_process(tmp_path):
    pytest.importorskip("phe")
    raw = {
        "data": {"name": "breast_cancer", "parties": 3, "train_size": 128, "test_size": 64},
        "model": {"bottom": "mlp2", "top": "mlp2", "embed_dim": 4},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.05},
        "defenses": [{"name": "paillier_he", "key_bits": 512}],
        "seed": 1,
    }
    result, _ = check_same(raw, tmp_path)
    # the passive parties' key requests arrive after the active party built its top model: the layout of both
    # parties' shares is completed then (a top without their shares would train another model)
    assert "paillier.share" in result["comm"]["by_kind"]


@pytest.mark.slow
def test_a_defended_launch_runs_its_undefended_reference_as_processes_beside_it_and_equals_one_process(tmp_path):
    """Before issue 26 the reference was launched first and the defended run after it, each paying the processes'
    start-up; now both start together, and the defended active party reads the reference's result when it scores
    its attacks (the reference is still a launched run: its net.json is there, which an in-process run has not)."""
    raw = {
        "data": {"name": "breast_cancer", "parties": 2},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 32, "lr": 0.05},
        "defenses": [{"name": "max_norm"}],
        "attacks": [{"name": "norm_scoring"}],
        "seed": 0,
    }
    result, _ = check_same(raw, tmp_path)
    reference = undefended_config(build_config(raw))
    assert (tmp_path / "many" / reference.hash() / "net.json").is_file()
    assert result["attacks"][0]["undefended_leakage"] is not None
    assert not list((tmp_path / "many").glob(".*.undefended"))  # the launcher's claim is released


@pytest.mark.slow
def test_a_party_process_from_the_fork_server_runs_the_command_with_its_output_and_exit_status(tmp_path):
    log = tmp_path / "active.log"
    process = _PartyProcess(
        party_context(),
        ["party", "run", str(tmp_path / "none.yaml"), "--party", "active", "--address", "active=127.0.0.1:1"],
        log,
    )
    assert process.wait() == 2 and process.returncode == 2
    assert "does not exist" in log.read_text()


def test_merged_comm_counts_each_message_once_from_the_counter_that_keeps_its_kind():
    loop, net = CommStats(), CommStats()
    loop.count(Message("embedding", "passive_1", "active", torch.zeros(2, 3), torch.arange(2), 0, 0))
    net.count(Message("passive.forward", "active", "passive_1", torch.zeros(0), torch.arange(2), 0, 0))
    net.count(Message("vmask.forward", "passive_1", "active", torch.zeros(4), torch.arange(0), 0, 0, role="request"))
    merged = merged_comm([(loop, lambda k: True), (net, lambda k: not k.startswith("passive."))])
    assert merged["messages"] == 2 and merged["bytes_up"] == 24 + 16 and merged["bytes_down"] == 0
    assert set(merged["by_kind"]) == {"embedding", "vmask.forward"}
    # the request's round trip is merged too, and survives a report's round trip through JSON
    assert (merged["rounds"], merged["rounds_up"]) == (1, 1) and merged["by_kind"]["vmask.forward"]["up"]["rounds"] == 1
    assert comm_from_dict(merged).by_kind["vmask.forward"]["up"].rounds == 1


def test_link_model_projects_latency_per_frame_and_bytes_over_bandwidth():
    lan = LINK_PROFILES["lan_836mbit"]
    assert project(1.0, 10, 836_000_000 // 8, lan) == pytest.approx(1.0 + 10 * 1e-4 + 1.0)
    assert project(0.0, 4, 0, LINK_PROFILES["wan_100mbit_50ms"]) == pytest.approx(0.2)


def test_a_failing_party_is_named_and_the_others_are_ended_after_the_grace(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failing = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('error: boom'); sys.exit(3)"], stdout=subprocess.DEVNULL
    )
    tic = time.monotonic()
    failed = _wait({"active": sleeper, "passive_1": failing}, timeout=60, grace=0.5, started=tic)
    assert failed == ["passive_1", "active"]
    assert time.monotonic() - tic < 10
    assert sleeper.poll() is not None


def test_a_party_that_failed_before_its_log_is_named_with_the_likely_cause(tmp_path):
    """A party process that dies while starting (e.g. a script calling launch without a `__main__` guard, whose
    party processes import the script again) has no log: the launcher says so and why, not FileNotFoundError."""

    class Exited:
        returncode = 1

    logs = {"passive_1": tmp_path / "passive_1.log", "active": tmp_path / "active.log"}
    logs["active"].write_text("error: passive_1 closed its link (noticed by active)\n")
    error = _failure(["active", "passive_1"], {"active": Exited(), "passive_1": Exited()}, logs)  # type: ignore[dict-item]
    assert str(error).startswith("party passive_1 failed first (exit 1): it exited before it wrote its log")
    assert "if __name__ == '__main__':" in str(error) and "then active (exit 1): error: passive_1 closed" in str(error)


def test_launch_refuses_what_it_cannot_run_yet(tmp_path):
    raw = {
        "data": {"name": "digits", "parties": 2},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vsnn", "epochs": 1},
    }
    with pytest.raises(ConfigError, match="cannot run VSNN"):
        launch(build_config(raw), out_dir=tmp_path, insecure=True)


def test_the_launch_command_refuses_clearly(tmp_path, cli):
    raw = {
        "data": {"name": "digits", "parties": 2},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vsnn", "epochs": 1},
    }
    (tmp_path / "exp.yaml").write_text(json.dumps(raw))
    proc = cli("launch", str(tmp_path / "exp.yaml"), "--certs", str(tmp_path), "--insecure-localhost")
    assert proc.returncode == 2 and "give --certs or --insecure-localhost, not both" in proc.stderr
    proc = cli("launch", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "cannot run VSNN" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before any process or directory


def test_launch_passes_a_named_link_shape_by_name_so_net_json_records_its_source():
    from vflbench.experiment.launch import _shape_options
    from vflbench.net.linkmodel import LinkProfile, shape_profile

    lan = shape_profile("lan")
    assert lan is not None
    options = _shape_options(lan)
    assert options == ["--shape", "lan_836mbit"]
    # what the party process makes of it: the profile with its source, not "shaped by hand"
    again = shape_profile(options[1])
    assert again == lan and again is not None and "836 Mbit/s" in again.as_dict()["source"]
    assert _shape_options(LinkProfile(20.0, 10.0)) == ["--bandwidth-mbit", "20.0", "--latency-ms", "10.0"]


@pytest.mark.slow
def test_launched_attacker_search_runs_in_the_attacks_processes_and_equals_one_process(tmp_path):
    """The passive party's model completion searches its settings in its own process; the active party's model
    inversion scores its settings on held-out auxiliary rows whose embeddings it asks the passive party for. On the
    CPU, as the launched-attacks test above (bit-for-bit equality)."""
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 600, "test_size": 200},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1, "device": "cpu"},
        "evaluation": {"attacker_search": True, "search_budget": 3},
        "attacks": [
            {"name": "model_completion", "known_per_class": 4, "epochs": 2},
            {"name": "model_inversion", "mode": "black_box", "inverse_epochs": 3, "n_targets": 40},
        ],
        "seed": 2,
    }
    result, _ = check_same(raw, tmp_path)
    assert all(a["details"]["search"]["status"] == "searched" and a["attacker_setting"] for a in result["attacks"])


@pytest.mark.slow
def test_an_attack_scored_every_epoch_snapshots_at_its_own_partys_epoch_end_and_equals_one_process(tmp_path):
    # VMask (budget 0) masks a second layer at the end of epoch 0; the attacker's snapshot of that epoch is taken at
    # its own party's end of the epoch, before the active party's decision reaches it, in one process or in many
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 600, "test_size": 200, "aux_pool": 100},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1, "device": "cpu"},
        "defenses": [{"name": "vmask", "budget": 0.0, "mc_epochs": 1}],
        "attacks": [{"name": "model_completion", "known_per_class": 4, "epochs": 2, "every_epoch": True}],
        "seed": 3,
    }
    result, _ = check_same(raw, tmp_path)
    attack = result["attacks"][0]
    assert len(attack["per_epoch"]) == 2
    assert attack["per_epoch"][-1] == attack["value"]  # the last snapshot is the final model the attack is scored on


@pytest.mark.slow
def test_launched_gradient_scrutinizer_sends_its_declared_kind_and_equals_one_process(tmp_path):
    # the detector's halves exchange gradient_scrutinizer.labels before training, a kind it declares
    # (Defense.surface; undeclared, the passive party would refuse it); its decisions are made at the passive party,
    # whose process reports them for result.json
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 400, "test_size": 100},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 32, "lr": 0.1, "device": "cpu"},
        "defenses": [{"name": "gradient_scrutinizer", "every": 5, "start": 3}],
        "seed": 4,
    }
    result, _ = check_same(raw, tmp_path)
    (entry,) = result["defense"]
    assert entry["details"]["decisions"] > 0 and set(entry["details"]["parties"]) == {"passive_1"}
    assert entry["honest_reference"]["same_run"] is True


@pytest.mark.slow
def test_launched_detector_against_a_malicious_attack_runs_its_honest_reference_beside_and_equals_one_process(
    tmp_path,
):
    raw = {
        "data": {"name": "digits", "parties": 2, "train_size": 400, "test_size": 100, "aux_pool": 80},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 32, "lr": 0.1, "device": "cpu"},
        "defenses": [{"name": "gradient_scrutinizer", "every": 5, "start": 3}],
        "attacks": [{"name": "dmavfl", "aux_batch_size": 80, "n_targets": 16}],
        "seed": 5,
    }
    result, _ = check_same(raw, tmp_path)
    reference = result["defense"][0]["honest_reference"]
    assert reference["same_run"] is False and reference["without"] == ["dmavfl"] and reference["decisions"] > 0
    assert (tmp_path / "many" / reference["config_hash"] / "result.json").is_file()  # launched beside, as processes


@pytest.mark.slow
def test_launched_vmask_with_two_passive_parties_equals_one_process(tmp_path):
    # each passive party's vmask requests follow its own vmask.setup, but the two parties' set-ups reach the active
    # party in no particular order: a request is refused only when its own sender has not set up
    raw = {
        "data": {"name": "digits", "parties": 3, "train_size": 600, "test_size": 200, "aux_pool": 100},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1, "momentum": 0.9},
        "defenses": [{"name": "vmask", "mc_epochs": 2}],
        "seed": 1,
    }
    result, _ = check_same(raw, tmp_path)
    assert {"passive_1.masked", "passive_2.masked"} <= {
        k.removeprefix("vmask.") for k in metrics(tmp_path / "one" / build_config(raw).hash())[0]
    }
