"""An entry opened up (the Library tab's detail pane): its stored text, proof, who vouched, the receipt's
hashes, the file and section it came from, and the threads started from it. Read on the GUI thread's
own connection; nothing here writes."""

from __future__ import annotations

import html

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QPushButton, QTextBrowser, QVBoxLayout, QWidget

from kvgraft.app.core.errors import LibraryError

TEXT_SHOWN = 6000  # characters of the stored text shown (the whole text is in `kvgraft show`)


def detail_html(lib, entry_id: int, fingerprint: str | None) -> str:
    try:
        e = lib.get(entry_id)
    except LibraryError:
        return f"<p>Entry #{entry_id} is no longer in the library.</p>"
    rows = [
        ("kind", e.kind),
        ("tokens", f"{e.n_tokens:,}"),
        ("proof", e.proof + ("" if e.proven else " (not proven: never grafted)")),
        ("answer", "none stored" if e.answer is None else e.answer),
        ("vouched for by", e.vouched_by or ("nobody: the answer is stated, not verified" if e.answer else "-")),
        ("checker", e.checker or "-"),
        ("created", e.created_at),
        ("answer vouched for", e.verified_at or "-"),
        (
            "last checked",
            f"{e.checked_at}: {'every check passed' if e.check_ok else 'a check FAILED'} (Verify selected)"
            if e.checked_at
            else "never (Verify selected checks it)",
        ),
        ("blob", f"{e.blob_sha256} ({e.blob_size:,} bytes)"),
        ("tokens SHA-256", e.tokens_sha256),
        (
            "engine",
            "this one" if e.fingerprint == fingerprint else f"another ({e.fingerprint[:16]}...): not grafted here",
        ),
    ]
    if e.damaged:
        rows.append(("damaged", e.damaged))
    if e.pack_id is not None:
        pack = lib.pack(e.pack_id) or {}
        rows.append(
            ("pack", f"{pack.get('file_name')} ({'signed ' + pack['signer'] if pack.get('signer') else 'unsigned'})")
        )
    section = lib.sources.section_of(e.id)
    if section is not None:
        rows.append(("from", section.path + (f", section {section.n} of {section.of}" if section.of > 1 else "")))
        if section.heading:
            rows.append(("heading", section.heading))
    for k, v in sorted((e.receipt or {}).items()):
        if isinstance(v, (str, int, float)):
            rows.append((f"receipt {k}", str(v)))
    threads = lib.threads.threads_from_entry(e.id)
    if threads:
        rows.append(("threads from it", ", ".join(f"#{t.id} {t.title or ''}".strip() for t in threads)))
    table = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    text = (
        e.text
        if len(e.text) <= TEXT_SHOWN
        else e.text[:TEXT_SHOWN] + f"\n... ({len(e.text) - TEXT_SHOWN:,} more characters)"
    )
    title = html.escape(e.title or e.question or "")
    return (
        f"<h3>#{e.id} {title}</h3>"
        + (f"<p><b>Q:</b> {html.escape(e.question)}</p>" if e.question else "")
        + f"<table cellspacing=4>{table}</table><h4>Stored text</h4>"
        + f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"
    )


class EntryDetail(QWidget):
    start_thread = Signal(int, str)  # entry id, its title

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.view = QTextBrowser()
        lay.addWidget(self.view, 1)
        self.thread_button = QPushButton("Start a thread from this entry")
        self.thread_button.setEnabled(False)
        self.thread_button.clicked.connect(lambda: self.start_thread.emit(self.entry_id, self.title))
        lay.addWidget(self.thread_button)
        self.entry_id = -1
        self.title = ""

    def show_entry(self, lib, entry_id: int | None, fingerprint: str | None, graftable: bool = False) -> None:
        if entry_id is None:
            self.entry_id = -1
            self.view.setHtml("<p style='color:#666'>Select an entry to see its text, proof and receipt.</p>")
            self.thread_button.setEnabled(False)
            return
        self.entry_id = entry_id
        try:
            e = lib.get(entry_id)
            self.title = (e.title or e.question or f"entry #{entry_id}")[:60]
        except LibraryError:
            self.title = ""
        self.view.setHtml(detail_html(lib, entry_id, fingerprint))
        self.thread_button.setEnabled(graftable)
