"""The window people live in (pytest-qt, offscreen, the real model): threads that resume exactly across a
window restart, fork, Stop, Regenerate, the model picker refusing a bad file, the server started from
the window and answered through the official `openai` client, the library's detail view and Delete.

Every test fails if it leaves a kvgraft thread running (the engine's QThread or the server's HTTP thread).
"""

from __future__ import annotations

import json
import threading

import openai
import pytest
from click.testing import CliRunner
from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest

import kvgraft.app.cli.common as common
from kvgraft.app.core.model_registry import known_models
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.service import LibraryService, open_library
from kvgraft.entry import cli
from kvgraft.ui.main_window import MainWindow

NOTES = "You answer from these harbor notes. " + " ".join(
    f"Pier {i} holds {i * 7 % 13} boats and a {['red', 'blue', 'green'][i % 3]} crane." for i in range(12)
)


def kvgraft_threads() -> list[str]:
    """The engine thread and the server's HTTP thread (library/blobstore.py's process-wide pool of blob
    readers, "kvgraft-blob_N", lives as long as the process by design)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("kvgraft-") and "blob" not in t.name]


@pytest.fixture(autouse=True)
def no_thread_left_running():
    before = set(kvgraft_threads())
    yield
    left = [n for n in kvgraft_threads() if n not in before]
    assert not left, f"threads left running after the test: {left}"


@pytest.fixture
def qsettings(tmp_path):
    return QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)


def open_window(qtbot, engine, qsettings, max_reply_tokens=8) -> MainWindow:
    w = MainWindow(qsettings, engine=engine)
    w.show_message = lambda title, text, error: None  # w.messages records them
    w.worker.max_reply_tokens = max_reply_tokens
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: bool(w.engine_info) and not w.chat.busy, timeout=60_000)  # the load's busy(False) too
    return w


def close(w: MainWindow) -> None:
    w.close()
    assert not w.client.thread.isRunning(), "the engine thread was left running"


@pytest.fixture
def window(qtbot, engine, qsettings):
    w = open_window(qtbot, engine, qsettings)
    yield w
    close(w)


def say(qtbot, w: MainWindow, text: str) -> dict:
    done = []
    w.worker.chat_done.connect(done.append)
    qtbot.waitUntil(lambda: not w.chat.busy, timeout=60_000)  # Send is disabled while the engine thread works
    w.chat.input.setPlainText(text)
    w.chat.send()
    assert w.chat.pending is not None, "the message was not sent"
    qtbot.waitUntil(lambda: bool(done) and w.chat.pending is None and not w.chat.busy, timeout=120_000)
    return done[0]


def message(qtbot, w: MainWindow, title: str, timeout=120_000) -> str:
    qtbot.waitUntil(lambda: any(t == title for t, _ in w.messages), timeout=timeout)
    return next(text for t, text in reversed(w.messages) if t == title)


def test_a_thread_resumes_exactly_after_the_window_is_closed_and_opened(qtbot, engine, qsettings, kvgraft_home):
    w = open_window(qtbot, engine, qsettings)
    w.chat.system.setPlainText(NOTES)
    first = say(qtbot, w, "How many boats does pier 3 hold?")
    tid = first["thread"]
    assert first["turn"] == 1 and first["tokens_restored"] == 0
    assert "turn 1: computed from the start" in w.chat.view.toPlainText()
    close(w)

    w = open_window(qtbot, engine, qsettings)  # a new window: the thread is read back from the index
    items = [w.chat.thread_list.item(i).text() for i in range(w.chat.thread_list.count())]
    assert items[0].startswith(f"#{tid} How many boats") and "\n1 turn, " in items[0]
    w.chat.thread_list.setCurrentRow(0)
    assert w.chat.thread_id == tid and "How many boats does pier 3 hold?" in w.chat.view.toPlainText()
    second = say(qtbot, w, "And pier 4?")
    assert second["turn"] == 2 and second["tokens_restored"] == first["tokens"]  # the stored state, grafted
    assert 0 < second["tokens_prefilled"] <= 16  # only the new message was computed
    shown = w.chat.view.toPlainText()
    assert f"turn 2: resumed {first['tokens']:,} tokens in " in shown and "exact" not in shown  # no check ran yet
    w.chat.check(2)
    result = message(qtbot, w, "Check this turn")
    assert result.startswith(f"thread #{tid} turn 2: exact (logits before the reply equal; stored state byte-equal")
    assert "exact: a replay in a new context gave the same logits and state" in w.chat.view.toPlainText()
    close(w)

    # the same thread goes on from the CLI, exactly
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
        r = CliRunner().invoke(cli, ["chat", "say", str(tid), "And pier 5?", "--check", "--max-tokens", "8", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["turn"] == 3 and out["exact"] is True and out["tokens_restored"] == second["tokens"]


def test_fork_stop_and_regenerate(qtbot, window):
    w = window
    w.chat.system.setPlainText(NOTES)
    a = say(qtbot, w, "Which crane is on pier 2?")
    say(qtbot, w, "And on pier 5?")
    tid = a["thread"]

    w.chat.fork(1)  # a new thread holding turn 1: nothing recomputed
    qtbot.waitUntil(lambda: w.chat.thread_id != tid, timeout=30_000)
    fork = w.chat.thread_id
    with open_library() as lib:
        assert [t.n for t in lib.threads.turns(fork)] == [1] and lib.threads.thread(fork).forked_from == tid
    b = say(qtbot, w, "And on pier 7?")
    assert b["thread"] == fork and b["turn"] == 2 and b["tokens_restored"] == a["tokens"]

    # Stop mid-reply: the part decoded is kept and the thread goes on from it, exactly
    w.worker.max_reply_tokens = 200
    done = []
    w.worker.chat_done.connect(done.append)
    qtbot.waitUntil(lambda: not w.chat.busy, timeout=60_000)
    w.chat.input.setPlainText("Now list every pier, one per line, with its boats and crane.")
    w.chat.send()
    qtbot.waitUntil(lambda: w.chat.pending is not None and len(w.chat.pending["text"]) > 0, timeout=60_000)
    w.chat.stop()
    qtbot.waitUntil(lambda: bool(done) and not w.chat.busy, timeout=60_000)
    stopped = done[0]
    assert stopped["stop_reason"] == "callback" and 0 < stopped["tokens_decoded"] < 200
    assert " - stopped" in w.chat.view.toPlainText()
    w.chat.results.clear()  # what a restart forgets: the mark comes from the turn itself (m015)
    w.chat.render()
    assert " - stopped" in w.chat.view.toPlainText()
    assert w.view.library.threads.turns(fork)[-1].stop_reason == "callback"
    w.worker.max_reply_tokens = 8
    nxt = say(qtbot, w, "Go on.")
    assert nxt["tokens_restored"] == stopped["tokens"]
    w.chat.check(nxt["turn"])
    assert " exact (" in message(qtbot, w, "Check this turn")

    # Regenerate: the last turn is taken back and answered again from the state before it
    turns_before = w.view.library.threads.turns(fork)
    done.clear()
    qtbot.waitUntil(lambda: not w.chat.busy, timeout=60_000)
    w.chat.regenerate()
    qtbot.waitUntil(lambda: bool(done) and not w.chat.busy, timeout=60_000)
    again = done[0]
    turns = w.view.library.threads.turns(fork)
    assert len(turns) == len(turns_before) and turns[-1].user == "Go on."
    assert again["turn"] == nxt["turn"] and again["tokens_restored"] == stopped["tokens"]
    assert turns[-1].regenerated == 1 and " - regenerated" in w.chat.view.toPlainText()
    w.messages.clear()
    w.chat.check(again["turn"])
    assert " exact (" in message(qtbot, w, "Check this turn")


def test_esc_stops_a_reply_from_anywhere_in_the_window_and_only_while_one_streams(qtbot, window):
    w = window
    cfg = w.worker.engine.config  # the bit-deciding settings are in the status bar
    fa = "on" if cfg.flash_attn else "off"
    assert f"flash attention {fa} - KV {cfg.type_k}/{cfg.type_v}" in w.model_label.text()
    w.chat.set_busy(True)  # busy with something else (the model's load, a check): no reply to stop
    assert not w.chat.stop_button.isEnabled() and not w.chat.esc.isEnabled()
    w.chat.set_busy(False)
    w.show()  # shown and active, as a user's window is (a shortcut belongs to the active window)
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow, timeout=5_000)
    calls, real = [], w.worker.cancel
    w.worker.cancel = lambda: (calls.append(1), real())
    w.chat.system.setPlainText(NOTES)
    say(qtbot, w, "Which crane is on pier 2?")
    QTest.keyClick(w.chat.send_button, Qt.Key_Escape)  # nothing streams: Esc does nothing
    assert calls == [] and not w.chat.stop_button.isEnabled()

    w.worker.max_reply_tokens = 200
    done = []
    w.worker.chat_done.connect(done.append)
    w.chat.input.setPlainText("Now list every pier, one per line, with its boats and crane.")
    QTest.mouseClick(w.chat.send_button, Qt.LeftButton)  # the focus leaves the message box
    qtbot.waitUntil(lambda: w.chat.pending is not None and len(w.chat.pending["text"]) > 0, timeout=60_000)
    assert w.chat.stop_button.isEnabled()
    QTest.keyClick(w.tabs.tabBar(), Qt.Key_Escape)  # the focus outside the Chat tab's widgets
    qtbot.waitUntil(lambda: bool(done) and not w.chat.busy, timeout=60_000)
    assert calls == [1] and done[0]["stop_reason"] == "callback" and 0 < done[0]["tokens_decoded"] < 200

    # New: a thread not made yet has nothing to regenerate, rename or delete (Regenerate failed with
    # "no thread #None" before)
    assert w.chat.regenerate_button.isEnabled() and w.chat.delete_button.isEnabled()
    w.chat.new_thread()
    assert not any(b.isEnabled() for b in (w.chat.regenerate_button, w.chat.rename_button, w.chat.delete_button))
    w.chat.regenerate()
    assert w.chat.pending is None


def test_the_model_picker_refuses_a_bad_file_and_nothing_changes(qtbot, window, tmp_path):
    w = window
    w.chat.system.setPlainText("Be brief.")
    say(qtbot, w, "hello")
    before = (w.settings, dict(w.engine_info), w.view.stats(w.settings.n_ctx))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    w.model_picker.chosen.emit(str(bad))
    assert "broken.gguf" in message(qtbot, w, "Not a model")
    assert (w.settings, w.engine_info, w.view.stats(w.settings.n_ctx)) == before
    assert w.client.thread.isRunning()  # the engine was never stopped
    assert w.model_picker.currentText() == "Gemma 3 270M (embedded)"
    (w.view.library.root / "models").mkdir(exist_ok=True)
    (w.view.library.root / "models" / "other.gguf").write_bytes(b"x")
    w.model_picker.populate(w.settings.model, w.view.library.root / "models")
    names = [w.model_picker.itemText(i) for i in range(w.model_picker.count())]
    known = [m.title for m in known_models()]  # each known model, fetched or not
    assert names[0] == "Gemma 3 270M (embedded)" and names[-2:] == ["other.gguf", "Add model..."]
    assert [n[: len(t)] for n, t in zip(names[1:-2], known, strict=True)] == known


def test_the_server_started_from_the_window_answers_the_openai_client(qtbot, window):
    w = window
    w.server.port.setValue(0)  # any free port
    w.server.api_key.setText("s3cret")
    w.server.toggle.click()
    qtbot.waitUntil(lambda: w.server.running, timeout=60_000)
    assert w.server.url.startswith("http://127.0.0.1:") and w.server.url.endswith("/v1")
    client = openai.OpenAI(base_url=w.server.url, api_key="s3cret", max_retries=0)
    question = [{"role": "user", "content": "Name three colors. " + synthetic_text(60, seed=3)}]
    replies = []

    def ask_twice():
        for _ in range(2):
            replies.append(client.chat.completions.create(model="kvgraft", messages=question, max_tokens=6))

    t = threading.Thread(target=ask_twice)
    t.start()
    qtbot.waitUntil(lambda: not t.is_alive(), timeout=120_000)
    assert len(replies) == 2 and replies[0].choices[0].message.content == replies[1].choices[0].message.content
    qtbot.waitUntil(lambda: len(w.server.requests) == 2, timeout=10_000)
    first, second = w.server.requests
    assert first["status"] == second["status"] == "ok"
    assert second["cached_tokens"] > 0 and second["prompt_tokens"] == first["prompt_tokens"]
    log = w.server.log.toPlainText().splitlines()
    assert len(log) == 2 and f"{second['cached_tokens']:,} cached" in log[1]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=w.server.url, api_key="wrong", max_retries=0).models.list()
    assert [m.id for m in client.models.list().data]
    # the log holds what was answered without a job too: the refused request and the model list
    qtbot.waitUntil(lambda: len(w.server.requests) == 4, timeout=10_000)
    log = w.server.log.toPlainText().splitlines()
    assert "  401  GET /v1/models: " in log[2] and log[3].endswith("  200  GET /v1/models")
    # a chat in the window meanwhile runs on the same engine thread
    say(qtbot, w, "hello")
    w.server.toggle.click()
    qtbot.waitUntil(lambda: not w.server.running and w.server.toggle.isEnabled(), timeout=30_000)
    assert "Stopped; stored" in w.server.state.text()
    assert "kvgraft-http" not in kvgraft_threads()


def test_detail_view_thread_from_an_entry_and_delete_gives_the_disk_back(qtbot, window, engine):
    w = window
    with open_library() as lib:
        entry = LibraryService(engine, lib).deposit(synthetic_text(200, seed=8), title="Quarry notes").entry
    w.refresh_library()
    w.table.selectRow(0)
    shown = w.library_panel.detail.view.toPlainText()
    assert (
        f"#{entry.id} Quarry notes" in shown
        and entry.blob_sha256 in shown
        and "proof\tlocal" in shown.replace("\n", "\t")
    )
    w.library_panel.detail.thread_button.click()  # "Start a thread from this entry"
    qtbot.waitUntil(lambda: w.chat.thread_id is not None, timeout=30_000)
    assert w.view.library.threads.thread(w.chat.thread_id).from_entry_id == entry.id
    opened = w.chat.view.toPlainText()  # not empty: it says what the model has read
    assert f"starts from entry #{entry.id}, Quarry notes ({entry.n_tokens:,} tokens)" in opened
    r = say(qtbot, w, "What is in the quarry?")
    assert r["tokens_restored"] == entry.n_tokens  # the document's state, grafted
    w.library_panel.show_detail()
    assert f"threads from it\t#{w.chat.thread_id}" in w.library_panel.detail.view.toPlainText().replace("\n", "\t")
    before = w.view.stats(w.settings.n_ctx)["bytes"]
    w.confirm = lambda *a: True
    w._delete_selected()
    text = message(qtbot, w, "Deleted")
    after = w.view.stats(w.settings.n_ctx)["bytes"]
    assert after < before and f"disk given back: {before - after:,} bytes" in text
    assert w.entries.rowCount() == 0 and w.library_label.text().startswith("library: 0 entries")


def test_settings_llama_cpp_refuses_are_not_kept(qtbot, window, qsettings):
    """A quantized V cache with flash attention off is refused by llama.cpp: the window says so, goes back to
    the settings that loaded, and saves nothing (a saved setting never leaves the window unable to start)."""
    import dataclasses

    from kvgraft.app.core.settings_store import saved_settings

    w = window
    good = w.settings
    w.apply_settings(dataclasses.replace(good, type_v="q4_0", flash_attn=False))
    text = message(qtbot, w, "Model not loaded", timeout=120_000)
    assert "The settings before the change are back" in text
    assert "needs flash attention on" in text and "flash_attn=True" not in text  # the user's words, not llama.cpp's
    qtbot.waitUntil(lambda: bool(w.engine_info), timeout=120_000)  # loaded again, with the settings before
    assert w.settings == good and w.engine_info["n_ctx"] == good.n_ctx
    assert saved_settings(w.view.library.root) is None  # nothing was saved
