#!/usr/bin/env python3
"""Render the main window with a populated library to docs/screenshot.png (offscreen).

Uses a temporary KVGRAFT_HOME and QSettings file: deposits a few of the starter problems and a
document through the real engine, asks one question (docs/screenshot-ask.png), starts a thread
from the document, resumes it and checks its second turn (the conversation view: docs/screenshot.png),
then grabs the Library tab with an entry opened (docs/screenshot-library.png).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["KVGRAFT_HOME"] = tempfile.mkdtemp(prefix="kvgraft-shot-")

from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import synthetic_text  # noqa: E402
from kvgraft.app.lab.starter_problems import starter_problems  # noqa: E402
from kvgraft.app.service import LibraryService, open_library  # noqa: E402
from kvgraft.ui.collector import GuiCollector  # noqa: E402
from kvgraft.ui.main_window import MainWindow  # noqa: E402


def main() -> None:
    app = QApplication(sys.argv[:1])
    GuiCollector(app).start()  # the window's rule: gc off, collections on the GUI thread only
    engine = open_engine(Settings())
    problems = sorted(starter_problems(24), key=lambda p: len(p.solution))[:6]
    with open_library() as lib:
        service = LibraryService(engine, lib)
        for p in problems:
            service.deposit_solution(p.question, p.solution, p.answer)
        service.deposit(synthetic_text(900, seed=3), title="Field notes: the river, the mill and the harbor")
    qs = QSettings(str(Path(os.environ["KVGRAFT_HOME"]) / "settings.ini"), QSettings.IniFormat)
    win = MainWindow(qs, engine=engine)
    win.show_message = lambda *a: None  # win.messages records them
    win.resize(1100, 620)
    win.show()

    def wait(cond, timeout=120):
        t = time.time()
        while not cond() and time.time() - t < timeout:
            app.processEvents()
            time.sleep(0.02)

    wait(lambda: bool(win.engine_info))
    win.worker.max_reply_tokens = 24
    win.question.setText(problems[3].question)
    win.ask()
    wait(lambda: win.last_answer is not None)
    app.processEvents()
    out = REPO / "docs"
    win.tabs.setCurrentWidget(win.answer_panel)
    app.processEvents()
    win.grab().save(str(out / "screenshot-ask.png"))
    # the conversation view: a thread started from the field notes, resumed, its last turn checked
    doc = next(r for r in win.view.rows(win.engine_info["fingerprint"]) if r.kind == "document")
    win.chat.start_from_entry(doc.id, "Field notes")
    wait(lambda: win.chat.thread_id is not None)
    for text in ("What does the river carry?", "And what stands by the harbor?"):
        done = []
        win.worker.chat_done.connect(done.append)
        wait(lambda: not win.chat.busy)  # Send is disabled while the engine thread works
        win.chat.input.setPlainText(text)
        win.chat.send()
        wait(lambda done=done: bool(done) and not win.chat.busy)
    win.chat.check(2)
    wait(lambda: any(t == "Check this turn" for t, _ in win.messages))
    win.tabs.setCurrentWidget(win.chat)
    app.processEvents()
    win.grab().save(str(out / "screenshot.png"))
    win.tabs.setCurrentWidget(win.library_panel)
    win.table.selectRow(0)
    app.processEvents()
    win.grab().save(str(out / "screenshot-library.png"))
    win.close()
    print(f"wrote {out / 'screenshot.png'} and {out / 'screenshot-library.png'}")


if __name__ == "__main__":
    main()
