"""Hostile parties against real ones (issue 28): a party serves only what the run grants and checks everything it
receives. A fake active party (a bare NetChannel holding the active party's certificate) probes a real passive
party's process; a fake passive party answers a real active party with bad embeddings, oversized or deeply nested
reports, replies for the wrong step, or a forged abort. Each case ends in a refusal that the refusing party logs and
that names the peer, as a NetError (the command line's exit 3, one line, no traceback), within seconds; the same
probe is served, logged and recorded when the run's plan grants it."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("grpc")
pytest.importorskip("cryptography")
from conftest import child_env

from vflbench.defenses.vmask import VMask
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.party import local_state, party_policy, run_party, to_bytes_tensor
from vflbench.net import Credentials, NetChannel, NetError, NetOptions, PeerFailed, ProtocolError, provision
from vflbench.net.frames import MAX_JSON_BYTES
from vflbench.net.policy import SURFACE, Policy, requests
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.grants import Grant
from vflbench.protocol.messages import Message

RAW = {
    "data": {"name": "digits", "parties": 2, "train_size": 200, "test_size": 64},
    "model": {"bottom": "mlp2", "top": "mlp2"},
    "train": {"algorithm": "vhnn", "epochs": 1, "batch_size": 64, "lr": 0.1},
    "seed": 7,
}
#: DMAVFL is scored against the victim's real bottom model: this plan grants passive.oracle_bottom
GRANTING = {
    **RAW,
    "data": {**RAW["data"], "aux_pool": 40},
    "attacks": [{"name": "dmavfl", "aux_batch_size": 40, "n_targets": 16}],
}
FAST = NetOptions(keepalive_ms=1000, keepalive_timeout_ms=1000, receive_timeout=20, start_timeout=20, close_timeout=2)
ORACLE = Grant("passive.oracle_bottom", "passive_1", "active")
#: a fake active party's own table lets it send anything (the real party's table is what is tested)
ANYTHING = Policy([*SURFACE, *VMask.surface, *requests(("passive.flood",), "active", "passive")], [ORACLE])


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("certs")
    provision(root, ["active", "passive_1"])
    return root


def channels(certs: Path, cfg: Any, *, policies: dict[str, Policy]) -> dict[str, NetChannel]:
    """The active party's channel (listening on a free port) and passive_1's, for the run of ``cfg``."""
    parties = ["active", "passive_1"]
    active = NetChannel(
        name="active",
        run=cfg.hash(),
        parties=parties,
        addresses={"active": "127.0.0.1:0"},
        credentials=Credentials.load(certs / "active"),
        policy=policies.get("active", party_policy(cfg)),
        options=FAST,
    )
    address = active.listen()
    assert address is not None
    passive = NetChannel(
        name="passive_1",
        run=cfg.hash(),
        parties=parties,
        addresses={"active": address},
        credentials=Credentials.load(certs / "passive_1"),
        policy=policies.get("passive_1", party_policy(cfg)),
        options=FAST,
    )
    return {"active": active, "passive_1": passive}


def run_both(parties: dict[str, Callable[[], Any]], timeout: float = 60) -> dict[str, Any]:
    """Run each party on its own thread; its result, or the exception it raised. No party may hang."""
    results: dict[str, Any] = {}

    def wrap(name: str, fn: Callable[[], Any]) -> None:
        try:
            results[name] = fn()
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=wrap, args=item, daemon=True) for item in parties.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"a party still runs after {timeout} s: {results}"
    return results


def own_shape(cfg: Any) -> tuple[int, ...]:
    return tuple(local_state(cfg, "passive_1").data.part.x_train.shape[1:])


def one_hot_probes(cfg: Any) -> torch.Tensor:
    """What a curious active party would send to extract the passive party's bottom model: one-hot inputs."""
    shape = own_shape(cfg)
    n = int(torch.tensor(shape).prod())
    return torch.eye(n).reshape(n, *shape)


# ------------------------------------------------------------------ a hostile active party


