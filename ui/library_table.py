"""The library table: a Qt model over plain rows (no widget per row), sortable through a proxy."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt

_ROOT = QModelIndex()  # the invisible root: a flat table has rows only under it
COLUMNS = ["#", "kind", "title / question", "tokens", "answer", "source", "proof", "graftable"]


class EntriesModel(QAbstractTableModel):
    def __init__(self) -> None:
        super().__init__()
        self._rows: list = []

    def set_rows(self, rows: list) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def row_at(self, r: int):
        return self._rows[r]

    def rowCount(self, parent=_ROOT) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent=_ROOT) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        row = self._rows[index.row()]
        col = index.column()
        if role == Qt.UserRole:  # sort key
            return [
                row.id,
                row.kind,
                row.title.lower(),
                row.tokens,
                row.verified,
                row.source,
                row.proof,
                row.graftable,
            ][col]
        if role == Qt.DisplayRole:
            if col == 0:
                return row.id
            if col == 1:
                return row.kind
            if col == 2:
                return row.title
            if col == 3:
                return f"{row.tokens:,}"
            if col == 4:
                return f"verified ({row.verified_by})" if row.verified else ("stated" if row.stated else "")
            if col == 5:
                return row.source
            if col == 6:
                return row.proof
            if col == 7:
                if row.damaged:
                    return "damaged"
                return "yes" if row.graftable else ("no (unproven)" if row.proof == "unproven" else "needs rebuild")
        if role == Qt.TextAlignmentRole and col in (0, 3):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None


def sorted_view(model: EntriesModel) -> QSortFilterProxyModel:
    proxy = QSortFilterProxyModel()
    proxy.setSourceModel(model)
    proxy.setSortRole(Qt.UserRole)
    return proxy
