"""Proof of origin on the real model: no stranger's KV is grafted unproven.

The poisoned pack is the one a new user built: two documents of the same token count, identical but
for one fact, and a pack made of the first document's manifest with the second document's blob,
every hash self-consistent, unsigned. It must never be grafted: refused at import with the entry
named (the default replay), or, with --no-replay, kept unproven and answered fresh.
"""

from __future__ import annotations

import json
import zipfile

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
import kvgraft.app.packs.admission as packs_mod
from kvgraft.app.packs.export import export_pack
from kvgraft.app.service import LibraryService, open_library
from kvgraft.entry import cli
from kvgraft.library.library import Library
from kvgraft.library.signing import generate_key
from tests import pack_mutations as pm

QUESTION = "What is the vault code of the Onhava archive?"


def document(code: str) -> str:
    return (
        "The Onhava archive stands at the end of the salt road, past the old copper mill. Its keepers open it "
        "once a year, in the first week of spring, and record every visitor in a blue ledger. "
        f"The vault code of the Onhava archive is {code}. Nobody else knows the vault code of the Onhava archive, "
        "and the keepers change the lock only when the ledger is full.\n"
    )


@pytest.fixture
def run(engine, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return CliRunner().invoke


@pytest.fixture(scope="module")
def packs(engine, tmp_path_factory):
    """good.kvpack (document A, its own state), poisoned.kvpack (A's manifest, B's state), the texts."""
    d = tmp_path_factory.mktemp("poison")
    good_text, bad_text = document("4417"), document("9902")
    assert len(engine.model.tokenize(good_text)) == len(engine.model.tokenize(bad_text))  # same length, one fact apart
    with Library(d / "src") as lib:
        service = LibraryService(engine, lib)
        a = service.deposit(good_text, title="Onhava A").entry
        b = service.deposit(bad_text, title="Onhava B").entry
        export_pack(lib, [a], d / "good.kvpack")
        export_pack(lib, [b], d / "bad.kvpack")
    good_m, _ = pm.read_members(d / "good.kvpack")
    bad_m, bad_blobs = pm.read_members(d / "bad.kvpack")
    poisoned = json.loads(json.dumps(good_m))
    src = bad_m["entries"][0]
    poisoned["entries"][0].update(
        blob_sha256=src["blob_sha256"], blob_size=src["blob_size"], blob_stored_size=src["blob_stored_size"]
    )
    name = "blobs/" + src["blob_sha256"]
    pm.write_zip(
        d / "poisoned.kvpack",
        [
            ("manifest.json", json.dumps(poisoned).encode(), zipfile.ZIP_DEFLATED),
            (name, bad_blobs[name], zipfile.ZIP_STORED),
        ],
    )
    (d / "good.txt").write_text(good_text)
    return d


def _state():
    with open_library() as lib:
        return lib.count(), sorted(lib.blobs.iter_shas()), lib._db.execute("SELECT count(*) FROM packs").fetchone()[0]


def test_poisoned_pack_refused_at_import_naming_the_entry(packs, run):
    before = _state()
    r = run(cli, ["import", str(packs / "poisoned.kvpack"), "--json"])
    assert r.exit_code == 3, r.output  # a refused file is bad input (docs/cli.md, exit codes)
    reason = json.loads(r.stdout)["refused"][0]["reason"]
    assert "entry 0" in reason and "Onhava A" in reason and "not the state of its text" in reason
    assert _state() == before  # nothing of it stays


def test_poisoned_pack_kept_unproven_is_answered_fresh(packs, run):
    r = run(cli, ["import", str(packs / "poisoned.kvpack"), "--no-replay", "--json"])
    assert r.exit_code == 0, r.output
    r = run(cli, ["list", "--json", "--check"])
    [entry] = json.loads(r.stdout)
    assert entry["proof"] == "unproven" and entry["graftable"] is False
    a = json.loads(run(cli, ["ask", QUESTION, "--context", str(packs / "good.txt"), "--budget", "16", "--json"]).stdout)
    assert a["source"] == "fresh" and a["entry_id"] is None and a["exact"] is None and a["proof"] is None
    assert "9902" not in a["answer"]
    # a replay cannot prove it: verify fails on the replay and the entry stays unproven
    r = run(cli, ["verify", "--library", "--replay", "--json"])
    assert (
        r.exit_code == 1 and {"entry": f"library#{entry['id']}", "check": "replay"} in json.loads(r.stdout)["failures"]
    )
    assert json.loads(run(cli, ["list", "--json"]).stdout)[0]["proof"] == "unproven"


def test_good_pack_proves_out_and_is_grafted(packs, run):
    r = run(cli, ["import", str(packs / "good.kvpack")])
    assert r.exit_code == 0, r.output
    assert "1 entry replayed here" in r.stdout
    [entry] = json.loads(run(cli, ["list", "--json", "--check"]).stdout)
    assert entry["proof"] == "replayed" and entry["graftable"] is True
    a = json.loads(run(cli, ["ask", QUESTION, "--context", str(packs / "good.txt"), "--budget", "16", "--json"]).stdout)
    assert a["source"] == "prefix" and a["entry_id"] == entry["id"] and a["proof"] == "replayed"
    assert "9902" not in a["answer"]


def test_unproven_entry_proved_by_verify_replay(packs, run):
    assert run(cli, ["import", str(packs / "good.kvpack"), "--no-replay"]).exit_code == 0
    r = run(cli, ["verify", "--library", "--replay", "--json"])
    assert r.exit_code == 0, r.output
    [entry] = json.loads(run(cli, ["list", "--json", "--check"]).stdout)
    assert entry["proof"] == "replayed" and entry["graftable"] is True


def test_format2_pack_imports_through_replay(packs, run, tmp_path):
    """An older pack (format 2, old-style fingerprint) is not refused: a replay here decides."""

    def to_format2(m):
        m.update(format_version=2, fingerprint="ab" * 32)
        m.pop("engine"), m.pop("environment")
        for e in m["entries"]:
            for k in ("proof", "verified_by", "schedule"):
                e.pop(k, None)

    old_good = pm.rebuild(packs / "good.kvpack", tmp_path / "v2.kvpack", edit_manifest=to_format2)
    old_bad = pm.rebuild(packs / "poisoned.kvpack", tmp_path / "v2-poisoned.kvpack", edit_manifest=to_format2)
    r = run(cli, ["import", str(old_bad), "--json"])
    assert r.exit_code == 3 and "not the state of its text" in json.loads(r.stdout)["refused"][0]["reason"]
    r = run(cli, ["import", str(old_good), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["replayed"] == 1
    [entry] = json.loads(run(cli, ["list", "--json", "--check"]).stdout)
    assert entry["proof"] == "replayed" and entry["graftable"] is True


def test_signed_pack_from_trusted_key_grafts_without_replay(engine, run, tmp_path, monkeypatch):
    src = tmp_path / "src"
    key = generate_key(tmp_path / "alice.key")
    with Library(src) as lib:
        service = LibraryService(engine, lib)
        e = service.deposit_solution(
            "How many lamps light the copper bridge?",
            "Four on each side: 4 + 4 = 8.",
            "8",
            vouched_by="checker:numeric",
        ).entry
        stated = service.deposit_solution(
            "How many boats are moored?", "Two and three: 5.", "5"
        ).entry  # nobody vouched
        export_pack(lib, [e, stated], tmp_path / "signed.kvpack", sign_key=tmp_path / "alice.key")
    # trusted: no replay runs (a replay here would raise), the signer vouches for the state and the answer
    assert run(cli, ["keys", "trust", key.public_key_b64, "--name", "alice"]).exit_code == 0
    monkeypatch.setattr(packs_mod, "run_replay", lambda *a, **k: pytest.fail("a trusted signed pack was replayed"))
    r = run(cli, ["import", str(tmp_path / "signed.kvpack"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["replayed"] == 0, r.output
    entry, other = json.loads(run(cli, ["list", "--json", "--check"]).stdout)
    assert entry["proof"] == "signed:alice" and entry["graftable"] is True
    assert entry["verified_by"] == "signer:alice (checker:numeric)"  # the signer passes on who vouched
    assert (
        other["proof"] == "signed:alice" and other["verified"] is False
    )  # a stated answer stays stated, signed or not
    a = json.loads(run(cli, ["ask", "How many lamps light the copper bridge?", "--json"]).stdout)
    assert a["source"] == "graft" and a["proof"] == "signed:alice" and a["exact"] is True
    assert (
        a["verified"] is True and a["verified_by"] == "signer:alice (checker:numeric)" and a["verified_answer"] == "8"
    )
    # no longer trusted: what the key proved is unproven again, and its vouching is gone
    key_id = run(cli, ["keys", "list"]).stdout.split("trusted  ")[1].split()[0]
    r = run(cli, ["keys", "untrust", key_id])
    assert r.exit_code == 0 and "2 entries it signed: unproven now" in r.stdout
    entry = json.loads(run(cli, ["list", "--json", "--check"]).stdout)[0]
    assert entry["proof"] == "unproven" and entry["graftable"] is False and entry["verified"] is False


def test_untrusted_signer_is_replayed(engine, run, tmp_path, monkeypatch):
    with Library(tmp_path / "src") as lib:
        e = LibraryService(engine, lib).deposit("Nine grey herons nest by the lower weir.").entry
        generate_key(tmp_path / "mallory.key")
        export_pack(lib, [e], tmp_path / "signed.kvpack", sign_key=tmp_path / "mallory.key")
    r = run(cli, ["import", str(tmp_path / "signed.kvpack"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["replayed"] == 1
    [entry] = json.loads(run(cli, ["list", "--json"]).stdout)
    assert entry["proof"] == "replayed" and entry["verified_by"] is None


def test_exact_is_a_comparison_that_can_fail(engine, run):
    q = "How many gates does the east wall have?"
    dep = run(
        cli,
        [
            "deposit",
            "--text",
            f"Q: {q}\nA: 6\n\nThe east wall has six gates.\n\nQ: {q}\nA: 6\n",
            "--question",
            q,
            "--answer",
            "6",
            "--json",
        ],
    )
    assert dep.exit_code == 0, dep.output
    a = json.loads(run(cli, ["ask", q, "--json"]).stdout)
    assert a["source"] == "graft" and a["exact"] is True and a["receipt_match"] is True
    assert (
        a["verified"] is False and a["stored_answer"] == "6" and a["verified_answer"] is None
    )  # stated, not confirmed
    assert a["answer_ready"] is True  # its answer-ready state was grafted (one token decoded)
    with open_library() as lib:  # the receipts now record other fresh logits: the comparison must fail
        for e in lib.entries():
            lib._db.execute(
                "UPDATE entries SET receipt = ? WHERE id = ?",
                [json.dumps({**e.receipt, "fresh_logits_sha256": "0" * 64}), e.id],
            )
        lib._db.conn.commit()
    r = run(cli, ["ask", q, "--json"])
    assert json.loads(r.stdout)["exact"] is False
    assert "NOT exact" in run(cli, ["ask", q]).stderr
    with open_library() as lib:  # no receipt for this continuation: nothing compared
        lib._db.execute("UPDATE entries SET receipt = NULL")
        lib._db.conn.commit()
    r = run(cli, ["ask", q])
    assert json.loads(run(cli, ["ask", q, "--json"]).stdout)["exact"] is None
    assert "blob hashes checked, logits not compared" in r.stderr


def test_confirmed_deposit_is_verified_by_you(run):
    q = "How many bells ring at noon?"
    dep = run(cli, ["deposit", "--text", f"Q: {q}\nA: 3\n", "--question", q, "--answer", "3", "--confirmed", "--json"])
    assert dep.exit_code == 0, dep.output
    a = json.loads(run(cli, ["ask", q, "--json"]).stdout)
    assert a["verified"] is True and a["verified_by"] == "you" and a["verified_answer"] == "3"
    assert run(cli, ["deposit", "--text", "x", "--confirmed"]).exit_code == 2  # --confirmed needs an --answer


def _as_legacy(lib, entry_id, fingerprint, receipt=None):
    """Make an entry look as kvgraft before the probe fingerprint stored it."""
    lib._db.execute(
        "UPDATE entries SET fingerprint = ?, receipt = coalesce(?, receipt) WHERE id = ?",
        [fingerprint, json.dumps(receipt) if receipt else None, entry_id],
    )
    lib._db.conn.commit()


def test_legacy_fingerprint_relabelled_when_this_engine_opens(engine, tmp_path):
    with Library(tmp_path / "lib") as lib:
        service = LibraryService(engine, lib)
        mine = service.deposit("Eleven kites fly over the dunes at dawn.").entry
        other = service.deposit("Twelve lanterns hang in the quiet arcade.").entry
        _as_legacy(lib, mine.id, engine.legacy_fingerprint)
        _as_legacy(lib, other.id, "cd" * 32)
        LibraryService(engine, lib)  # opening it checks one old-style entry against its receipt, then relabels
        assert lib.get(mine.id).fingerprint == engine.fingerprint and lib.get(mine.id).graftable(engine.fingerprint)
        assert lib.get(other.id).fingerprint == "cd" * 32  # made elsewhere: needs verify --replay
        assert lib._db.execute("SELECT entries FROM fingerprint_relabels").fetchone()[0] == 1


def test_legacy_entries_not_relabelled_when_their_receipt_differs(engine, tmp_path):
    with Library(tmp_path / "lib") as lib:
        e = LibraryService(engine, lib).deposit("Thirteen bells hang in the north tower.").entry
        _as_legacy(lib, e.id, engine.legacy_fingerprint, {**e.receipt, "fresh_logits_sha256": "0" * 64})
        LibraryService(engine, lib)
        assert lib.get(e.id).fingerprint == engine.legacy_fingerprint  # other bits here: left for verify --replay


def test_receipts_check_fails_when_the_recorded_run_failed(packs, run, tmp_path):
    assert run(cli, ["import", str(packs / "good.kvpack")]).exit_code == 0
    receipts = tmp_path / "r.json"
    assert run(cli, ["verify", "--library", "--receipts", str(receipts)]).exit_code == 0
    rec = json.loads(receipts.read_text())
    rec["ok"], rec["failures"] = False, [{"entry": rec["results"][0]["ref"], "check": "answer"}]
    receipts.write_text(json.dumps(rec))
    r = run(cli, ["verify", "--receipts", str(receipts), "--check"])
    assert r.exit_code == 1 and "every hash reproduced" in r.stdout and "recorded run had 1 failed checks" in r.stderr
