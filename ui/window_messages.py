"""The window's messages: how it tells the user what the worker did (deposits, exports, repairs, disk given
back, imports, verifies, a turn checked, the team library's runs) and the About box. Mixed into
ui/main_window.MainWindow."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

import kvgraft
from kvgraft.app.core.words import counted

from .summaries import import_summary, verify_summary


class WindowMessages:
    """Needs the window's `messages`, `engine_info`, `view`, `chat`, `remote`, `_closed` and `refresh_library`."""

    def notify(self, title: str, text: str, error: bool = False) -> None:
        """Show a message (tests replace `show_message` to keep dialogs from blocking)."""
        self.messages.append((title, text))
        self.show_message(title, text, error)

    def show_message(self, title: str, text: str, error: bool) -> None:
        box = QMessageBox.warning if error else QMessageBox.information
        box(self, title, text)

    def about_text(self) -> str:
        info = self.engine_info
        engine = (
            f"model {info['model']}\nengine fingerprint {info['fingerprint']}\nbackend {info['backend']}"
            if info
            else "model: not loaded"
        )
        return f"kvgraft {kvgraft.__version__}\n{engine}\ndata dir {self.view.library.root}"

    def show_about(self) -> None:
        self.notify("About kvgraft", self.about_text())

    # -- what the worker reports -------------------------------------------------------------
    def _on_deposited(self, d: dict) -> None:
        self.notify("Deposited", f"Entry #{d['id']}: {d['tokens']:,} tokens, blob {d['blob_sha256'][:16]}...")

    def _on_exported(self, d: dict) -> None:
        self.notify("Exported", f"{d['file']}: {counted(d['entries'], 'entry')}, {d['bytes'] / 1e6:.1f} MB")

    def _on_repaired(self, r: dict) -> None:
        self.notify("Check and repair", "\n".join(r["lines"]), error=not r["ok"])

    def _on_removed(self, r: dict) -> None:
        self.notify(
            "Deleted", f"{counted(r['entries'], 'entry')} removed; disk given back: {r['removed_bytes']:,} bytes"
        )

    def _on_collected(self, r: dict) -> None:
        self.notify(
            "Give back disk",
            f"{r['removed_bytes']:,} bytes given back: {r['removed_blobs']} blobs, {r['removed_sessions']} old "
            f"thread states, {r['removed_temp_files']} leftover files",
        )

    def _on_remote_done(self, r: dict) -> None:
        self.remote.on_done(r)
        self.refresh_library()

    def _on_rebuilt(self, r: dict) -> None:
        """Entries rebuilt for these settings (Ask's offer): said, then the question asked again."""
        if self._closed:
            return
        self.answer_panel.rebuild_done()
        made = ", ".join(f"#{i}" for i in r["ids"])
        self.notify(
            "Rebuilt",
            f"{counted(r['rebuilt'], 'entry')} computed for these settings ({made}, proof local)"
            + (f"; {r['already_here']} already here" if r["already_here"] else "")
            + ". The question is asked again.",
        )
        self.ask()

    def _on_imported(self, s: dict) -> None:
        self.notify("Import", import_summary(s), error=bool(s["refused"]))

    def _on_verified(self, out: dict) -> None:
        self.notify("Verify", verify_summary(out), error=not out["ok"])

    def _on_turn_checked(self, r: dict) -> None:
        if self._closed:
            return
        self.chat.refresh()
        self.notify(
            "Check this turn",
            f"thread #{r['thread']} turn {r['turn']}: "
            + ("exact" if r["exact"] else "NOT exact")
            + f" (logits before the reply {'equal' if r['logits_equal'] else 'differ'}; stored state "
            + {True: "byte-equal", False: "differs", None: "removed by gc"}[r["state_equal"]]
            + f"; a replay of {r['tokens']:,} tokens in a new context took {r['replay_ms']:,.0f} ms)",
            error=not r["exact"],
        )
