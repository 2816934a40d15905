"""The per-role defense example of docs/extending.md runs as written: registered under one name, each party builds
its role's half, and the halves talk through messages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import child_env

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"

RUN = """
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.experiment.party import party_policy
from vflbench.experiment.scenario import plan_defenses
from conftest import minimal

cfg = build_config(minimal(train={"epochs": 2}, defenses=[{"name": "norm_gate", "limit": LIMIT}]))
plan = plan_defenses(cfg, ["passive_1"])
result = run_experiment(cfg, out_dir=OUT)
metrics = [json.loads(line) for line in (OUT / cfg.hash() / "metrics.jsonl").read_text().splitlines()]
print(json.dumps({
    "halves": [type(plan.active[0]).__name__, type(plan.passive["passive_1"][0]).__name__],
    "refused": metrics[-1].get("norm_gate.refused"),
    "refused_updates": sum(m.get("refused_updates", 0) for m in metrics),
    "kinds": sorted(result.comm["by_kind"]),
    "served_by_active": party_policy(cfg).serves("active"),
}))
"""


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return next(b for b in blocks if "class NormGate(Defense)" in b)


def _run(limit: float, out: Path) -> dict:
    code = "import json\nfrom pathlib import Path\n" + _example()
    code += RUN.replace("LIMIT", repr(limit)).replace("OUT", f"Path({str(out)!r})")
    env = child_env(PYTHONPATH=f"{Path(__file__).parent}:{child_env()['PYTHONPATH']}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_per_role_example_builds_each_half_at_its_party_and_they_talk_through_messages(tmp_path):
    gated = _run(
        1e-6, tmp_path / "gated"
    )  # every cut gradient is above the limit: every update is refused and reported
    assert gated["halves"] == ["NormGateActive", "NormGatePassive"]
    assert gated["refused"] == gated["refused_updates"] > 0
    assert "norm_gate.refused" in gated["kinds"]
    assert "norm_gate.refused" in gated["served_by_active"]  # across processes: declared, so let through
    open_gate = _run(1e9, tmp_path / "open")
    assert open_gate["refused"] == open_gate["refused_updates"] == 0
