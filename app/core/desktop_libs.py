"""The system libraries the window's X11 platform plugin needs, found before Qt is started.

Qt's xcb plugin aborts the process (exit 134) when a library it links is missing, and names
`libxcb-cursor0` whatever was actually missing. `missing_window_libraries` asks the dynamic loader
(`ldd` on the plugin and Qt's XCB library, found without importing Qt) which shared objects it cannot
find, and names the Debian/Ubuntu package of each (`libxcb-icccm.so.4` -> `libxcb-icccm4`).
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import re
import subprocess
from pathlib import Path

# Qt 6.5+ loads xcb-cursor at run time (not in ldd's output): checked by name
_RUNTIME = {"xcb-cursor": "libxcb-cursor0"}


def debian_package(soname: str) -> str:
    """`libxcb-icccm.so.4` -> `libxcb-icccm4`, `libxkbcommon-x11.so.0` -> `libxkbcommon-x11-0`."""
    m = re.fullmatch(r"(lib[\w+.-]*?)\.so\.(\d+)(?:\.\d+)*", soname)
    if not m:
        return soname
    name, ver = m.groups()
    return f"{name}-{ver}" if name[-1].isdigit() else f"{name}{ver}"


def _qt_xcb_files() -> list[Path]:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    return sorted(root.glob("Qt/plugins/platforms/libqxcb.so")) + sorted(root.glob("Qt/lib/libQt6XcbQpa.so*"))


def missing_window_libraries() -> dict[str, str]:
    """{missing shared object: the package that provides it}; empty when the X11 window can start (or
    this is not Linux with ldd)."""
    missing: dict[str, str] = {}
    for f in _qt_xcb_files():
        try:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        for line in out.splitlines():
            if "=> not found" in line:
                so = line.split("=>")[0].strip()
                missing[so] = debian_package(so)
    if _qt_xcb_files():
        for lib, pkg in _RUNTIME.items():
            if ctypes.util.find_library(lib) is None:
                missing[f"lib{lib}.so"] = pkg
    return missing


def missing_libraries_message(missing: dict[str, str]) -> str:
    pkgs = " ".join(sorted(set(missing.values())))
    return (
        f"the window cannot start: these system libraries are missing: {', '.join(sorted(missing))}.\n"
        f"On Debian or Ubuntu: sudo apt-get install {pkgs}"
    )
