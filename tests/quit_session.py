"""A longer desktop session in its own process, ended by File > Quit (tests/test_quit.py runs it).

What a new user did before quitting crashed in 2 of 6 runs (PySide6 6.12.0's emit() dropped a
reference to True on every signal): fresh answers streamed token by token, the deposit dialog,
a settings change that restarts the engine, another answer. The process must then exit 0 with
no fatal error at interpreter teardown. Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from kvgraft.app.core.runtime import Settings  # noqa: E402
from kvgraft.ui import main_window  # noqa: E402
from kvgraft.ui.deposit_dialog import DepositAnswerDialog  # noqa: E402

# an answer that ends by itself: only such an answer can be deposited (tests/test_ui.py SELF_ENDING)
QUESTIONS = ["A box holds 4 apples and gets 5 more. How many apples does it hold?"]


def main() -> int:
    app = QApplication(sys.argv[:1])
    seen: dict = {"answers": 0}

    def wait(cond, timeout=300):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError("the window did not get there in time")
            app.processEvents(QEventLoop.AllEvents, 50)

    def session(win):
        win.show_message = lambda title, text, error: None  # no modal boxes; win.messages records them
        wait(lambda: bool(win.engine_info))
        seen["true_refs_at_start"] = sys.getrefcount(True)
        for q in QUESTIONS:
            win.last_answer = None
            win.question.setText(q)
            win.ask()
            wait(lambda: win.last_answer is not None and not win.progress.isVisible())
            seen["answers"] += 1
        # the deposit dialog, answered as a user would: correct the short answer, tick the box, Deposit
        seen["depositable"] = bool(win.last_answer.get("depositable"))

        def confirm(dlg):
            dlg.final_answer.setText("9")
            dlg.checked.setChecked(True)
            dlg.deposit_button.click()
            return dlg.result()

        DepositAnswerDialog.exec = confirm
        win._deposit_answer()
        wait(lambda: any(t == "Deposited" for t, _ in win.messages))
        # a settings change that restarts the engine thread
        s = win.settings
        win.apply_settings(Settings(model=s.model, n_ctx=4096, n_threads=s.n_threads, n_gpu_layers=s.n_gpu_layers))
        wait(lambda: bool(win.engine_info))
        win.last_answer = None
        win.question.setText(QUESTIONS[0])
        win.ask()
        wait(lambda: win.last_answer is not None and not win.progress.isVisible())
        seen["answers"] += 1
        seen["true_refs_at_quit"] = sys.getrefcount(True)
        quit_action = next(a for a in win.menuBar().actions()[0].menu().actions() if a.text() == "Quit")
        quit_action.trigger()  # File > Quit

    original = main_window.MainWindow.show

    def show_then_drive(win):
        original(win)
        QTimer.singleShot(0, lambda: session(win))

    main_window.MainWindow.show = show_then_drive
    code = main_window.run(sys.argv[:1])
    seen["exit_code"] = code
    print(json.dumps(seen), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
