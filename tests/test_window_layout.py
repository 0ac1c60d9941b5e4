"""Nothing a user must read is cut (tests/layout_check.py): the window at 1000x700 and 1600x1000
(offscreen, a populated library, a remote, a job's progress and a download showing), every tab, grabbed
as a screenshot, with no text elided or clipped in the status bar, the tab headers or the tables. The
check itself is shown failing on a label squeezed on purpose."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.service import LibraryService, open_library
from kvgraft.ui.main_window import MainWindow
from tests.layout_check import status_bar, unreadable


@pytest.fixture
def window(qtbot, engine, tmp_path):
    with open_library() as lib:
        service = LibraryService(engine, lib)
        for p in sorted(starter_problems(24), key=lambda p: len(p.solution))[:2]:
            service.deposit_solution(p.question, p.solution, p.answer)
        service.deposit(synthetic_text(150, seed=3), title="Field notes: the river, the mill and the harbor")
        lib.remotes.add("team-library", "s3://kvgraft-team-library/shared/prefix", "http://127.0.0.1:8333")
    w = MainWindow(QSettings(str(tmp_path / "user.ini"), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: bool(w.engine_info), timeout=60_000)
    yield w
    w.close()


def test_no_text_is_cut_at_either_size(qtbot, window, tmp_path):
    w = window
    w.download_bar.show_bytes("Qwen2.5-Coder 1.5B Instruct (Q6_K)", 412 << 20, 1071 << 20)
    assert w.remote.table.rowCount() == 1 and w.entries.rowCount() == 3  # the tables have text to cut
    for size in ((1000, 700), (1600, 1000)):
        w.resize(*size)
        w._on_busy(True)
        w._on_progress("import", 3, 12)
        found = {}
        for i in range(w.tabs.count()):
            w.tabs.setCurrentIndex(i)
            qtbot.wait(50)  # a layout pass
            assert w.grab().save(str(tmp_path / f"window-{size[0]}-{i}.png"))
            found[w.tabs.tabText(i)] = unreadable(w)
        assert found == {t: [] for t in found}, size
        w._on_busy(False)
        qtbot.wait(50)
        assert unreadable(w) == [], size
    window.resize(1000, 700)
    window.model_label.setMaximumWidth(60)  # the check fails on a label squeezed on purpose
    qtbot.wait(50)
    assert any(x.startswith("status bar label 'CPU - n_ctx") for x in status_bar(window))
