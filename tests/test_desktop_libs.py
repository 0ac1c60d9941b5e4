"""The window's system libraries are named before Qt can abort (app/core/desktop_libs.py)."""

from __future__ import annotations

import subprocess

from kvgraft.app.core import desktop_libs
from kvgraft.app.core.desktop_libs import debian_package, missing_libraries_message, missing_window_libraries


def test_package_names_follow_the_debian_convention():
    assert debian_package("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert debian_package("libxcb-keysyms.so.1") == "libxcb-keysyms1"
    assert debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert debian_package("libxcb-render-util.so.0.0.0") == "libxcb-render-util0"


def test_what_the_loader_cannot_find_is_named_with_its_package(monkeypatch, tmp_path):
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    out = (
        "\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x1)\n"
        "\tlibxcb-icccm.so.4 => not found\n\tlibxcb-keysyms.so.1 => not found\n"
    )
    monkeypatch.setattr(desktop_libs, "_qt_xcb_files", lambda: [plugin])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    monkeypatch.setattr(desktop_libs.ctypes.util, "find_library", lambda name: "libxcb-cursor.so.0")
    missing = missing_window_libraries()
    assert missing == {"libxcb-icccm.so.4": "libxcb-icccm4", "libxcb-keysyms.so.1": "libxcb-keysyms1"}
    text = missing_libraries_message(missing)
    assert text.endswith("sudo apt-get install libxcb-icccm4 libxcb-keysyms1")
    monkeypatch.setattr(desktop_libs.ctypes.util, "find_library", lambda name: None)  # Qt 6.5+ dlopens xcb-cursor
    assert missing_window_libraries()["libxcb-cursor.so"] == "libxcb-cursor0"


def test_this_machine_answers_with_names_and_packages():
    found = missing_window_libraries()
    assert all(isinstance(k, str) and v.startswith("lib") for k, v in found.items())
