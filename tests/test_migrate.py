"""Moving a library onto the batch-invariant engine (app/maintain/migrate.py, `kvgraft migrate`).

The library is written by another build's bits: a process with llama.cpp's own row-count switches
(KVGRAFT_BATCH_INVARIANT=0, the fallback) deposits a document and holds a two-turn conversation, whose
replies are decoded a token at a time, where the builds differ. The library's record of that engine
is then marked fingerprint version 2, as kvgraft before the invariance probe wrote it.
Nothing of it is grafted until `migrate` has computed each state here and checked a graft of it; then a
replay in each entry's recorded schedule reproduces the new state and the thread resumes exactly.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from kvgraft.app.answer.chat import ChatError, ChatService
from kvgraft.app.cli import cli
from kvgraft.app.maintain.migrate import migrate, pending, pending_count
from kvgraft.app.service import LibraryService, open_library
from kvgraft.app.verify.batch import verify_targets
from tests.fallback_process import run_in_mode, run_without_invariance

NOTES = "Harbor survey notes. " + " ".join(f"Pier {i} holds {i * 7 % 13} boats." for i in range(30))

OLD_BUILD = """
import json, sys
from kvgraft.app.answer.chat import ChatService
from kvgraft.app.core.model_store import embedded_model_path, model_sha256
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
path = embedded_model_path()
eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048), model_sha256(path))
with open_library(sys.argv[1]) as lib, LibraryService(eng, lib) as service:
    doc = service.deposit(sys.argv[2], title="notes")
    chats = ChatService(service)
    t = chats.new_thread(system="Be brief.")
    chats.say(t.id, "Which pier holds the most boats?", max_tokens=10)
    chats.say(t.id, "And the fewest?", max_tokens=10)
    print(json.dumps({"fingerprint": eng.fingerprint, "invariant": eng.batch_invariant, "doc": doc.entry.id,
                      "thread": t.id}))
"""


def recorded_as_version(home, fingerprint: str, version: int) -> None:
    """Mark the library's record of the engine `fingerprint` as an earlier kvgraft stored it (that version)."""
    with open_library(home) as lib, lib.write() as db:
        info = {**lib.engine_info(fingerprint)["info"], "fingerprint_version": version}
        db.execute("UPDATE engines SET info = ? WHERE fingerprint = ?", [json.dumps(info), fingerprint])


@pytest.fixture(scope="module")
def fallback_library(tmp_path_factory):
    """A library made by the fallback build (once per module: a process of its own), relabelled as
    kvgraft's previous version would have stored it."""
    home = tmp_path_factory.mktemp("fallback") / "home"
    made = run_without_invariance(OLD_BUILD, str(home), NOTES)
    recorded_as_version(home, made["fingerprint"], 2)
    return home, made


@pytest.fixture
def old_library(tmp_path, engine, fallback_library):
    """A copy of that library for one test, which may change it."""
    made_home, made = fallback_library
    home = tmp_path / "home"
    shutil.copytree(made_home, home)
    return home, engine.with_config(engine.config.replace(n_ctx=2048)), made


def test_migration_proves_each_state_here_and_the_thread_resumes_exactly(old_library):
    home, engine, made = old_library
    assert pending_count(engine, home) >= 3  # the document and a state per turn
    with open_library(home) as lib, LibraryService(engine, lib) as service:
        chats = ChatService(service)
        with pytest.raises(ChatError, match="another engine fingerprint"):
            chats.say(made["thread"], "Hello?", max_tokens=4)
        todo = pending(service)
        assert not any(e.graftable(engine.fingerprint) for e in todo)
        seen = []
        report = migrate(service, on_progress=lambda done, total, e: seen.append((done, total)))
        assert seen[-1] == (len(todo), len(todo)) and not report.refused
        assert sorted(report.moved) == sorted(e.id for e in todo)
        assert set(report.same_bits) < set(report.moved), "the replies were decoded a token at a time: other bits"
        assert report.owners["threads"] == 1
        assert pending(service) == [] and pending_count(engine, home) == 0
        moved = [lib.get(i) for i in report.moved]
        assert all(e.graftable(engine.fingerprint) and e.proof == "replayed" for e in moved)
        assert all(e.receipt["computed"] == "library migrate" for e in moved)
        # an independent check: verify replays each entry in its recorded schedule and compares the bits
        outcome = verify_targets(service, entries=moved, replay=True)
        assert outcome.ok, outcome.failures
        # the conversation goes on, and its next turn checks out against a fresh prefill
        r = chats.say(made["thread"], "And pier 7?", max_tokens=6, check=True)
        assert r.exact is True and r.tokens_restored > 0


def test_an_entry_whose_tokens_are_not_its_text_stays_and_the_command_says_so(old_library):
    home, engine, made = old_library
    with open_library(home) as lib, lib.write() as db:
        db.execute("UPDATE entries SET text = ? WHERE id = ?", [NOTES.replace("Pier 3", "Pier 9"), made["doc"]])
    runner = CliRunner()
    env = {"KVGRAFT_HOME": str(home)}
    res = runner.invoke(cli, ["migrate", "--n-ctx", "2048", "--json"], env=env)
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["refused"] == {str(made["doc"]): "its tokens are not its text's on this model"}
    assert out["left"] == 1 and made["doc"] not in out["moved"] and len(out["moved"]) >= 2
    with open_library(home) as lib:
        doc = lib.get(made["doc"])
        assert doc.fingerprint == made["fingerprint"] and not doc.graftable(engine.fingerprint)


def test_a_library_of_the_previous_invariant_mode_moves_onto_this_one(tmp_path, engine):
    """The previous engine's mode (per-row-no-sgemm, batch-invariant too) made the library, whose record of
    that engine is marked fingerprint version 3, as 31f5b30 stored it. This engine finds it by its config and
    moves each entry only after computing it here and checking a graft of it."""
    home = tmp_path / "home"
    made = run_in_mode("per-row-no-sgemm", OLD_BUILD, str(home), NOTES)
    assert made["invariant"] is True
    me = engine.with_config(engine.config.replace(n_ctx=2048))
    assert made["fingerprint"] != me.fingerprint
    recorded_as_version(home, made["fingerprint"], 3)
    with open_library(home) as lib, LibraryService(me, lib) as service:
        todo = pending(service)
        assert len(todo) >= 3 and not any(e.graftable(me.fingerprint) for e in todo)
        report = migrate(service)
        assert sorted(report.moved) == sorted(e.id for e in todo) and not report.refused
        assert pending(service) == [] and report.owners["threads"] == 1
        assert all(lib.get(i).proof == "replayed" for i in report.moved)  # the first test also replays them
        r = ChatService(service).say(made["thread"], "And pier 7?", max_tokens=6, check=True)
        assert r.exact is True and r.tokens_restored > 0
