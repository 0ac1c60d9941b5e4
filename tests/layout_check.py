"""What a user cannot read in a window: text elided or clipped in the status bar, the tab headers and the
tables, measured with each widget's own font (tests/test_window_layout.py, scripts/screenshot.py).

Each finding is one line naming the widget, its text and the pixels it lacks.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QLabel,
    QMainWindow,
    QProgressBar,
    QTableView,
    QTabWidget,
    QWidget,
)

PAD = 6  # a cell's and a header section's margins, in pixels, both sides together (Qt's styles use 6 to 12)


def _shown(w: QWidget) -> bool:
    return w.isVisibleTo(w.window())


def status_bar(win: QMainWindow) -> list[str]:
    out, sb = [], win.statusBar()
    for w in sb.findChildren(QWidget):
        if not _shown(w) or w.parentWidget() is None:
            continue
        if isinstance(w, QLabel) and not w.wordWrap() and w.text():
            margins = w.contentsMargins()
            need = w.fontMetrics().horizontalAdvance(w.text()) + margins.left() + margins.right()
            if w.width() < need:
                out.append(f"status bar label {w.text()!r}: {w.width()} px of {need}")
        elif isinstance(w, QProgressBar) and w.isTextVisible() and w.text():
            need = w.fontMetrics().horizontalAdvance(w.text()) + PAD
            if w.width() < need:
                out.append(f"status bar progress {w.text()!r}: {w.width()} px of {need}")
        elif isinstance(w, (QAbstractButton, QComboBox)) and w.width() < (least := w.minimumSizeHint().width()):
            out.append(f"status bar {type(w).__name__} {_text(w)!r}: {w.width()} px of {least}")
        right = w.mapTo(win, w.rect().topRight()).x()
        if right > win.width():
            out.append(f"status bar {type(w).__name__} {_text(w)!r}: ends {right - win.width()} px past the window")
    return out


def _text(w: QWidget) -> str:
    if isinstance(w, QComboBox):
        return w.currentText()
    return w.text() if hasattr(w, "text") else ""


def tab_headers(win: QMainWindow) -> list[str]:
    out = []
    for tabs in win.findChildren(QTabWidget):
        if not _shown(tabs):
            continue
        bar = tabs.tabBar()
        for i in range(bar.count()):
            r = bar.tabRect(i)
            need = bar.fontMetrics().horizontalAdvance(bar.tabText(i))
            if r.width() < need or r.right() > bar.width():
                out.append(f"tab {bar.tabText(i)!r}: {min(r.width(), bar.width() - r.left())} px of {need}")
    return out


def tables(win: QMainWindow) -> list[str]:
    """Header sections and the cells of the rows in view: none narrower than its text."""
    out = []
    for view in win.findChildren(QTableView):
        if not _shown(view):
            continue
        model, header = view.model(), view.horizontalHeader()
        fm = view.fontMetrics()
        for c in range(model.columnCount()):
            if view.isColumnHidden(c):
                continue
            width = header.sectionSize(c)
            title = str(model.headerData(c, header.orientation()) or "")
            need = header.fontMetrics().horizontalAdvance(title) + PAD
            if width < need:
                out.append(f"table header {title!r}: {width} px of {need}")
            if header.sectionViewportPosition(c) + width > view.viewport().width() + 1:
                out.append(f"table column {title!r}: past the table's right edge (a scroll bar hides it)")
            for r in range(min(model.rowCount(), 50)):
                text = str(model.index(r, c).data() or "")
                if text:
                    out += _cell(view, fm, title, r, text, width)
    return out


def _cell(view: QTableView, fm, title: str, r: int, text: str, width: int) -> list[str]:
    """A cell too narrow for its text (a wrapping table: for its widest word, or too short for its lines)."""
    where = f"table cell {title!r} row {r} {text[:40]!r}"
    if not view.wordWrap():
        need = fm.horizontalAdvance(text) + PAD
        return [f"{where}: {width} px of {need}"] if width < need else []
    need = max(fm.horizontalAdvance(word) for word in text.split()) + PAD
    if width < need:
        return [f"{where}: {width} px of {need} for its widest word"]
    lines = fm.boundingRect(QRect(0, 0, width - PAD, 100_000), Qt.TextWordWrap, text).height()
    if view.rowHeight(r) < lines:
        return [f"{where}: {view.rowHeight(r)} px high of {lines}"]
    return []


def unreadable(win: QMainWindow) -> list[str]:
    return status_bar(win) + tab_headers(win) + tables(win)
