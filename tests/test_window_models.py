"""Models from the window (pytest-qt, offscreen): the picker lists every known model with its size,
license and state; Download fetches it from a local package index (tests/fake_index.py) on a queue of
its own with byte progress while Ask keeps answering; Cancel keeps the bytes and the next Download
resumes them with a Range request; no network is a clear message; a switch of model is said in words."""

from __future__ import annotations

import socket

import pytest
from PySide6.QtCore import QSettings

from kvgraft.app.core import model_download as dl
from kvgraft.app.core import model_registry as reg
from kvgraft.ui.main_window import MainWindow
from kvgraft.ui.model_picker import DOWNLOAD, known_words
from tests.fake_index import FakeIndex, write_parts


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(tmp_path / "model-cache"))
    idx = FakeIndex(write_parts(4, 1_500_000), name="fake-coder").start()
    monkeypatch.setitem(reg.KNOWN, idx.model.name, idx.model)
    monkeypatch.setenv("KVGRAFT_INDEX_URL", idx.url)
    yield idx
    idx.stop()


@pytest.fixture
def window(qtbot, engine, tmp_path, index):
    w = MainWindow(QSettings(str(tmp_path / "user.ini"), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None  # w.messages records them
    w.asked = []
    w.confirm = lambda title, text: w.asked.append(title) or title == "Download model"  # download yes, switch no
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: bool(w.engine_info), timeout=60_000)
    yield w
    w.close()


def picker_text(w: MainWindow, name: str) -> str:
    i = w.model_picker.findData(DOWNLOAD + name)
    return w.model_picker.itemText(i) if i >= 0 else ""


def message(qtbot, w, title: str, timeout=60_000) -> str:
    qtbot.waitUntil(lambda: any(t == title for t, _ in w.messages), timeout=timeout)
    return next(text for t, text in reversed(w.messages) if t == title)


def test_download_from_the_window_with_progress_cancel_and_resume(qtbot, window, index):
    w, m = window, index.model
    assert picker_text(w, m.name) == known_words(m, "not fetched: Download...")
    assert "GB, test-license - not fetched" in picker_text(w, m.name)
    index.slow_s = 0.02  # 16 KiB per 20 ms: about 15 s for the whole model, long enough to watch and cancel
    w.model_picker.download_requested.emit(m.name)
    qtbot.waitUntil(lambda: not w.download_bar.isHidden() and "fetching" in picker_text(w, m.name), timeout=10_000)
    answered = []
    w.worker.answered.connect(answered.append)
    w.question.setText("What is 2 + 2?")
    w.ask()  # the engine thread answers while the download runs on its own queue
    qtbot.waitUntil(lambda: bool(answered), timeout=60_000)
    assert m.name in w.downloads.active, "the download ended before the answer: it did not run beside it"
    qtbot.waitUntil(lambda: dl.downloaded_bytes(m) > 2_000_000, timeout=30_000)
    assert w.download_bar.bar.format().startswith(f"{m.title}: ") and "MB" in w.download_bar.bar.format()
    w.download_bar.cancel.click()
    text = message(qtbot, w, "Download cancelled")
    kept = dl.downloaded_bytes(m)
    assert f"{kept / 1e6:,.0f} MB kept" in text and w.download_bar.isHidden()
    assert "% fetched: Download resumes" in picker_text(w, m.name)
    index.slow_s, index.requests[:] = 0, []
    w.model_picker.download_requested.emit(m.name)
    qtbot.waitUntil(lambda: "Downloaded" in w.asked, timeout=60_000)  # "Switch to it now?" (answered no)
    assert any(r for _, r in index.requests), "the second download did not resume with a Range request"
    assert reg.fetched_path(m).read_bytes() == b"".join(write_parts(4, 1_500_000))
    assert w.model_picker.findData(str(reg.fetched_path(m))) >= 0  # listed as ready, by its title
    assert w.model_picker.itemText(w.model_picker.findData(str(reg.fetched_path(m)))) == m.title


def test_no_network_is_said_and_nothing_changes(qtbot, window, index, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KVGRAFT_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    before = window.settings
    window.model_picker.download_requested.emit(index.model.name)
    text = message(qtbot, window, "Download failed")
    assert "could not download from" in text and "no network?" in text
    assert window.settings == before and reg.fetched_path(index.model) is None
    assert window.download_bar.isHidden()


def test_a_switch_of_model_is_said_in_words(window):
    from kvgraft.app.core.runtime import Settings

    words = window._model_changed_words(Settings(), Settings(model="/m/qwen.gguf"))
    assert words.startswith("Now answering with qwen.gguf (was Gemma 3 270M (embedded))")
