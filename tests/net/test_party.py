"""`vflbench party run`: a 2-party VHNN on digits as two processes over mutual TLS equals the in-process run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml

pytest.importorskip("grpc")
pytest.importorskip("cryptography")
from conftest import child_env

from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.party import check_party_config
from vflbench.experiment.run import train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.net import provision

RAW = {
    "data": {"name": "digits", "parties": 2},
    "model": {"bottom": "mlp2", "top": "mlp2"},
    "train": {"algorithm": "vhnn", "epochs": 2, "batch_size": 64, "lr": 0.1},
    "seed": 3,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_party_processes_over_mtls_train_exactly_the_in_process_model(tmp_path):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(RAW))
    provision(tmp_path / "certs", ["active", "passive_1"])
    port = free_port()
    env = child_env()

    def party(name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vflbench.cli",
                "party",
                "run",
                "exp.yaml",
                "--party",
                name,
                "--address",
                f"active=127.0.0.1:{port}",
                "--certs",
                str(tmp_path / "certs" / name),
                "--out",
                "out",
                "--start-timeout",
                "60",
                "--receive-timeout",
                "60",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    procs = {name: party(name) for name in ("active", "passive_1")}
    outputs = {}
    try:
        for name, proc in procs.items():
            outputs[name] = proc.communicate(timeout=120)
    finally:
        for proc in procs.values():
            proc.kill()
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, outputs[name][1][-3000:])

    cfg = build_config(RAW).resolved()
    torch.set_num_threads(1)
    reference = train_run(cfg, load_vertical_data(cfg))
    active = json.loads((tmp_path / "out" / "active.json").read_text())

    def same(record: dict) -> dict:
        return {k: v for k, v in record.items() if k != "seconds"}

    assert [same(r) for r in active["epochs"]] == [same(r) for r in reference.history.epochs]
    assert active["comm"] == reference.federation.traffic().as_dict()
    models = {
        "active.top": reference.federation.active.top,
        "active.bottom": reference.federation.active.bottom,
        "passive_1.bottom": reference.federation.passives[0].bottom,
    }
    for name, model in models.items():
        saved = torch.load(tmp_path / "out" / "checkpoints" / f"{name}.final.pt", weights_only=True)
        assert saved.keys() == model.state_dict().keys()
        for key, value in model.state_dict().items():
            assert torch.equal(saved[key], value.cpu()), (name, key)  # checkpoints are written on the CPU
    # what crossed the wire: per step a forward and a backward request with their replies, per epoch an end-of-epoch
    # request; frames carry the ids and headers the message counts leave out
    passive = json.loads((tmp_path / "out" / "passive_1.json").read_text())
    wire = active["net"]["wire"]["passive_1"]
    assert wire["bytes_sent"] == passive["net"]["wire"]["active"]["bytes_received"]
    assert wire["frames_received"] == passive["net"]["wire"]["active"]["frames_sent"]
    assert wire["bytes_received"] > active["comm"]["bytes_up"]
    assert "test accuracy" in outputs["active"][0]


def test_party_run_refuses_what_it_cannot_run_yet():
    cfg = build_config({**RAW, "train": {**RAW["train"], "algorithm": "vsnn"}})
    with pytest.raises(ConfigError, match="cannot run VSNN"):
        check_party_config(cfg)
    check_party_config(build_config({**RAW, "defenses": [{"name": "vmask"}, {"name": "paillier_he"}]}))


def test_party_run_reports_bad_input_in_one_paragraph(tmp_path, cli):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**RAW, "train": {**RAW["train"], "algorithm": "vsnn"}}))
    proc = cli(
        "party", "run", str(tmp_path / "exp.yaml"), "--party", "active", "--address", "active=127.0.0.1:0", "--insecure"
    )
    assert proc.returncode == 2 and "cannot run VSNN" in proc.stderr
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(RAW))
    proc = cli("party", "run", str(tmp_path / "exp.yaml"), "--party", "active", "--address", "active", "--insecure")
    assert proc.returncode == 2 and "--address takes NAME=HOST:PORT, got 'active'" in proc.stderr
    proc = cli(
        "party",
        "run",
        str(tmp_path / "exp.yaml"),
        "--party",
        "passive_1",
        "--address",
        "active=10.0.0.1:7000",
        "--insecure",
    )
    assert proc.returncode == 2 and "loopback addresses only" in proc.stderr


@pytest.mark.slow
def test_killing_a_party_mid_training_ends_the_other_within_seconds_naming_it(tmp_path):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**RAW, "train": {**RAW["train"], "epochs": 200}}))
    port = free_port()
    env = child_env()

    def party(name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vflbench.cli",
                "party",
                "run",
                "exp.yaml",
                "--party",
                name,
                "--address",
                f"active=127.0.0.1:{port}",
                "--insecure",
                "--start-timeout",
                "60",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    active, passive = party("active"), party("passive_1")
    try:
        assert active.stderr is not None
        for line in active.stderr:  # wait until training runs
            if "passive_1 ready; training" in line:
                break
        time.sleep(1.0)
        assert active.poll() is None, "the run ended before the kill"
        passive.kill()
        tic = time.monotonic()
        _, err = active.communicate(timeout=30)
        waited = time.monotonic() - tic
    finally:
        active.kill()
        passive.kill()
    assert active.returncode == 3, err[-2000:]
    assert waited < 5, waited
    assert "error: passive_1 failed at epoch " in err and " step " in err, err[-2000:]