def fake_active(ch: NetChannel, probe: Callable[[Any], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with ch as c:
            e = c.endpoint("active")
            e.post("passive.setup", "passive_1", meta={"embed_dim": 16})
            e.take("passive.ready", "passive_1")
            return probe(e)

    return run


def test_a_passive_party_refuses_an_ungranted_query_of_its_bottom_model_logs_it_and_names_the_peer(certs, caplog):
    cfg = build_config(RAW).resolved()
    ch = channels(certs, cfg, policies={"active": ANYTHING})
    x = one_hot_probes(cfg)
    tic = time.monotonic()
    with caplog.at_level(logging.INFO, logger="vflbench"):
        r = run_both(
            {
                "passive_1": lambda: run_party(cfg, party="passive_1", channel=ch["passive_1"]),
                "active": fake_active(
                    ch["active"], lambda e: e.call("passive.oracle_bottom", "passive_1", x, phase="eval")
                ),
            }
        )
    assert time.monotonic() - tic < 30
    passive, active = r["passive_1"], r["active"]
    # the passive party's own error: a protocol error (exit 3, one line) naming the peer and why
    assert isinstance(passive, ProtocolError), passive
    assert "passive_1 refused a frame from active" in str(passive)
    assert "'passive.oracle_bottom'" in str(passive) and "evaluation-only" in str(passive)
    assert "this run grants none" in str(passive)
    # logged by the refusing party; the prober got a refusal, not the model's outputs
    assert "party passive_1 refused a frame from active" in caplog.text
    assert "served an evaluation-only query" not in caplog.text
    assert isinstance(active, PeerFailed) and active.party == "passive_1"
    assert "refused a frame from active" in str(active)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("passive.flood", "may not send 'passive.flood' as a request"),  # a kind outside the protocol's surface
        # a defense's kind in a run without that defense: not on this run's surface (the defense declares it)
        ("vmask.select", "may not send 'vmask.select' as a request to passive_1"),
        ("dealer.take", "may not send 'dealer.take' as a request to passive_1"),  # a kind another role serves
    ],
)
def test_a_passive_party_refuses_a_kind_its_role_or_run_does_not_serve(certs, caplog, kind, expected):
    cfg = build_config(RAW).resolved()
    policy = Policy([*ANYTHING.rules, *requests(("dealer.take",), "active", "passive")])
    ch = channels(certs, cfg, policies={"active": policy})
    with caplog.at_level(logging.ERROR, logger="vflbench"):
        r = run_both(
            {
                "passive_1": lambda: run_party(cfg, party="passive_1", channel=ch["passive_1"]),
                "active": fake_active(ch["active"], lambda e: e.call(kind, "passive_1", torch.ones(2))),
            }
        )
    assert isinstance(r["passive_1"], ProtocolError) and expected in str(r["passive_1"]), r
    assert (
        "party passive_1 refused a frame from active" in caplog.text
        or "party passive_1 refused what active sent" in caplog.text
    )
    assert isinstance(r["active"], PeerFailed) and r["active"].party == "passive_1"


