"""train.device: its choices and errors, the CPU plumbing that CI can check, and (on a GPU) CUDA runs.

CI has no GPU. What it checks here: the option and its one-line errors, that a CPU run equals the default run bit
for bit, that a federation built on ``meta`` (a device with no data) holds every model, buffer and data tensor
there (a forgotten ``.to(device)`` leaves a CPU tensor behind), and that generators never move off the CPU.
The CUDA tests run where a GPU is (``benchmarks/gpu_check.py`` runs this file on one).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import minimal
from torch import nn

from vflbench.data import VerticalData
from vflbench.devices import DEVICE_ENV, resolve_device
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.models import build_bottom, init_parameters
from vflbench.net.transport import _placed
from vflbench.protocol.messages import Message, passive_names
from vflbench.rng import generator

SRC = Path(__file__).resolve().parents[1] / "src" / "vflbench"
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.py runs it)")
META = torch.device("meta")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script in a fresh process with no GPU visible (as on a machine without CUDA)."""
    return subprocess.run(
        [sys.executable, "-m", "vflbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def test_device_choices_are_checked_with_a_clear_message():
    assert build_config(minimal(train={"device": "cuda:1"})).train.device == "cuda:1"
    with pytest.raises(ConfigError, match=r"train\.device: must be one of auto, cpu, cuda, cuda:N .*got 'gpu'"):
        build_config(minimal(train={"device": "gpu"}))


def test_the_device_is_not_part_of_the_config_hash():
    hashes = {build_config(minimal(train={"device": d})).hash() for d in ("auto", "cpu", "cuda", "cuda:3")}
    assert len(hashes) == 1
    assert build_config(minimal()).hash() == hashes.pop()


def test_cuda_on_a_machine_without_cuda_is_a_one_line_error(tmp_path):
    proc = cli("run", "configs/demo.yaml", "--device", "cuda", "--out", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "train.device 'cuda' asks for a CUDA GPU" in lines[0] and "use cpu or auto" in lines[0]
    assert not any(tmp_path.iterdir())  # refused before anything was trained or written


def test_auto_follows_the_environment_variable(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ConfigError, match=r"\$VFLBENCH_DEVICE must be cpu, cuda or cuda:N"):
        resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu")  # an explicit device does not read it


@pytest.mark.skipif(resolve_device("auto").type != "cpu", reason="the default run is on a GPU here")
def test_a_cpu_run_equals_the_default_run_bit_for_bit(tmp_path):
    default = run_experiment(build_config(minimal(train={"epochs": 2})), out_dir=tmp_path / "a")
    cpu = run_experiment(build_config(minimal(train={"epochs": 2, "device": "cpu"})), out_dir=tmp_path / "b")
    assert default.config_hash == cpu.config_hash
    assert cpu.utility.per_epoch == default.utility.per_epoch and cpu.device == default.device == "cpu"
    run_dir = tmp_path / "b" / cpu.config_hash
    assert json.loads((run_dir / "result.json").read_text())["device"] == "cpu"
    assert json.loads((run_dir / "env.json").read_text())["device"] == "cpu"
    for name in ("active.top.final.pt", "passive_1.bottom.final.pt"):
        a = torch.load(tmp_path / "a" / default.config_hash / "checkpoints" / name)
        b = torch.load(run_dir / "checkpoints" / name)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_cli_runs_on_the_cpu_when_asked(tmp_path):
    proc = cli(
        "run",
        "configs/demo.yaml",
        "--device",
        "cpu",
        "--set",
        "train.epochs=1",
        "--set",
        "baselines=[]",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    [run_dir] = tmp_path.iterdir()
    assert json.loads((run_dir / "result.json").read_text())["device"] == "cpu"


def _tensors_of(fed) -> dict[str, torch.Tensor]:
    """Every parameter, buffer and data tensor the federation's parties hold, by a readable name."""
    out: dict[str, torch.Tensor] = {}
    for party in fed.parties():
        for role, model in party.models().items():
            out.update({f"{party.name}.{role}.{k}": v for k, v in model.state_dict().items()})
            out.update({f"{party.name}.{role}.{k}": v for k, v in model.named_parameters()})
        if party.data is not None:
            out[f"{party.name}.x_train"], out[f"{party.name}.x_test"] = party.data.x_train, party.data.x_test
    out["active.targets"] = fed.active.objective.targets
    return out


@pytest.mark.parametrize(
    "defenses",
    [
        [],
        [{"name": "fedpass"}, {"name": "dp_laplace"}, {"name": "embedding_noise"}, {"name": "splitguard"}],
        [{"name": "mid", "weight": 0.1}, {"name": "dcor"}, {"name": "received_gradient_dp"}],
        [{"name": "precode"}, {"name": "nopeek"}, {"name": "gradient_compression"}, {"name": "discrete_sgd"}],
        [{"name": "gradient_scrutinizer"}, {"name": "mixup"}, {"name": "isotropic_noise"}, {"name": "max_norm"}],
        [{"name": "marvell"}],
    ],
    ids=["vanilla", "fedpass", "mid", "precode", "mixup", "marvell"],
)
def test_a_federation_built_on_a_device_holds_everything_there(defenses):
    """Built on ``meta``: every model (the defenses' own layers too), buffer, data slice and target is there.

    Defenses that compute with values while the federation is built (the label transforms, VMask's masking,
    Paillier's encryption, CoAE's autoencoder) cannot be built on ``meta``; the CUDA tests cover them."""
    raw = minimal(defenses=defenses)
    if any(d["name"] == "marvell" for d in defenses):
        raw["data"] = {"name": "breast_cancer", "parties": 2}
    cfg = build_config(raw).resolved()
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, passive_names(len(vd.passive))), device=META)
    tensors = _tensors_of(fed)
    assert len(tensors) > 8
    elsewhere = {k: str(v.device) for k, v in tensors.items() if v.device != META}
    assert elsewhere == {}
    for group in fed.active.optimizer.param_groups:
        assert all(p.device == META for p in group["params"])


def test_the_check_sees_a_tensor_left_behind():
    """The check above can fail: a layer added after the move stays on the CPU and is reported."""
    cfg = build_config(minimal()).resolved()
    fed = build_federation(cfg, load_vertical_data(cfg), device=META)
    fed.active.top = nn.Sequential(fed.active.top, nn.Linear(10, 10))
    assert any(v.device != META for v in _tensors_of(fed).values())


def test_data_moves_once_and_row_ids_stay_on_the_cpu():
    cfg = build_config(minimal(data={"name": "digits", "parties": 3}, train={"device": "cpu"})).resolved()
    vd = load_vertical_data(cfg)
    assert vd.device == torch.device("cpu")  # as loaded (auto would move it to a GPU where there is one)
    moved = vd.to(META)
    assert isinstance(moved, VerticalData) and moved.device == META
    assert all(p.x_train.device == META and p.x_test.device == META for p in (*moved.passive, moved.active))
    assert moved.to(META) is moved and vd.to("cpu") is vd  # already there: nothing is copied
    granted = vd.passive[0]
    rows = torch.tensor([3, 1])
    from vflbench.experiment.scenario import shape_only

    part = shape_only(granted, rows=rows).to(META)
    assert part.x_train.device == META and part.rows is not None and part.rows.device.type == "cpu"


def test_models_are_seeded_on_the_cpu_whatever_their_device():
    """init_parameters draws on the CPU and copies in: a model's initial weights do not depend on its device."""
    cfg = build_config(minimal()).resolved()
    part = load_vertical_data(cfg).passive[0]
    on_cpu = build_bottom("mlp2", part, 16, generator(0, "x"))
    on_meta = build_bottom("mlp2", part, 16, generator(0, "x"), device=META)
    assert all(p.device == META for p in on_meta.parameters())
    again = init_parameters(nn.Sequential(nn.Linear(32, 16)), generator(0, "y"))
    assert torch.equal(again[0].weight, init_parameters(nn.Sequential(nn.Linear(32, 16)), generator(0, "y"))[0].weight)
    assert [p.shape for p in on_cpu.parameters()] == [p.shape for p in on_meta.parameters()]


def test_received_tensors_land_on_the_party_device_but_ids_and_bytes_stay():
    message = Message(
        "embedding",
        "passive_1",
        "active",
        torch.ones(2, 3),
        torch.tensor([4, 5]),
        extra=(torch.zeros(2, dtype=torch.int64), torch.zeros(4, dtype=torch.uint8)),
    )
    placed = _placed(message, "meta")
    assert placed.payload.device == META and placed.extra[0].device == META
    assert placed.ids.device.type == "cpu" and placed.extra[1].device.type == "cpu"
    assert _placed(message, None) is message and _placed(message, "cpu") is message


def _random_calls(root: Path = SRC) -> list[str]:
    """Calls in src/ that would make a generator or a random draw on a device (the rule: CPU generators, CPU draws,
    then ``.to``)."""
    draws = {"randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "random_", "exponential_"}
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            kwargs = {k.arg for k in node.keywords}
            where = f"{path.relative_to(root)}:{node.lineno}"
            owner = getattr(node.func.value, "id", "") if isinstance(node.func, ast.Attribute) else ""
            if name == "Generator" and owner == "torch" and (node.args or "device" in kwargs):
                bad.append(f"{where}: a generator on a device")
            if name in draws and "generator" in kwargs and "device" in kwargs:
                bad.append(f"{where}: {name} draws on a device")
    return bad


def test_generators_and_draws_stay_on_the_cpu(tmp_path):
    assert _random_calls() == []
    bad = tmp_path / "bad.py"  # the check itself finds both kinds
    bad.write_text("import torch\ng = torch.Generator(device='cuda')\nx = torch.randn(3, generator=g, device='cuda')\n")
    assert len(_random_calls(tmp_path)) == 2


# -- on a GPU -----------------------------------------------------------------------------------------------


@CUDA
def test_a_cuda_run_starts_from_the_cpu_run_weights_and_ends_close_to_it(tmp_path):
    runs = {
        d: run_experiment(build_config(minimal(train={"epochs": 3, "device": d})), out_dir=tmp_path / d)
        for d in ("cpu", "cuda")
    }
    assert runs["cuda"].device.startswith("cuda") and runs["cpu"].device == "cpu"
    assert runs["cuda"].config_hash == runs["cpu"].config_hash
    cfg = build_config(minimal(train={"device": "cuda"})).resolved()
    vd = load_vertical_data(cfg)
    assert vd.device.type == "cuda"
    on_gpu = build_federation(cfg, vd)
    on_cpu = build_federation(
        cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": "cpu"})}), vd.to("cpu")
    )
    for a, b in zip(_tensors_of(on_gpu).values(), _tensors_of(on_cpu).values(), strict=True):
        assert a.device.type == "cuda" and torch.equal(a.cpu(), b)  # the same draws, data and initial weights
    assert abs(runs["cuda"].utility.value - runs["cpu"].utility.value) < 0.05


@CUDA
def test_vmask_trains_on_cuda_as_on_the_cpu(tmp_path):
    raw = minimal(
        data={"aux_pool": 64},
        train={"epochs": 2, "batch_size": 32},  # VMask's shadow set: held out
        defenses=[{"name": "vmask", "aux_size": 64, "mc_epochs": 2}],
    )
    runs = {
        d: run_experiment(build_config({**raw, "train": {**raw["train"], "device": d}}), out_dir=tmp_path / d)
        for d in ("cpu", "cuda")
    }
    assert abs(runs["cuda"].utility.value - runs["cpu"].utility.value) < 0.05
    assert runs["cuda"].comm == runs["cpu"].comm  # the same protocol, message for message, byte for byte
