"""Provisioning: a per-project CA and one certificate per party, written safely; no unpickling in vflbench.net."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cryptography")
from conftest import child_env
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflbench.errors import ConfigError
from vflbench.net.provision import Credentials, provision

SRC = Path(__file__).resolve().parents[2] / "src"


def test_provision_writes_a_ca_and_one_named_certificate_per_party(tmp_path):
    provision(tmp_path / "p", ["active", "passive_1", "dealer"], project="bank-shop")
    ca = x509.load_pem_x509_certificate((tmp_path / "p" / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stat.S_IMODE((tmp_path / "p" / "ca-key.pem").stat().st_mode) == 0o600
    for name in ("active", "passive_1", "dealer"):
        d = tmp_path / "p" / name
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and stat.S_IMODE((d / "key.pem").stat().st_mode) == 0o600
        assert not (d / "ca-key.pem").exists()
        cert = x509.load_pem_x509_certificate((d / "cert.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "bank-shop"
        assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        ) == [name]
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
        assert Credentials.load(d).name == name


@pytest.mark.parametrize(
    ("parties", "match"),
    [
        ([], "at least one party"),
        (["active", "bob"], "'bob' is not a party name"),
        (["active", "passive_0"], "'passive_0' is not a party name"),
        (["active", "active"], "distinct"),
    ],
)
def test_provision_refuses_bad_party_lists(tmp_path, parties, match):
    with pytest.raises(ConfigError, match=match):
        provision(tmp_path / "p", parties)
    assert not (tmp_path / "p").exists()


def test_provision_never_overwrites_a_ca(tmp_path):
    provision(tmp_path / "p", ["active"])
    before = (tmp_path / "p" / "ca.pem").read_bytes()
    with pytest.raises(ConfigError, match="already exist"):
        provision(tmp_path / "p", ["passive_1"])
    assert (tmp_path / "p" / "ca.pem").read_bytes() == before and not (tmp_path / "p" / "passive_1").exists()


def test_incomplete_credentials_are_named(tmp_path):
    provision(tmp_path / "p", ["active"])
    (tmp_path / "p" / "active" / "key.pem").unlink()
    with pytest.raises(ConfigError, match="missing .*key.pem"):
        Credentials.load(tmp_path / "p" / "active")


@pytest.mark.slow
def test_the_cli_provisions_and_refuses_clearly(tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "vflbench.cli", "net", "provision", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )

    ok = cli(str(tmp_path / "p"), "--parties", "active,passive_1,dealer")
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "active",
        "ca-key.pem",
        "ca.pem",
        "dealer",
        "passive_1",
    ]
    again = cli(str(tmp_path / "p"), "--parties", "active")
    assert again.returncode == 2 and "already exist" in again.stderr


BANNED = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}


def test_nothing_in_vflbench_net_can_unpickle():
    """A static guard beside the audit-hook test: no pickle-family import, no torch.load, no numpy allow_pickle."""
    for path in sorted((SRC / "vflbench" / "net").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & BANNED, (path, node.lineno)
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in BANNED, (path, node.lineno)
            if isinstance(node, ast.Attribute):
                assert (
                    node.attr not in {"load", "loads", "Unpickler"}
                    or not isinstance(node.value, ast.Name)
                    or node.value.id not in {"torch", "np", "numpy"}
                ), (path, node.lineno)
            if isinstance(node, ast.keyword):
                assert node.arg != "allow_pickle", (path, node.lineno)
