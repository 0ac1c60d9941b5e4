"""The Server tab: the OpenAI-compatible server (`kvgraft serve`) started and stopped from the window.

It runs in the window's process on its one engine thread (app/serve/embedded.py): no second model
load, one writer to the index. Loopback only from here; the API key is optional. The log shows each
request as the engine answered it: tokens in the prompt, how many were cached (not computed for it) and
where they came from (the warm context or a state grafted from the library).
"""

from __future__ import annotations

import time

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

DEFAULT_PORT = 8080
HOST = "127.0.0.1"


def log_line(r: dict) -> str:
    """One request, in words: '12:01:05  ok  812 prompt tokens, 780 cached (library #4) - 24 generated - 530 ms',
    or one answered without a job: '12:01:04  401  POST /v1/chat/completions: a wrong API key'."""
    if "method" in r:  # answered without a job (a job's record has no method: every job is a POST)
        said = f": {r['message']}" if r.get("message") else ""
        return f"{time.strftime('%H:%M:%S')}  {r['status']}  {r['method']} {r['path']}{said}"
    where = {"library": f"library #{r['entry_id']}", "warm": "warm context", "cold": "none cached"}.get(
        r.get("source"), "not prepared"
    )
    return (
        f"{time.strftime('%H:%M:%S')}  {r['status']}  {r['prompt_tokens']:,} prompt tokens, "
        f"{r['cached_tokens']:,} cached ({where}) - {r['completion_tokens']} generated - {r['ms']:,.0f} ms"
    )


class ServerPanel(QWidget):
    start_requested = Signal(dict)  # ServeOptions fields
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.running = False
        self.url = ""
        lay = QVBoxLayout(self)
        form = QFormLayout()
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")  # 0
        self.port.setValue(DEFAULT_PORT)
        form.addRow("Port (on 127.0.0.1)", self.port)
        self.api_key = QLineEdit()
        self.api_key.setPlaceholderText("optional: clients then send Authorization: Bearer <key>")
        self.api_key.setEchoMode(QLineEdit.PasswordEchoOnEdit)
        form.addRow("API key", self.api_key)
        lay.addLayout(form)
        row = QHBoxLayout()
        self.toggle = QPushButton("Start server")
        self.toggle.clicked.connect(self._toggle)
        self.url_field = QLineEdit()
        self.url_field.setReadOnly(True)
        self.url_field.setPlaceholderText("not running")
        self.copy_button = QPushButton("Copy URL")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url))
        self.copy_button.setEnabled(False)
        row.addWidget(self.toggle)
        row.addWidget(self.url_field, 1)
        row.addWidget(self.copy_button)
        lay.addLayout(row)
        self.state = QLabel(
            "The server answers the OpenAI API (chat and completions) from this window's model and library."
        )
        self.state.setWordWrap(True)
        lay.addWidget(self.state)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        lay.addWidget(self.log, 1)
        self.requests: list[dict] = []

    def _toggle(self) -> None:
        self.toggle.setEnabled(False)
        if self.running:
            self.stop_requested.emit()
        else:
            key = self.api_key.text().strip() or None
            self.start_requested.emit({"host": HOST, "port": self.port.value(), "api_key": key})

    def on_state(self, s: dict) -> None:
        self.running = bool(s.get("running"))
        self.toggle.setEnabled(True)
        self.toggle.setText("Stop server" if self.running else "Start server")
        self.port.setEnabled(not self.running)
        self.api_key.setEnabled(not self.running)
        self.url = s.get("url", "") if self.running else ""
        self.url_field.setText(self.url)
        self.copy_button.setEnabled(self.running)
        if self.running:
            self.state.setText(f"Serving {self.url} (try: curl {self.url}/models)")
        elif "stored" in s:
            self.state.setText(f"Stopped; stored {s['stored']} pending prompt-cache states, dropped {s['dropped']}.")

    def on_failed(self, message: str) -> None:
        self.toggle.setEnabled(True)
        self.state.setText(f"The server did not start: {message}")

    def on_request(self, r: dict) -> None:
        self.requests.append(r)
        self.log.appendPlainText(log_line(r))
