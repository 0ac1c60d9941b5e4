"""Issue "one house": each defect with the test that fails before its fix (real model, real SQLite).

- `import --rebuild` is all or nothing (a failure or a cancel after the first entry imports none);
- a twin repair updates the same columns through a deposit and through a pack import (one writer);
- checker names are checked where they come in, and an entry with one this version does not know fails
  its own verify, never the batch (a pack naming one imports: docs/pack-format.md);
- exit codes follow docs/cli.md's one table; import's refusal is its last line; a file without a
  document suffix is not deposited unless asked for as text;
- the lead's fixes: a GGUF field that is there but unreadable is NotAModel, `clear_pending` warns.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType, GGUFWriter

import kvgraft.app.cli.common as common
from kvgraft.app.core.gguf_check import NotAModel, inspect_gguf
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.packs.export import build_pack, export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.proof.checkers import UnknownChecker
from kvgraft.app.proof.problems import read_jsonl, write_jsonl
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.errors import Cancelled, EngineError
from kvgraft.entry import cli
from kvgraft.library.library import Library
from kvgraft.library.maintenance import gc
from kvgraft.library.pack import PackError
from kvgraft.library.signing import generate_key
from tests import pack_mutations as pm

SHORT = [p for p in starter_problems(24) if len(p.solution) < 1000][:3]
QUESTION, SOLUTION, ANSWER = "How many lamps light the copper bridge?", "Four on each side: 4 + 4 = 8.", "8"


@pytest.fixture(scope="module")
def good_pack(engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("house-pack")
    write_jsonl(SHORT, d / "problems.jsonl")
    with Library(d / "lib") as lib:
        res = build_pack(LibraryService(engine, lib), d / "problems.jsonl", d / "good.kvpack")
    assert res.entries == 3
    return d / "good.kvpack"


@pytest.fixture(scope="module")
def vouched_packs(engine, tmp_path_factory):
    """One vouched solution, exported unsigned and signed by alice: (plain, signed, alice's Signer)."""
    d = tmp_path_factory.mktemp("house-vouched")
    alice = generate_key(d / "alice.key")
    with Library(d / "lib") as lib:
        e = LibraryService(engine, lib).deposit_solution(QUESTION, SOLUTION, ANSWER, vouched_by="checker:numeric").entry
        export_pack(lib, [e], d / "plain.kvpack")
        export_pack(lib, [e], d / "signed.kvpack", sign_key=d / "alice.key")
    return d / "plain.kvpack", d / "signed.kvpack", alice


@pytest.fixture
def run(engine, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return CliRunner().invoke


def _pending(lib) -> int:
    return lib._db.execute("SELECT count(*) FROM pending_blobs").fetchone()[0]


# -- 1. import --rebuild: all or nothing ------------------------------------------------------------


def test_rebuild_is_all_or_nothing(engine, good_pack, tmp_path, monkeypatch):
    other = pm.rebuild(good_pack, tmp_path / "fp.kvpack", edit_manifest=lambda m: m.update(fingerprint="0" * 64))
    real = LibraryService.reference_run
    calls = []

    def second_fails(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise EngineError("the second entry's state cannot be computed")
        return real(self, *args, **kwargs)

    with open_library() as lib:
        service = LibraryService(engine, lib)
        with monkeypatch.context() as m:
            m.setattr(LibraryService, "reference_run", second_fails)
            with pytest.raises(EngineError, match="second entry"):
                import_pack(service, other, rebuild=True)
        assert len(calls) == 2 and lib.count() == 0 and _pending(lib) == 0  # the first entry is not in

        def cancel(stage, done, total):
            if stage == "rebuild":
                raise Cancelled("cancelled")

        with pytest.raises(Cancelled):
            import_pack(service, other, rebuild=True, progress=cancel)  # cancelled after the first entry
        assert lib.count() == 0 and _pending(lib) == 0
        gc(lib, grace_s=0)
        assert list(lib.blobs.iter_shas()) == []  # what was staged is reclaimed

        res = import_pack(service, other, rebuild=True)
        assert (res.imported, res.skipped, res.rebuilt) == (3, 0, 3)
        assert lib.count() == 6  # every solution, with its answer-ready state
        assert all(e.graftable(engine.fingerprint) and e.proof == "local" for e in lib.entries())
        assert res.as_dict() == {
            "file": str(other),
            "imported": 3,
            "skipped": 0,
            "rebuilt": 3,
            "signed_by": None,
        }
        again = import_pack(service, other, rebuild=True)
        assert (again.imported, again.skipped) == (0, 3) and lib.count() == 6


# -- 2. one writer of entry rows: a twin repair is the same through deposit and import ------------------


@pytest.mark.parametrize("through", ["deposit", "import"])
def test_a_twin_repair_updates_the_same_through_deposit_and_import(engine, vouched_packs, through):
    """An unproven solution whose blob is marked damaged (a document of the same state shares the blob) is
    repaired by a vouched deposit of the same solution, or by a trusted signed pack holding it: either
    way it is whole, proven and vouched for, and the other entry of that blob is whole again."""
    plain, signed, alice = vouched_packs
    with open_library() as lib:
        service = LibraryService(engine, lib)
        import_pack(service, plain, replay=False)
        [e] = lib.entries()
        assert e.proof == "unproven" and not e.verified
        sibling, created = lib.add_entry(
            kind="prefix", text=e.text, tokens=e.tokens, blob=bytes(lib.read_blob(e)), fingerprint=engine.fingerprint
        )
        assert created and sibling.blob_sha256 == e.blob_sha256
        lib.mark_damaged(e.blob_sha256, "blob hash mismatch")
        if through == "deposit":
            service.deposit_solution(QUESTION, SOLUTION, ANSWER, vouched_by="you")
            voucher = "you"
        else:
            trust_store().trust(alice.public_key_b64, "alice")
            assert import_pack(service, signed).imported == 1
            voucher = "signer:alice (checker:numeric)"
        fixed = lib.get(e.id)
        assert fixed.damaged is None and fixed.proven and fixed.blob_sha256 == e.blob_sha256
        assert fixed.vouched_by == voucher and fixed.verified and fixed.verified_at is not None
        assert lib.get(sibling.id).damaged is None  # the blob is intact again, for every entry of it


# -- 4. checker names -------------------------------------------------------------------------------


def test_unknown_checker_is_refused_where_it_comes_in(engine, tmp_path, run):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        json.dumps({"question": "Two and two?", "solution": "2 + 2 = 4", "answer": "4"})
        + "\n"
        + json.dumps({"question": "Three and one?", "solution": "3 + 1 = 4", "answer": "4", "checker": "regex_v9"})
        + "\n"
    )
    with pytest.raises(UnknownChecker, match=r"p\.jsonl:2: unknown checker 'regex_v9'"):
        read_jsonl(jsonl)
    assert [p.checker for p in read_jsonl(_lines(tmp_path, {"checker": None}))] == ["numeric"]  # null: the default
    with open_library() as lib:
        service = LibraryService(engine, lib)
        with pytest.raises(PackError, match="regex_v9"):
            build_pack(service, jsonl, tmp_path / "out.kvpack")  # before the first deposit
        with pytest.raises(UnknownChecker):
            service.deposit_solution("Two and two?", "2 + 2 = 4", "4", checker="regex_v9")
        assert lib.count() == 0
    qa = ["--text", "Two and two make 4.", "--question", "Two and two?", "--answer", "4"]
    r = run(cli, ["deposit", *qa, "--checker", "regex_v9"])
    assert r.exit_code == common.EXIT_USAGE and "unknown checker 'regex_v9'" in r.output
    r = run(cli, ["deposit", "--text", "Two and two make 4.", "--checker", "exact"])
    assert r.exit_code == common.EXIT_USAGE and "--checker says how an --answer is checked" in r.output
    r = run(cli, ["deposit", *qa, "--checker", "exact", "--json"])
    assert r.exit_code == 0, r.output
    with open_library() as lib:
        assert lib.get(json.loads(r.stdout)["id"]).checker == "exact"


def _lines(d, extra: dict):
    path = d / "one.jsonl"
    path.write_text(json.dumps({"question": "Q?", "solution": "S", "answer": "1", **extra}) + "\n")
    return path


def test_a_pack_with_an_unknown_checker_imports_and_verify_fails_only_that_entry(
    engine, good_pack, tmp_path, run, caplog
):
    future = pm.rebuild(
        good_pack, tmp_path / "future.kvpack", edit_manifest=lambda m: m["entries"][1].update(checker="regex_v9")
    )
    with open_library() as lib, caplog.at_level(logging.WARNING, logger="kvgraft.app.packs.admission"):
        res = import_pack(LibraryService(engine, lib), future)
        assert res.imported == 3
        assert sorted(e.checker for e in lib.entries()) == ["numeric", "numeric", "regex_v9"]  # the name is kept
    assert "unknown checker 'regex_v9'" in caplog.text
    r = run(cli, ["verify", "--library", "--json"])
    assert r.exit_code == common.EXIT_CHECK_FAILED, r.output
    out = json.loads(r.stdout)
    assert out["entries"] == 3 and [f["check"] for f in out["failures"]] == ["checker"]  # the batch went on


# -- 5. exit codes, import's last line, files without a document suffix ---------------------------------


def test_exit_codes_are_the_documented_table(run, tmp_path):
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    for code, words in common.EXIT_CODES.items():
        assert f"| {code} | {words} |" in text
    bad = tmp_path / "bad.kvpack"
    bad.write_bytes(b"not a zip at all")
    r = run(cli, ["import", str(bad)])
    assert r.exit_code == common.EXIT_INPUT  # bad input, as `kvgraft deposit` says it
    assert r.stderr.rstrip("\n").splitlines()[-1].startswith(f"refused {bad}: ")  # nothing printed after it
    r = run(cli, ["deposit", str(tmp_path / "missing.txt"), "--question", "Q?"])
    assert r.exit_code == common.EXIT_INPUT and "no such file" in r.stderr
    r = run(cli, ["deposit", "--text", "x", "--no-such-option"])
    assert r.exit_code == common.EXIT_USAGE


def test_a_file_without_a_document_suffix_is_not_deposited_unless_as_text(run, tmp_path):
    host = tmp_path / "hostname"
    host.write_text("lighthouse-keeper-7\n")
    r = run(cli, ["deposit", str(host)])
    assert r.exit_code == common.EXIT_INPUT and "a file without a suffix" in r.stderr and "--as-text" in r.stderr
    r = run(cli, ["deposit", str(host), "--question", "Which host?", "--answer", "7"])
    assert r.exit_code == common.EXIT_INPUT and "a file without a suffix" in r.stderr
    r = run(cli, ["import", str(host), "--json"])  # any other file is read as a pack: refused, never deposited
    assert (
        r.exit_code == common.EXIT_INPUT and "not a valid zip archive" in json.loads(r.stdout)["refused"][0]["reason"]
    )
    with open_library() as lib:
        assert lib.count() == 0 and lib.sources.list() == []
    r = run(cli, ["deposit", str(host), "--as-text", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["file"] == str(host.resolve())


# -- 3. use cases return dataclasses; as_dict is the CLI's JSON ----------------------------------------


def test_export_and_import_results_are_dataclasses_with_the_json_keys(engine, good_pack, tmp_path, run):
    with open_library() as lib:
        service = LibraryService(engine, lib)
        res = import_pack(service, good_pack, replay=False)
        keys = "file imported skipped rebuilt signed_by signer_trusted proof replayed replay_tokens replay_s"
        assert list(res.as_dict()) == keys.split()
        assert res.as_dict()["proof"] == {"unproven": 3} and res.unproven == 3
        e = service.deposit_solution(QUESTION, SOLUTION, ANSWER).entry
        out = export_pack(lib, [e], tmp_path / "one.kvpack")
    with pytest.raises(AttributeError):
        out.entries = 2  # frozen
    r = run(cli, ["export", str(e.id), "-o", str(tmp_path / "cli.kvpack"), "--json"])
    assert r.exit_code == 0, r.output
    assert (
        list(json.loads(r.stdout))
        == list(out.as_dict())
        == ["file", "entries", "blobs", "bytes", "sha256", "signed_by"]
    )


# -- 6. the lead's fixes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [(float("nan"), GGUFValueType.FLOAT32), ("", GGUFValueType.STRING)],
    ids=["nan", "empty-string"],
)
def test_an_unreadable_sliding_window_is_not_a_model(tmp_path, value):
    """Before: any read error of a present field became "sliding window 0" (no window: no compaction)."""
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "gemma3")
    w.add_key_value("gemma3.attention.sliding_window", value[0], value[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotAModel, match="sliding_window field"):
        inspect_gguf(path)


def test_clear_pending_warns_when_it_cannot_clear(tmp_path, caplog):
    lib = Library(tmp_path / "lib")
    ids = lib.mark_pending(["ab" * 32])
    lib.close()  # the index is gone under it (as after a disk error): the records stay for gc
    with caplog.at_level(logging.WARNING, logger="kvgraft.library.library"):
        lib.clear_pending(ids)
    assert "1 pending blob records were not cleared" in caplog.text and "kvgraft gc reclaims them" in caplog.text
