"""Entries made under other settings are named, never passed over in silence (app/answer/elsewhere.py):
Ask answers fresh and says "document #N holds this but was made with flash attention on", and a rebuild
for these settings (app/packs/rebuild.py `rebuild_entries`) makes the next answer come from it. The real
model under two fingerprints (flash attention off and on), a real index; the window's Ask tab too."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings, Qt

from kvgraft.app.answer.ask import ask
from kvgraft.app.answer.chat import ChatService
from kvgraft.app.answer.elsewhere import differences
from kvgraft.app.core.progress import no_progress
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.packs.rebuild import rebuild_entries
from kvgraft.app.service import LibraryService
from kvgraft.library.errors import LibraryError
from kvgraft.library.library import Library
from kvgraft.ui.main_window import MainWindow

DOC = (
    "Survey notes on Quorvane\n\n"
    + synthetic_text(120, 51)
    + "\n\nThe lighthouse keeper of Quorvane is Adela Mirrow.\n\n"
    + synthetic_text(120, 52)
)
QUESTION = "Who is the lighthouse keeper of Quorvane?"


@pytest.fixture
def made_with_flash_attention(engine_fa, kvgraft_home):
    with Library(kvgraft_home) as lib:
        d = LibraryService(engine_fa, lib).deposit(DOC, title="Survey notes on Quorvane")
        return d.entry.id


def test_ask_names_an_entry_made_under_other_settings_and_a_rebuild_grafts_it(
    engine, made_with_flash_attention, kvgraft_home
):
    doc_id = made_with_flash_attention
    with Library(kvgraft_home) as lib:
        service = LibraryService(engine, lib)
        r = ask(service, QUESTION)
        assert r.source == "fresh"
        assert r.made_elsewhere == [
            {
                "entry_id": doc_id,
                "kind": "document",
                "title": "Survey notes on Quorvane",
                "why": "made with flash attention on",
            }
        ]
        assert f"document #{doc_id} holds this but was made with flash attention on" in r.provenance()
        seen = []
        out = rebuild_entries(service, [doc_id], lambda stage, d, t: seen.append((stage, d, t)))
        assert out["rebuilt"] == 1 and out["from"] == [doc_id] and seen[-1] == ("rebuild", 1, 1)
        new = lib.get(out["ids"][0])
        assert new.fingerprint == engine.fingerprint and new.proof == "local" and new.text == DOC
        assert lib.get(doc_id).fingerprint != engine.fingerprint  # the other settings keep theirs
        again = ask(service, QUESTION)
        assert again.source == "retrieved" and again.entry_id == new.id and again.made_elsewhere == []
        assert rebuild_entries(service, [doc_id], no_progress)["already_here"] == 1  # nothing computed twice
        with pytest.raises(LibraryError, match="no entry #999"):
            rebuild_entries(service, [999], no_progress)


def test_differences_in_words():
    ours = {
        "model_sha256": "a",
        "flash_attn": False,
        "type_k": "f16",
        "type_v": "f16",
        "backend": "CPU",
        "n_gpu_layers": 0,
    }
    assert differences({**ours, "model_sha256": "b"}, ours) == "made with another model"
    assert differences({**ours, "flash_attn": True, "type_v": "q8_0"}, ours) == (
        "made with flash attention on, KV f16/q8_0"
    )
    assert differences(ours, ours).startswith("made by another build of llama.cpp or on another CPU family")
    assert differences(None, ours) == "made under engine settings this library did not record"


def test_the_ask_tab_offers_the_rebuild_and_asks_again(qtbot, engine, made_with_flash_attention, tmp_path):
    doc_id = made_with_flash_attention
    w = MainWindow(QSettings(str(tmp_path / "user.ini"), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: bool(w.engine_info), timeout=60_000)
    answers = []
    w.worker.answered.connect(answers.append)
    w.question.setText(QUESTION)
    w.ask()
    qtbot.waitUntil(lambda: bool(answers), timeout=60_000)
    p = w.answer_panel
    assert answers[0]["source"] == "fresh"
    assert p.elsewhere.text() == f"Document #{doc_id} holds this but was made with flash attention on."
    assert p.rebuild_button.text() == "Rebuild 1 entry for these settings" and not p.rebuild_button.isHidden()
    p.rebuild_button.click()
    qtbot.waitUntil(lambda: len(answers) == 2, timeout=120_000)  # rebuilt, then asked again
    assert any(t == "Rebuilt" and "1 entry computed for these settings" in x for t, x in w.messages)
    assert answers[1]["source"] == "retrieved" and answers[1]["made_elsewhere"] == []
    assert p.elsewhere.isHidden() and p.rebuild_button.isHidden()
    w.close()


def test_a_thread_made_under_other_settings_says_which(qtbot, engine, engine_fa, kvgraft_home, tmp_path):
    with Library(kvgraft_home) as lib:
        t = ChatService(LibraryService(engine_fa, lib)).new_thread(title="made with flash attention")
    w = MainWindow(QSettings(str(tmp_path / "user.ini"), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: bool(w.engine_info), timeout=60_000)
    w.chat.thread_list.setCurrentRow(
        next(i for i in range(w.chat.thread_list.count()) if w.chat.thread_list.item(i).data(Qt.UserRole) == t.id)
    )
    assert "Made with flash attention on: its states are not grafted under these settings" in w.chat.header.text()
    w.close()