def test_a_granted_query_is_served_logged_and_recorded_by_the_passive_party(certs, caplog):
    cfg = build_config(GRANTING).resolved()
    assert [g.kind for g in local_state(cfg, "passive_1").grants] == ["passive.oracle_bottom"]
    ch = channels(certs, cfg, policies={"active": ANYTHING})
    x = one_hot_probes(cfg)

    def probe(e: Any) -> torch.Tensor:
        out = e.call("passive.oracle_bottom", "passive_1", x, phase="eval").payload
        e.post("passive.done", "passive_1")
        e.take("passive.report", "passive_1")
        return out

    with caplog.at_level(logging.INFO, logger="vflbench"):
        r = run_both(
            {
                "passive_1": lambda: run_party(cfg, party="passive_1", channel=ch["passive_1"]),
                "active": fake_active(ch["active"], probe),
            }
        )
    out, summary = r["active"], r["passive_1"]
    assert isinstance(out, torch.Tensor) and out.shape == (len(x), 16), r
    assert summary["grants"] == [
        {
            "kind": "passive.oracle_bottom",
            "server": "passive_1",
            "client": "active",
            "for": ["dmavfl"],
            "status": "granted",
            "served": 1,
        }
    ]
    assert (
        f"passive_1: served an evaluation-only query of its bottom model to active ({len(x)} rows; query 1; "
        "granted for dmavfl)" in caplog.text
    )
    # the same query with a malformed input (not the passive party's slice) is refused, not answered
    ch = channels(certs, cfg, policies={"active": ANYTHING})
    r = run_both(
        {
            "passive_1": lambda: run_party(cfg, party="passive_1", channel=ch["passive_1"]),
            "active": fake_active(
                ch["active"], lambda e: e.call("passive.oracle_bottom", "passive_1", torch.ones(3, 5), phase="eval")
            ),
        }
    )
    assert isinstance(r["passive_1"], ProtocolError), r
    assert "active sent passive.oracle_bottom inputs of shape (3, 5); expected (3, " in str(r["passive_1"])


def test_a_passive_party_can_refuse_a_granted_query_and_the_scorer_says_what_it_could_not_compute(
    certs, tmp_path, caplog
):
    cfg = build_config(GRANTING).resolved()
    ch = channels(certs, cfg, policies={})
    with caplog.at_level(logging.INFO, logger="vflbench"):
        r = run_both(
            {
                "active": lambda: run_party(cfg, party="active", channel=ch["active"], out_dir=tmp_path),
                "passive_1": lambda: run_party(cfg, party="passive_1", channel=ch["passive_1"], refuse_grants=True),
            },
            timeout=120,
        )
    assert not any(isinstance(v, BaseException) for v in r.values()), r
    refused = {
        "kind": "passive.oracle_bottom",
        "server": "passive_1",
        "client": "active",
        "for": ["dmavfl"],
        "status": "refused by passive_1",
    }
    assert r["active"]["grants"] == [refused] and r["passive_1"]["grants"] == [{**refused, "served": 0}]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["grants"] == [refused]
    (dmavfl,) = result["attacks"]
    assert "emb_mse" not in dmavfl["details"] and "mse" in dmavfl["details"]
    assert "passive_1 refused evaluation-only queries" in dmavfl["details"]["not_computed"]["emb_mse"]
    assert "passive_1 refuses passive.oracle_bottom from active to passive_1 (for dmavfl)" in caplog.text
    with pytest.raises(ConfigError, match="--refuse-grants is a passive party's choice"):
        run_party(cfg, party="active", channel=channels(certs, cfg, policies={})["active"], refuse_grants=True)


ORACLE_PROBE = """
import sys, torch
from pathlib import Path
from vflbench.net import Credentials, NetChannel, NetOptions, PeerFailed
from vflbench.net.policy import SURFACE, Policy
from vflbench.protocol.grants import Grant
c = NetChannel(name="active", run=sys.argv[1], parties=["active", "passive_1"], addresses={"active": sys.argv[2]},
               credentials=Credentials.load(Path(sys.argv[3])), options=NetOptions(start_timeout=60),
               policy=Policy(SURFACE, [Grant("passive.oracle_bottom", "passive_1", "active")]))
try:
    with c:
        e = c.endpoint("active")
        e.post("passive.setup", "passive_1", meta={"embed_dim": 16})
        e.take("passive.ready", "passive_1")
        e.call("passive.oracle_bottom", "passive_1", torch.eye(32).reshape(32, 1, 8, 4), phase="eval")
        print("ANSWERED")
except PeerFailed as exc:
    print("REFUSED", exc)
"""


