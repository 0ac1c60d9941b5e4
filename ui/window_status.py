"""The status bar's words: the engine line (backend, context, the settings that decide the bits) and the
library line (what the table lists, its tokens, its disk). Mixed into ui/main_window.MainWindow."""

from __future__ import annotations

from kvgraft.app.core.words import counted


class WindowStatus:
    """Needs the window's `engine_info`, `settings`, `view`, `library_panel`, `remote`, `search`,
    `library_label` and `_closed`."""

    def _model_words(self) -> str:
        """The status bar's engine line: backend, context and the settings that decide the bits."""
        info = self.engine_info
        if not info:
            return "model: loading..."
        fa = "on" if info.get("flash_attn") else "off"
        return f"{info['backend']} - n_ctx {info['n_ctx']:,} - flash attention {fa} - KV {info.get('kv_types', '?')}"

    def refresh_library(self) -> None:
        if self._closed:
            return
        rows = self.view.rows(self.engine_info.get("fingerprint"), self.search.text())
        self.library_panel.set_rows(rows)
        self.remote.on_remotes(self.view.remotes())
        stats = self.view.stats(self.settings.n_ctx)
        # the entries the table lists (answer-ready states and thread states are not knowledge entries)
        listed = stats["entries"] - sum(stats["by_kind"].get(k, 0) for k in ("answer", "session", "cache"))
        disk = f", {stats['bytes']:,} bytes on disk" if stats.get("bytes") else ""
        info = self.engine_info
        migrate = self.view.to_migrate(info.get("predecessors", []), info.get("model_sha256", ""))
        self.library_label.setText(
            f"library: {counted(listed, 'entry')}, {counted(stats['tokens'], 'token')} = "
            f"{stats['context_multiple']:.1f}x the "
            f"{self.settings.n_ctx:,}-token context{disk}"
            + (
                f"; {migrate:,} made under this engine's earlier build are not grafted until moved (kvgraft migrate)"
                if migrate
                else ""
            )
        )
