"""The window's Remote tab against a real S3 server (SeaweedFS on loopback) and the real model: add a
remote, push the entries selected in the Library tab, pull them into another data dir's window."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.service import LibraryService, open_library
from kvgraft.ui.main_window import MainWindow

PROBLEMS = [p for p in starter_problems(24) if len(p.solution) < 1000][:2]


def open_window(qtbot, engine, tmp_path) -> MainWindow:
    w = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat), engine=engine)
    w.show_message = lambda title, text, error: None
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: bool(w.engine_info) and not w.chat.busy, timeout=60_000)
    return w


def log_has(w: MainWindow, text: str) -> bool:
    return text in w.remote.log.toPlainText()


@pytest.fixture
def bucket(s3_env):
    s3_env.make_bucket("window-team")
    yield "window-team"
    c = s3_env.client()
    for obj in c.list_objects_v2(Bucket="window-team").get("Contents", []):
        c.delete_object(Bucket="window-team", Key=obj["Key"])
    c.delete_bucket(Bucket="window-team")


def add_remote(qtbot, w: MainWindow, endpoint: str) -> None:
    w.remote.name.setText("team")
    w.remote.url.setText("s3://window-team/lib")
    w.remote.endpoint.setText(endpoint)
    w.remote.add_button.click()
    qtbot.waitUntil(lambda: w.remote.table.rowCount() == 1 and w.remote.current_name() == "team", timeout=30_000)
    qtbot.waitUntil(lambda: w.remote.push_selected.isEnabled(), timeout=30_000)  # the add's op has ended


def test_push_selected_then_pull_in_another_data_dir(
    qtbot, engine, s3_env, bucket, tmp_path, monkeypatch, kvgraft_home
):
    with open_library() as lib, LibraryService(engine, lib) as svc:
        for p in PROBLEMS:
            svc.deposit_solution(p.question, p.solution, p.answer, checker=p.checker)
    w = open_window(qtbot, engine, tmp_path)
    try:
        w.remote.url.setText("s3://window-team")  # no name: refused in the panel, nothing sent
        w.remote.add_button.click()
        assert "needs a name" in w.remote.state.text() and w.remote.table.rowCount() == 0
        add_remote(qtbot, w, s3_env.endpoint)
        assert "bucket reachable" in w.remote.log.toPlainText()
        w.remote.push_selected.click()  # nothing selected yet
        assert "Select entries" in w.remote.state.text()
        w.library_panel.table.selectAll()
        assert len(w.selected_ids()) == 2
        w.remote.push_selected.click()
        qtbot.waitUntil(lambda: log_has(w, "pushed 2 entries to team"), timeout=60_000)
        qtbot.waitUntil(lambda: not w.remote.busy, timeout=30_000)
        w.remote.push_all.click()  # the remote holds them: nothing is sent again
        qtbot.waitUntil(lambda: log_has(w, "pushed 0 entries to team (0.0 MB sent), 2 already there"), timeout=60_000)
    finally:
        w.close()

    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path / "bob"))
    w = open_window(qtbot, engine, tmp_path)
    try:
        assert w.library_panel.selected_ids() == [] and w.remote.table.rowCount() == 0
        add_remote(qtbot, w, s3_env.endpoint)
        w.remote.require_signed.setChecked(True)  # unsigned: each entry refused, with its reason
        w.remote.pull_button.click()
        qtbot.waitUntil(lambda: log_has(w, "pulled 0 entries from team"), timeout=60_000)
        assert w.remote.log.toPlainText().count("not signed; --require-signed refuses it") == 2
        qtbot.waitUntil(lambda: not w.remote.busy, timeout=30_000)
        w.remote.require_signed.setChecked(False)
        w.remote.pull_button.click()
        qtbot.waitUntil(lambda: log_has(w, "pulled 2 entries from team"), timeout=120_000)
        assert "[2 replayed]" in w.remote.log.toPlainText()
        qtbot.waitUntil(lambda: w.library_panel.table.model().rowCount() == 2, timeout=10_000)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        qtbot.waitUntil(lambda: not w.remote.busy, timeout=30_000)
        w.remote.pull_button.click()
        qtbot.waitUntil(lambda: "refused these credentials" in w.remote.state.text(), timeout=60_000)
    finally:
        w.close()
