#!/usr/bin/env python3
"""Render the main window with a populated library to docs/screenshot.png (offscreen).

Uses a temporary KVGRAFT_HOME and QSettings file: deposits a few of the starter problems and a
document through the real engine, asks one question (docs/screenshot-ask.png), starts a thread
from the document, resumes it and checks its second turn (the conversation view: docs/screenshot.png),
then grabs the Library tab with an entry opened (docs/screenshot-library.png).

Then two states a new user meets (docs/screenshot-models.png, docs/screenshot-rebuild.png):
- the model picker open with the known 1.5B model listed and its Download in progress. The model cache
  is a temporary one (the model is not fetched there) and the index a local stand-in on loopback that
  lists the real pinned wheels and serves zeros slowly; the download is cancelled before a wheel ends,
  so its SHA-256 check, which would refuse those bytes, is never reached, and nothing is kept;
- the Ask tab answering fresh while a document made with flash attention on holds the answer: it names
  the document and offers "Rebuild 1 entry for these settings".
"""

from __future__ import annotations

import os
import shutil
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
    shot_rebuild(app, win, engine, wait, out / "screenshot-rebuild.png")
    shot_models(app, win, wait, out / "screenshot-models.png")
    win.close()
    print(f"wrote {out / 'screenshot.png'}, screenshot-ask.png, screenshot-library.png, screenshot-models.png")
    print(f"and {out / 'screenshot-rebuild.png'}")


def stand_in_index(model):
    """A loopback index listing `model`'s pinned wheels (its own pins as their hashes), serving zeros at
    about 2 MB/s: bytes a download shows progress on and would refuse at the wheel's SHA-256 check."""
    import http.server
    import json
    import threading

    pages = {
        c.dist: {
            "files": [
                {
                    "filename": c.wheel(model.version),
                    "url": f"/files/{c.wheel(model.version)}",
                    "hashes": {"sha256": c.wheel_sha256},
                    "size": c.wheel_size,
                }
            ]
        }
        for c in model.chunks
    }
    sizes = {c.wheel(model.version): c.wheel_size for c in model.chunks}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            parts = self.path.strip("/").split("/")
            if parts[0] == "simple" and parts[-1] in pages:
                body = json.dumps(pages[parts[-1]]).encode()
            elif parts[0] == "files" and parts[-1] in sizes:
                body = None
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) if body is not None else sizes[parts[-1]]))
            self.end_headers()
            if body is not None:
                self.wfile.write(body)
                return
            try:
                for _ in range(sizes[parts[-1]] // 65536):
                    self.wfile.write(bytes(65536))
                    time.sleep(0.03)
            except OSError:  # the download was cancelled
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shot_models(app, win, wait, path: Path) -> None:
    from PySide6.QtGui import QPainter

    from kvgraft.app.core.model_registry import known_models

    model = known_models()[0]
    os.environ["KVGRAFT_MODEL_DIR"] = tempfile.mkdtemp(prefix="kvgraft-shot-models-")
    server = stand_in_index(model)
    os.environ["KVGRAFT_INDEX_URL"] = f"http://127.0.0.1:{server.server_address[1]}/simple"
    win.confirm = lambda title, text: title == "Download model"
    win.refresh_picker()
    win.download_model(model.name)
    wait(lambda: win.downloads.active.get(model.name, (0, 1))[0] > 25 << 20, timeout=60)
    app.processEvents()
    win.tabs.setCurrentWidget(win.chat)
    win.model_picker.showPopup()
    app.processEvents()
    image = win.grab().toImage()
    popup = win.model_picker.view().window()
    # drawn opening upward from the picker, as Qt opens it at a screen's bottom edge
    picker_top = win.model_picker.mapTo(win, win.model_picker.rect().topLeft())
    painter = QPainter(image)
    painter.drawPixmap(picker_top.x(), picker_top.y() - popup.height(), popup.grab())
    painter.end()
    image.save(str(path))
    win.model_picker.hidePopup()
    win.downloads.cancel()
    wait(lambda: not win.downloads.active)
    server.shutdown()
    os.environ.pop("KVGRAFT_INDEX_URL")
    shutil.rmtree(os.environ["KVGRAFT_MODEL_DIR"], ignore_errors=True)  # the stand-in bytes go


def shot_rebuild(app, win, engine, wait, path: Path) -> None:
    with open_library() as lib:
        made_fa = LibraryService(engine.with_config(engine.config.replace(flash_attn=True)), lib)
        made_fa.deposit(
            "Survey notes on Quorvane\n\n"
            + synthetic_text(120, seed=51)
            + "\n\nThe lighthouse keeper of Quorvane is Adela Mirrow.\n\n"
            + synthetic_text(120, seed=52),
            title="Survey notes on Quorvane",
        )
    win.refresh_library()
    answers = []
    win.worker.answered.connect(answers.append)
    win.question.setText("Who is the lighthouse keeper of Quorvane?")
    win.ask()
    wait(lambda: bool(answers))
    win.tabs.setCurrentWidget(win.answer_panel)
    app.processEvents()
    win.grab().save(str(path))


if __name__ == "__main__":
    main()
