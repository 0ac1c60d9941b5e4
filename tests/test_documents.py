"""Documents in, from anywhere (app/ingest/documents.py, library/sources.py): files that fit stored verbatim,
longer ones in sections, a file's identity by its path, re-deposits, PDFs, the CLI's shapes. On a
synthetic model through real llama.cpp and a real SQLite index; whether answers are right from a
deposited file is the real model's test (tests/test_documents_ask.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft.app.answer.ask import ask
from kvgraft.app.cli import common
from kvgraft.app.core.model_store import model_sha256
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.ingest.documents import DocumentError, deposit_file, read_context_file, split_sections
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.engine.errors import Cancelled
from kvgraft.entry import cli
from kvgraft.library.errors import EntryNotFound
from scripts.synthetic_gguf import write_synthetic_gguf

from .pdf_file import write_pdf


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", "llama", seed=5)
    eng = Engine.load(EngineConfig(model_path=path, n_ctx=1024), model_sha256(path))
    yield eng
    eng.close()


@pytest.fixture
def service(engine, tmp_path):
    lib = open_library(tmp_path / "home")
    svc = LibraryService(engine, lib)
    yield svc
    svc.close()
    lib.close()


def long_markdown(seed: int = 0, chapters: int = 4) -> str:
    parts = ["# The Osrenmi Survey", ""]
    for c in range(chapters):
        parts += [f"## Chapter {c + 1} of the survey", ""]
        for k in range(3):
            parts += [synthetic_text(50, seed * 100 + c * 10 + k), ""]
    parts += ["The head brewer of Zelbelpa is Mira Torquist.", ""]
    return "\n".join(parts)


def test_a_file_that_fits_is_stored_verbatim_and_grafts_as_its_context(service, tmp_path):
    f = tmp_path / "note.txt"
    text = (
        "Survey notes on Paquka\n\n"
        + synthetic_text(120, 3)
        + "\n\nThe river that runs through Paquka is the Osrenmi.\n"
    )
    f.write_text(text)
    fd = deposit_file(service, f)
    (e,) = fd.entries
    assert e.text == text and e.tokens == service.engine.model.tokenize(text)  # the file's own tokens
    assert fd.title == "Survey notes on Paquka" and fd.created == [True] and not fd.unchanged
    ref = service.library.sources.section_of(e.id)
    assert (ref.path, ref.n, ref.of, ref.words()) == (str(f.resolve()), 1, 1, "note.txt")
    r = ask(service, "What is the river that runs through Paquka called?", budget=2, context=text)
    assert (r.source, r.entry_id, r.section["file"]) == ("prefix", e.id, str(f.resolve()))
    assert "stored prefix #%d in note.txt" % e.id in r.provenance()


def test_a_long_file_is_split_into_sections_that_start_with_title_and_heading(service, tmp_path):
    f = tmp_path / "survey.md"
    body = long_markdown()
    f.write_text(body)
    fd = deposit_file(service, f, section_tokens=300)
    n = len(fd.entries)
    assert n >= 4 and all(fd.created)
    model = service.engine.model
    for k, e in enumerate(fd.entries, start=1):
        first, second = e.text.split("\n")[:2]
        assert first == "The Osrenmi Survey"  # the markdown file's first heading
        assert second.startswith(f"Section {k} of {n}")
        assert e.n_tokens <= 300 and e.tokens == model.tokenize(e.text)
        assert e.title.startswith(f"The Osrenmi Survey, section {k} of {n}")
        assert service.library.sources.section_of(e.id).words() == f"survey.md, section {k} of {n}"
    # every paragraph of the file is in exactly one section, in order
    paras = [p.strip() for p in body.split("\n\n") if p.strip()]
    joined = "\n\n".join(e.text.split("\n\n", 1)[1] for e in fd.entries)
    assert joined == "\n\n".join(paras)
    assert any(": Chapter 3 of the survey" in e.text.split("\n")[1] for e in fd.entries)


def test_a_paragraph_longer_than_a_section_is_cut_at_sentence_ends(engine):
    body = synthetic_text(900, 9)  # one paragraph, no blank line
    sections = split_sections(engine.model, "One long paragraph", body, 200)
    assert len(sections) > 3
    assert all(len(engine.model.tokenize(t)) <= 200 for _h, t, _tokens in sections)
    assert " ".join(t.split("\n\n", 1)[1] for _h, t, _tokens in sections) == body
    assert all(t.split("\n\n", 1)[1].endswith(".") for _h, t, _tokens in sections[:-1])  # cut after a sentence


def test_a_question_about_one_section_retrieves_that_section(service, tmp_path):
    f = tmp_path / "survey.md"
    f.write_text(long_markdown())
    fd = deposit_file(service, f, section_tokens=300)
    r = ask(service, "Who is the head brewer of Zelbelpa?", budget=2)
    last = fd.entries[-1]
    assert (r.source, r.entry_id) == ("retrieved", last.id)
    assert r.section == {
        "file": str(f.resolve()),
        "section": len(fd.entries),
        "sections": len(fd.entries),
        "heading": "Chapter 4 of the survey",
    }
    assert "in survey.md (retrieved" in r.provenance()


def test_redeposit_unchanged_is_a_no_op_and_a_change_replaces_the_sections(service, tmp_path):
    lib = service.library
    f = tmp_path / "survey.md"
    f.write_text(long_markdown())
    first = deposit_file(service, f, section_tokens=300)
    blobs = set(lib.blobs.iter_shas())
    again = deposit_file(service, f, section_tokens=300)
    assert again.unchanged and not any(again.created) and again.prefill_s == 0
    assert [e.id for e in again.entries] == [e.id for e in first.entries]
    assert set(lib.blobs.iter_shas()) == blobs and lib.count() == len(first.entries)
    # change the last sentence: only the section holding it is computed again, the old one goes
    f.write_text(long_markdown().replace("Mira Torquist", "Osk Varrel"))
    changed = deposit_file(service, f, section_tokens=300)
    assert not changed.unchanged and sum(changed.created) == 1 and changed.created[-1]
    assert changed.removed == [first.entries[-1].id]
    assert [e.id for e in changed.entries[:-1]] == [e.id for e in first.entries[:-1]]
    assert lib.count() == len(changed.entries)
    assert "Osk Varrel" in changed.entries[-1].text
    with pytest.raises(EntryNotFound):
        lib.get(first.entries[-1].id)
    # the same bytes at another path are another file, sharing the stored states
    g = tmp_path / "copy.md"
    g.write_bytes(f.read_bytes())
    copy = deposit_file(service, g, section_tokens=300)
    assert not any(copy.created) and [e.id for e in copy.entries] == [e.id for e in changed.entries]


def test_a_cancelled_redeposit_leaves_the_old_sections_whole(service, tmp_path):
    lib = service.library
    f = tmp_path / "survey.md"
    f.write_text(long_markdown())
    first = deposit_file(service, f, section_tokens=300)
    f.write_text(long_markdown(seed=1))  # every section changes

    def stop_at_second(stage, done, total):
        if stage.endswith(": sections") and done == 2:
            raise Cancelled("cancelled")

    with pytest.raises(Cancelled):
        deposit_file(service, f, section_tokens=300, progress=stop_at_second)
    src = lib.sources.source(str(f.resolve()), service.engine.fingerprint)
    assert [e.id for _n, _h, e in lib.sources.source_sections(src.id)] == [e.id for e in first.entries]
    assert lib.count() == len(first.entries)  # nothing of the new sections was committed
    done = deposit_file(service, f, section_tokens=300)
    assert all(done.created) and set(done.removed) == {e.id for e in first.entries}


def test_removing_a_section_by_hand_rebuilds_it_on_the_next_deposit(service, tmp_path):
    lib = service.library
    f = tmp_path / "survey.md"
    f.write_text(long_markdown())
    first = deposit_file(service, f, section_tokens=300)
    lib.remove(first.entries[1].id)
    assert lib.sources.section_of(first.entries[1].id) is None
    again = deposit_file(service, f, section_tokens=300)
    assert not again.unchanged and again.created == [False] + [True] + [False] * (len(first.entries) - 2)


def test_pdf_text_is_deposited(service, tmp_path):
    f = tmp_path / "report.pdf"
    write_pdf(f, ["Survey notes on Belvelthu", "The town of Belvelthu was founded in the year 1433."])
    fd = deposit_file(service, f)
    assert "founded in the year 1433" in fd.entries[0].text and fd.title == "Survey notes on Belvelthu"


@pytest.mark.parametrize(
    "name, data, words",
    [
        ("broken.pdf", b"%PDF-1.4\nnot really a pdf", "not a readable PDF"),
        ("empty.pdf", None, "no text layer"),
        ("binary.txt", b"\xff\xfe\x00\x01garbage", "not UTF-8 text"),
        ("nul.txt", b"text\x00more", "NUL bytes"),
        ("blank.md", b"  \n\n ", "no text to deposit"),
        ("slides.docx", b"PK\x03\x04", "deposits text"),
    ],
)
def test_bad_files_are_refused_with_a_reason_and_nothing_written(service, tmp_path, name, data, words):
    f = tmp_path / name
    if data is None:
        write_pdf(f, [])
    else:
        f.write_bytes(data)
    with pytest.raises(DocumentError, match=words):
        deposit_file(service, f)
    assert service.library.count() == 0 and service.library.sources.list() == []


def test_cli_deposit_one_file_keeps_the_object_and_several_give_a_list(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    a, b, bad = tmp_path / "a.txt", tmp_path / "b.md", tmp_path / "bad.txt"
    a.write_text("Notes on Zelbelpa\n\n" + synthetic_text(80, 1))
    b.write_text(long_markdown())
    bad.write_bytes(b"\xff\xfe")
    runner = CliRunner()
    one = runner.invoke(cli, ["deposit", str(a), "--json"])
    assert one.exit_code == 0, one.output
    obj = json.loads(one.stdout)
    assert {"id", "created", "blob_sha256", "blob_size", "tokens", "kind", "prefill_s"} <= set(obj)
    assert obj["created"] is True and obj["file"] == str(a.resolve()) and len(obj["sections"]) == 1
    many = runner.invoke(cli, ["deposit", str(a), str(b), str(bad), "--section-tokens", "300", "--json"])
    assert many.exit_code == common.EXIT_INPUT  # one file refused: the others are deposited, the exit says so
    out = json.loads(many.stdout)
    assert [d["file"] for d in out["deposited"]] == [str(a.resolve()), str(b.resolve())]
    assert out["deposited"][0]["unchanged"] is True and len(out["deposited"][1]["sections"]) >= 4
    assert out["refused"][0]["file"] == str(bad) and "not UTF-8" in out["refused"][0]["reason"]
    text = runner.invoke(cli, ["deposit", str(b), "--section-tokens", "300"])
    assert text.exit_code == 0 and "b.md: unchanged since its last deposit" in text.stdout
    first = out["deposited"][1]["sections"][0]["id"]
    shown = runner.invoke(cli, ["show", str(first)])
    n = len(out["deposited"][1]["sections"])
    assert shown.exit_code == 0 and f"{b.resolve()} (b.md, section 1 of {n})" in shown.stdout
    assert json.loads(runner.invoke(cli, ["show", str(first), "--json"]).stdout)["section"]["sections"] == n
    usage = runner.invoke(cli, ["deposit", str(a), str(b), "--question", "Q?"])
    assert usage.exit_code == common.EXIT_USAGE and "give one SOURCE" in usage.output


def test_a_changed_file_never_removes_an_entry_it_did_not_make(service, tmp_path):
    lib = service.library
    f = tmp_path / "note.txt"
    text = "Notes on Zelbelpa\n\n" + synthetic_text(60, 2) + "\n"
    plain = service.deposit(text, kind="document").entry  # deposited before, as a text
    f.write_text(text)
    fd = deposit_file(service, f)
    assert fd.entries[0].id == plain.id and fd.created == [False]  # found, not made by the file
    f.write_text(text + "\nA new last line.\n")
    changed = deposit_file(service, f)
    assert changed.removed == [] and lib.get(plain.id).text == text  # still there
    f.write_text(text + "\nAnother last line.\n")
    again = deposit_file(service, f)
    assert again.removed == [changed.entries[0].id]  # that one the file made


def test_title_budget_and_line_ends(service, tmp_path):
    lib = service.library
    f = tmp_path / "crlf.md"
    f.write_bytes(("\ufeff# Windows notes\r\n\r\n" + synthetic_text(60, 4) + "\r\n").encode("utf-8"))
    fd = deposit_file(service, f)
    e = fd.entries[0]
    assert fd.title == "Windows notes" and "\r" not in e.text and not e.text.startswith("\ufeff")
    assert read_context_file(f) == e.text  # `ask --context FILE` reads the same text, so it grafts this entry
    retitled = deposit_file(service, f, title="Notes from a Windows machine")
    assert not any(retitled.created) and lib.get(e.id).title == "Notes from a Windows machine"
    g = tmp_path / "survey.md"
    g.write_text(long_markdown())
    first = deposit_file(service, g, section_tokens=300)
    assert deposit_file(service, g, section_tokens=300).unchanged
    other = deposit_file(service, g, section_tokens=400)  # another budget: split again
    assert not other.unchanged and len(other.entries) < len(first.entries)
    assert all(x.n_tokens <= 400 for x in other.entries)


def test_cli_import_takes_documents_too(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    f = tmp_path / "notes.md"
    f.write_text("# Harbor notes\n\n" + synthetic_text(60, 8) + "\n")
    r = CliRunner().invoke(cli, ["import", str(f)])
    assert r.exit_code == 0, r.output
    assert f"deposited {f} (Harbor notes): 1 sections, 1 computed" in r.stdout
    again = CliRunner().invoke(cli, ["import", str(f), "--json"])
    assert json.loads(again.stdout)["documents"][0]["unchanged"] is True


def test_fsck_finds_and_repairs_a_section_whose_entry_is_gone(service, tmp_path):
    from kvgraft.library.maintenance import fsck

    lib = service.library
    f = tmp_path / "note.txt"
    f.write_text("Notes\n\n" + synthetic_text(40, 1) + "\n")
    (e,) = deposit_file(service, f).entries
    with lib.write() as db:  # what a crash of an older build, or a hand edit, could leave
        db.execute("DELETE FROM prefix_keys WHERE entry_id = ?", [e.id])
        db.execute("DELETE FROM entries WHERE id = ?", [e.id])
    report = fsck(lib)
    assert not report["ok"] and any(p["kind"] == "dangling_sections" for p in report["problems"])
    fixed = fsck(lib, repair=True)
    assert any("sections of deposited files" in r for r in fixed["repaired"])
    assert fsck(lib)["ok"] and not deposit_file(service, f).unchanged  # rebuilt on the next deposit


def test_rm_file_forgets_a_moved_file_and_only_what_it_made(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    runner = CliRunner()
    shared_text = "Shared notes\n\n" + synthetic_text(40, 12) + "\n"
    a, b = tmp_path / "a.md", tmp_path / "b.txt"
    a.write_text(long_markdown())
    b.write_text(shared_text)
    assert runner.invoke(cli, ["deposit", "--text", shared_text]).exit_code == 0  # b's text, stored before b
    out = json.loads(runner.invoke(cli, ["deposit", str(a), str(b), "--section-tokens", "300", "--json"]).stdout)
    made = [s["id"] for s in out["deposited"][0]["sections"]]
    a.rename(tmp_path / "moved.md")  # the file is gone from its path: its sections would stay retrievable
    r = runner.invoke(cli, ["rm", "--file", str(a), "--file", str(b)])
    assert r.exit_code == 0, r.output
    assert f"forgot {a.resolve()}: removed entries " + ", ".join(f"#{i}" for i in made) in r.stdout
    assert f"forgot {b.resolve()}: no entry removed (each was stored before it" in r.stdout
    with open_library() as lib:
        assert lib.sources.list() == [] and lib.count() == 1  # the --text deposit stays
    again = runner.invoke(cli, ["rm", "--file", str(a)])
    assert again.exit_code == common.EXIT_INPUT and "no deposited file at" in again.output
    assert runner.invoke(cli, ["rm"]).exit_code == common.EXIT_USAGE
