"""What the bundle leaves out (used by packaging/pyinstaller/kvgraft.spec after PyInstaller's analysis).

Every cut is a file kvgraft never loads; `make bundle`'s smoke test and `make bundle-check` run the
result. `python packaging/bundle_size.py dist/kvgraft` reports what is left, part by part.

- Qt: translations (the window is English only) and the plugins for targets a desktop session never
  uses (EGLFS, framebuffer, VNC, evdev input, network information, TLS backends, rarely seen image
  formats), and the GTK3 platform theme (it drags in a private copy of GTK's stack: cairo, pango,
  gdk-pixbuf; Qt's own Fusion style draws the window without it).
- botocore: the API models of every AWS service but S3 (kvgraft's remotes speak S3 only).
- llama.cpp: a wheel cannot hold symlinks, so each core library comes three times
  (libllama.so, libllama.so.0, libllama.so.0.5.0); the bundle keeps the name llama-cpp-python
  loads (libllama.so, libmtmd.so) and the soname the others link to (libggml.so.0, libggml-base.so.0).
- Shared libraries at the bundle's top level that no kept binary links to any more (found by their
  DT_NEEDED entries), so a dropped plugin takes its private dependencies with it.
"""

from __future__ import annotations

import re
import subprocess

QT = "PySide6/Qt/"
_DROP = [
    re.compile(QT + r"translations/"),
    re.compile(QT + r"plugins/(egldeviceintegrations|generic|networkinformation|tls)/"),
    re.compile(QT + r"plugins/platforms/lib(qeglfs|qlinuxfb|qminimalegl|qvkkhrdisplay|qvnc)\.so$"),
    re.compile(QT + r"plugins/platformthemes/libqgtk3\.so$"),
    re.compile(QT + r"plugins/imageformats/lib(qtiff|qwebp|qtga|qwbmp|qicns)\.so$"),
    re.compile(QT + r"lib/libQt6(EglFSDeviceIntegration|EglFsKmsSupport)\.so"),
    re.compile(r"botocore/data/(?!s3/)[^/]+/"),  # every service's models but S3's (top-level files stay)
    re.compile(r"llama_cpp/lib/lib(llama|mtmd)\.so\.\d"),  # loaded as libllama.so, libmtmd.so
    re.compile(r"llama_cpp/lib/libggml(-base)?\.so(\.\d+\.\d+\.\d+)?$"),  # linked as libggml(-base).so.0
]


def dropped(dest: str) -> bool:
    return any(p.search(dest) for p in _DROP)


def _needed(path: str) -> set[str] | None:
    try:
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def prune(binaries: list, datas: list) -> tuple[list, list]:
    """PyInstaller TOC lists (dest, src, typecode) without the cuts above and without top-level shared
    libraries nothing kept links to. Keeps everything when readelf is missing."""
    binaries = [b for b in binaries if not dropped(b[0])]
    datas = [d for d in datas if not dropped(d[0])]
    top = {b[0] for b in binaries if "/" not in b[0]}
    needed_by: dict[str, set[str]] = {}
    for dest, src, _ in binaries:
        names = _needed(src)
        if names is None:
            return binaries, datas
        needed_by[dest] = names
    # roots: everything in a package folder (extension modules, Qt plugins, llama.cpp's libraries, which
    # are dlopen'ed), top-level extension modules, and libpython (the bootloader dlopens it)
    todo = [
        dest
        for dest, _, kind in binaries
        if "/" in dest or kind == "EXTENSION" or not dest.startswith("lib") or dest.startswith("libpython")
    ]
    keep = set(todo)
    while todo:
        for name in needed_by.get(todo.pop(), ()):
            if name in top and name not in keep:
                keep.add(name)
                todo.append(name)
    return [b for b in binaries if b[0] in keep], datas