def test_a_real_party_run_process_refuses_the_probe_with_exit_3_and_one_line_no_traceback(certs, tmp_path):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(RAW))
    cfg = build_config(RAW).resolved()
    from vflbench.experiment.launch import free_port

    address = f"127.0.0.1:{free_port()}"
    env = child_env()
    prober = subprocess.Popen(
        [sys.executable, "-c", ORACLE_PROBE, cfg.hash(), address, str(certs / "active")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    passive = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vflbench.cli",
            "party",
            "run",
            "exp.yaml",
            "--party",
            "passive_1",
            "--address",
            f"active={address}",
            "--certs",
            str(certs / "passive_1"),
            "--start-timeout",
            "60",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = passive.communicate(timeout=120)
        said, _ = prober.communicate(timeout=30)
    finally:
        passive.kill()
        prober.kill()
    assert passive.returncode == 3, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "party passive_1 refused a frame from active" in err  # the log line
    assert "error: passive_1 refused a frame from active: active (active) may not send 'passive.oracle_bottom'" in err
    assert said.startswith("REFUSED passive_1 failed") and "ANSWERED" not in said, said


# ------------------------------------------------------------------ a hostile passive party


def honest(request: Message, e: Endpoint) -> Message:
    """What an honest passive party answers, as far as the active party can tell (zeros)."""
    if request.kind == "passive.forward":
        return embedding(request, e, torch.zeros(len(request.ids), 16))
    if request.kind == "passive.backward":
        e.take("cut_gradient", "active")
        return request.reply(meta={"applied": True})
    if request.kind == "passive.end_epoch":
        return request.reply(to_bytes_tensor({"report": {}, "wire": {}}))
    return request.reply(meta={"committed": -1})


def embedding(request: Message, e: Endpoint, payload: torch.Tensor) -> Message:
    """Post ``payload`` as the embedding the ``passive.forward`` request asked for; the empty reply."""
    e.post("embedding", "active", payload, ids=request.ids, epoch=request.epoch, step=request.step, phase=request.phase)
    return request.reply()


Answer = Callable[[Message, Endpoint], Message]


def fake_passive(ch: NetChannel, answer: Answer) -> Callable[[], None]:
    def run() -> None:
        with ch as c:
            e = c.endpoint("passive_1")
            e.take("passive.setup", "active")
            e.serve("passive", lambda request: answer(request, e))
            e.post("passive.ready", "active")
            e.take("passive.done", "active")

    return run


def on(kind: str, bad: Answer) -> Answer:
    return lambda request, e: bad(request, e) if request.kind == kind else honest(request, e)


def forward_reply(payload: Callable[[int], torch.Tensor]) -> Answer:
    return on("passive.forward", lambda r, e: embedding(r, e, payload(len(r.ids))))


def end_epoch_reply(raw: bytes) -> Answer:
    return on("passive.end_epoch", lambda r, e: r.reply(torch.frombuffer(bytearray(raw), dtype=torch.uint8)))


HOSTILE_PASSIVE = {
    "bad-shape embedding": (
        forward_reply(lambda n: torch.zeros(n + 3, 21)),
        "passive_1 sent an embedding of 64 rows of shape (67, 21); expected (64, 16)",
    ),
    "integer embedding": (
        forward_reply(lambda n: torch.zeros(n, 16, dtype=torch.int64)),
        "passive_1 sent an embedding of 64 rows of dtype torch.int64; expected torch.float32",
    ),
    "non-finite embedding": (
        forward_reply(lambda n: torch.full((n, 16), float("nan"))),
        "passive_1 sent an embedding of 64 rows with 1024 non-finite values",
    ),
    "embedding for another step": (
        on(
            "passive.forward",
            lambda r, e: (
                embedding(dataclasses.replace(r, step=r.step + 1), e, torch.zeros(len(r.ids), 16)) and r.reply()
            ),
        ),
        "passive_1 sent an embedding for train epoch 0 step 1 (64 rows) when train epoch 0 step 0 (64 rows) was "
        "asked for",
    ),
    "oversized report": (
        end_epoch_reply(b'"' + b"a" * MAX_JSON_BYTES + b'"'),
        f"passive_1's end-of-epoch report of epoch 0: a report of {MAX_JSON_BYTES + 2} bytes "
        f"exceeds the limit of {MAX_JSON_BYTES} bytes",
    ),
    "deeply nested report": (
        end_epoch_reply(b"[" * 200_000 + b"]" * 200_000),
        "a report nested 200000 levels deep exceeds the limit of 32 levels",
    ),
    "report of the wrong form": (
        end_epoch_reply(b'{"report": [], "wire": 5}'),
        "passive_1's end-of-epoch report must be an object with a 'report' object",
    ),
    "reply for the wrong step": (
        on(
            "passive.forward",
            lambda r, e: dataclasses.replace(embedding(r, e, torch.zeros(len(r.ids), 16)), epoch=99, step=99),
        ),
        "passive_1 answered call 1 ('passive.forward', train epoch 0 step 0) with a 'passive.forward' reply for "
        "train epoch 99 step 99",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_PASSIVE))
def test_the_active_party_refuses_a_hostile_passive_partys_answers_naming_it(certs, caplog, case):
    answer, expected = HOSTILE_PASSIVE[case]
    cfg = build_config(RAW).resolved()
    ch = channels(certs, cfg, policies={})
    tic = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="vflbench"):
        r = run_both(
            {
                "active": lambda: run_party(cfg, party="active", channel=ch["active"]),
                "passive_1": fake_passive(ch["passive_1"], answer),
            }
        )
    assert time.monotonic() - tic < 40
    active = r["active"]
    assert isinstance(active, ProtocolError), active  # a NetError: the command line's exit 3, one line
    assert str(active).startswith(("active refused what passive_1 sent", "active refused a frame from passive_1"))
    assert expected in str(active), str(active)
    assert (
        "party active refused what passive_1 sent" in caplog.text
        or "party active refused a frame from passive_1" in caplog.text
    )
    # the hostile party is told: it hears that active ended the run over what it sent
    assert isinstance(r["passive_1"], PeerFailed) and r["passive_1"].party == "active", r["passive_1"]


def test_a_forged_abort_origin_is_charged_to_the_authenticated_peer(certs, caplog):
    cfg = build_config(RAW).resolved()
    ch = channels(certs, cfg, policies={})
    from vflbench.net.frames import Frame

    def forge(request: Message, e: Endpoint) -> Message:
        link = ch["passive_1"]._links["active"]  # a raw abort frame that blames another party
        ch["passive_1"]._put(
            link,
            Frame(
                "abort",
                receiver="active",
                run=cfg.hash(),
                meta={"origin": "dealer", "epoch": 3, "step": 4, "reason": "the dealer crashed, honestly"},
            ),
        )
        return honest(request, e)

    with caplog.at_level(logging.ERROR, logger="vflbench"):
        r = run_both(
            {
                "active": lambda: run_party(cfg, party="active", channel=ch["active"]),
                "passive_1": fake_passive(ch["passive_1"], on("passive.forward", forge)),
            }
        )
    active = r["active"]
    assert isinstance(active, PeerFailed) and isinstance(active, NetError), active
    assert active.party == "passive_1" and active.origin == "dealer"
    assert str(active).startswith("passive_1 reports that dealer failed at epoch 3 step 4: the dealer crashed")
    assert "party active aborts: passive_1 reports that dealer failed" in caplog.text


def test_a_runs_surface_is_the_loops_kinds_plus_those_its_defenses_declare():
    plain = party_policy(build_config(RAW).resolved())
    vmask = party_policy(build_config({**RAW, "defenses": [{"name": "vmask_alls"}]}).resolved())
    assert "vmask.forward" in vmask.serves("active") and "vmask.forward" not in plain.serves("active")
    assert vmask.serves("dealer") and not plain.serves("dealer")  # no dealer kinds, no links to a dealer
    assert vmask.serves("passive_1") == [*plain.serves("passive_1"), "vmask.select"]
    with pytest.raises(ProtocolError, match="may not send 'vmask.forward' as a request to active"):
        plain.check("vmask.forward", "passive_1", "active", "request")
    vmask.check("vmask.forward", "passive_1", "active", "request")
