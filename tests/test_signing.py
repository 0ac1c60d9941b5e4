"""Signed packs: Ed25519 over the manifest; --require-signed and a trusted-keys list; tampering refused."""

from __future__ import annotations

import json
import zipfile

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.app.library_view import LibraryView
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.service import LibraryService, open_library
from kvgraft.entry import cli
from kvgraft.library.pack import PackError, PackReader
from kvgraft.library.signing import generate_key, sign_manifest
from tests import pack_mutations as pm


@pytest.fixture
def run(engine, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return CliRunner().invoke


@pytest.fixture
def signed_pack(run, tmp_path):
    assert (
        run(
            cli,
            [
                "deposit",
                "--text",
                "Seven orange windows face the quiet harbor.",
                "--question",
                "How many windows?",
                "--answer",
                "7",
            ],
        ).exit_code
        == 0
    )
    r = run(cli, ["keys", "generate", "alice"])
    assert r.exit_code == 0, r.output
    pub = r.stdout.split("public key (give this to people who import your packs): ")[1].strip()
    out = tmp_path / "signed.kvpack"
    r = run(cli, ["export", "--all", "-o", str(out), "--sign", "alice", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["signed_by"]
    return out, pub


def test_signed_pack_verifies_and_is_recorded(signed_pack, run, tmp_path, monkeypatch):
    path, pub = signed_pack
    with PackReader(path) as reader:
        assert reader.signer is not None and reader.signer.public_key_b64 == pub
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path / "other"))
    r = run(cli, ["import", str(path), "--require-signed"])
    assert r.exit_code == 3 and "not in your trusted keys" in r.stderr
    assert run(cli, ["keys", "trust", pub, "--name", "alice"]).exit_code == 0
    r = run(cli, ["import", str(path), "--require-signed"])
    assert r.exit_code == 0, r.output
    assert "signed by" in r.stdout
    shown = run(cli, ["show", "1"]).stdout
    assert "signed by" in shown and "(alice)" in shown
    # the app's table says the same: the trusted key's name (library/views.py rows, app/library_view.py words)
    view = LibraryView(tmp_path / "other")
    try:
        [row] = view.rows(None)
        assert row.source == f"{path.name} (signed alice)" and row.proof == "signed:alice"
        assert run(cli, ["keys", "untrust", row.signer]).exit_code == 0
        assert view.rows(None)[0].source == f"{path.name} (signed, key not trusted here)"
    finally:
        view.close()


def test_unsigned_pack_says_so_and_require_signed_refuses(run, tmp_path, monkeypatch):
    assert run(cli, ["deposit", "--text", "A lone lighthouse."]).exit_code == 0
    out = tmp_path / "plain.kvpack"
    assert run(cli, ["export", "--all", "-o", str(out)]).exit_code == 0
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path / "other"))
    r = run(cli, ["import", str(out), "--require-signed", "--json"])
    assert r.exit_code == 3 and "not signed" in json.loads(r.stdout)["refused"][0]["reason"]
    assert run(cli, ["import", str(out)]).exit_code == 0  # unsigned packs still import by default
    assert "unsigned" in run(cli, ["show", "1"]).stdout


def test_tampered_manifest_refused(signed_pack, engine, tmp_path):
    path, _ = signed_pack
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        members = [(n, z.read(n)) for n in z.namelist() if n != "manifest.json"]
    manifest["entries"][0]["answer"] = "8"  # change the verified answer, keep the old signature
    bad = pm.write_zip(
        tmp_path / "tampered.kvpack",
        [("manifest.json", json.dumps(manifest).encode(), zipfile.ZIP_DEFLATED)]
        + [(n, d, zipfile.ZIP_STORED) for n, d in members],
    )
    with pytest.raises(PackError, match="does not verify"):
        PackReader(bad)
    with open_library() as lib:
        with pytest.raises(PackError):
            import_pack(LibraryService(engine, lib), bad)
        assert lib.count() == 2  # only the fixture's own deposit: a solution and its answer-ready state


def test_resigned_by_a_stranger_is_untrusted(signed_pack, engine, tmp_path):
    path, _ = signed_pack
    mallory = generate_key(tmp_path / "mallory.key")
    with zipfile.ZipFile(path) as z:
        manifest_bytes = z.read("manifest.json")
        members = [(n, z.read(n)) for n in z.namelist() if n not in ("manifest.json", "signature.json")]
    resigned = pm.write_zip(
        tmp_path / "resigned.kvpack",
        [
            ("manifest.json", manifest_bytes, zipfile.ZIP_DEFLATED),
            ("signature.json", sign_manifest(manifest_bytes, tmp_path / "mallory.key"), zipfile.ZIP_STORED),
        ]
        + [(n, d, zipfile.ZIP_STORED) for n, d in members],
    )
    with PackReader(resigned) as reader:
        assert reader.signer.key_id == mallory.key_id
    with open_library() as lib, pytest.raises(PackError, match="not in your trusted keys"):
        import_pack(LibraryService(engine, lib), resigned, require_signed=True)
    assert mallory.key_id not in trust_store().load()


@pytest.mark.parametrize(
    "sig",
    [
        b"{}",
        b"not json",
        json.dumps({"algorithm": "rsa"}).encode(),
        json.dumps({"algorithm": "ed25519", "public_key": "AAAA", "signature": "AAAA"}).encode(),
    ],
)
def test_malformed_signature_refused(signed_pack, tmp_path, sig):
    path, _ = signed_pack
    with zipfile.ZipFile(path) as z:
        members = [(n, z.read(n)) for n in z.namelist() if n != "signature.json"]
    bad = pm.write_zip(
        tmp_path / "badsig.kvpack",
        [(n, d, zipfile.ZIP_STORED) for n, d in members] + [("signature.json", sig, zipfile.ZIP_STORED)],
    )
    with pytest.raises(PackError, match="signature"):
        PackReader(bad)
