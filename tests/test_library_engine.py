"""Deposit through the real engine, graft from the library, and the CLI's JSON contracts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.compare import compare_logits
from kvgraft.engine.errors import FingerprintMismatch
from kvgraft.entry import cli
from kvgraft.library.errors import BlobCorrupt

DOC = synthetic_text(700, seed=77)  # ~900 tokens: past the sliding window


@pytest.fixture
def service(engine):
    lib = open_library()
    with LibraryService(engine, lib) as service:  # frees its warm context
        yield service
    lib.close()


def test_deposit_then_graft_from_library_is_exact(service, engine, probe):
    res = service.deposit(DOC, question="What does the river carry?", answer="silver stones")
    assert res.created and res.entry.n_tokens > 512 and res.entry.kind == "solution"
    again = service.deposit(DOC, question="What does the river carry?", answer="silver stones")
    assert not again.created and again.entry.id == res.entry.id and again.prefill_s == 0.0
    assert service.library.stats()["blobs"] == 2  # the text's state and the answer-ready state (text + question)
    assert [e.kind for e in service.library.entries()] == ["solution", "answer"]
    with engine.session() as fresh:
        fresh.prefill(engine.model.tokenize(DOC))
        assert fresh.snapshot().sha256 == res.entry.blob_sha256  # the stored blob is what the text produces
        fresh.prefill(probe)
        want = fresh.logits()
    with engine.session() as g:
        service.graft(g, service.library.get(res.entry.id))
        g.prefill(probe)
        assert compare_logits(want, g.logits()).sha256_equal


def test_lookup_finds_deposit_by_question_and_prefix(service, engine):
    res = service.deposit(DOC, question="What does the river carry?", answer="silver stones")
    fp = engine.fingerprint
    assert service.library.find_question("what does the river carry", fp).id == res.entry.id
    prompt = engine.model.tokenize(DOC + " And then the harbor")
    assert service.library.longest_prefix(prompt, fp).id == res.entry.id
    assert service.library.longest_prefix(prompt, "0" * 64) is None  # another engine: needs rebuild


def test_tampered_blob_never_reaches_llama(service, engine):
    res = service.deposit(DOC)
    path = service.library.blobs.path(res.entry.blob_sha256)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(data)
    with engine.session() as g:
        with pytest.raises(BlobCorrupt):
            service.graft(g, service.library.get(res.entry.id))
        assert g.n_past == 0
    assert service.library.get(res.entry.id).damaged == "blob hash mismatch"


def test_foreign_fingerprint_entry_refused(service, engine_fa):
    res = service.deposit("A short note about seven orange windows.")
    with engine_fa.session() as g, pytest.raises(FingerprintMismatch):
        LibraryService(engine_fa, service.library).graft(g, res.entry)


def test_cli_library_contracts(engine, monkeypatch, tmp_path):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    run = CliRunner().invoke
    r = run(
        cli,
        ["deposit", "--text", DOC, "--question", "What does the river carry?", "--answer", "silver stones", "--json"],
    )
    assert r.exit_code == 0, r.output
    dep = json.loads(r.stdout)
    assert isinstance(dep["id"], int) and len(dep["blob_sha256"]) == 64
    f = tmp_path / "doc.txt"
    f.write_text("Seventeen quiet lighthouses guard the far coast.")
    assert run(cli, ["deposit", str(f)]).exit_code == 0
    r = run(cli, ["deposit", "-"], input="Seventeen quiet lighthouses guard the far coast.")
    assert r.exit_code == 0 and "already stored" in r.stdout
    assert run(cli, ["deposit"]).exit_code == 2  # no text given: usage error

    listed = json.loads(run(cli, ["list", "--json"]).stdout)
    # the solution, its answer-ready state (text + question), the document
    assert [(e["id"], e["kind"]) for e in listed] == [
        (dep["id"], "solution"),
        (dep["id"] + 1, "answer"),
        (dep["id"] + 2, "document"),
    ]
    for e in listed:
        assert {"id", "kind", "question", "tokens", "blob_sha256"} <= set(e)
    stats = json.loads(run(cli, ["stats", "--json"]).stdout)
    assert stats["entries"] == 3 and stats["blobs"] == 3
    assert stats["tokens"] == sum(e["tokens"] for e in listed if e["kind"] != "answer")  # not counted twice
    assert stats["by_kind"]["answer"] == 1
    assert stats["context_multiple"] == pytest.approx(stats["tokens"] / 8192)
    assert stats["canonical_bytes"] == sum(e["blob_size"] for e in listed)
    assert stats["bytes"] < stats["canonical_bytes"]  # on disk: compact, the ~900-token deposit is past the window
    fsck = json.loads(run(cli, ["fsck", "--json"]).stdout)
    assert fsck["ok"] is True and fsck["problems"] == [] and fsck["reclaimable"] == []
    assert [e["id"] for e in json.loads(run(cli, ["search", "lighthouses", "--json"]).stdout)] == [dep["id"] + 2]
    assert [e["id"] for e in json.loads(run(cli, ["search", "river", "--json"]).stdout)] == [
        dep["id"]
    ]  # not the answer state
    shown = run(cli, ["show", str(dep["id"])])
    assert "silver stones" in shown.stdout and dep["blob_sha256"] in shown.stdout

    # damage: fsck says so and exits 1
    with open_library() as lib:
        lib.blobs.path(dep["blob_sha256"]).unlink()
    r = run(cli, ["fsck", "--json"])
    bad = json.loads(r.stdout)
    assert r.exit_code == 1 and bad["ok"] is False and bad["problems"][0]["kind"] == "blob_missing"
    assert run(cli, ["rm", str(dep["id"])]).exit_code == 0
    assert json.loads(run(cli, ["fsck", "--json"]).stdout)["ok"] is True
    # the disk of a removed entry's blob comes back at once, and the count says how much
    before = json.loads(run(cli, ["stats", "--json"]).stdout)
    gone = run(cli, ["rm", str(dep["id"] + 2)])
    after = json.loads(run(cli, ["stats", "--json"]).stdout)
    assert after["entries"] == before["entries"] - 1 and after["blobs"] == before["blobs"] - 1 == 0
    assert before["bytes"] > 0 and f"disk given back: {before['bytes']:,} bytes (1 blob)" in gone.stdout
    with open_library() as lib:
        assert list(lib.blobs.iter_shas()) == []
    assert run(cli, ["rm", "999"]).exit_code == 3
