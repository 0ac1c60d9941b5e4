"""What the bundle leaves out (used by packaging/pyinstaller/kvgraft.spec after PyInstaller's analysis).

Every cut is a file kvgraft never loads; `make bundle`'s smoke test and `make bundle-check` run the
result. `python packaging/bundle_size.py dist/kvgraft` reports what is left, part by part.

- Qt: translations (the window is English only) and the plugins for targets a desktop session never
  uses (EGLFS, framebuffer, VNC, evdev input, network information, TLS backends, rarely seen image
  formats), and the GTK3 platform theme (it drags in a private copy of GTK's stack: cairo, pango,
  gdk-pixbuf; Qt's own Fusion style draws the window without it).
- botocore: the API models of every AWS service but S3 (kvgraft's remotes speak S3) and the ones boto3's
  credential providers call (STS for assume-role and web identity, SSO and SSO-OIDC for SSO profiles).
- llama.cpp: a wheel cannot hold symlinks, so each core library comes three times
  (libllama.so, libllama.so.0, libllama.so.0.5.0); the bundle keeps the name llama-cpp-python
  loads (libllama.so, libmtmd.so) and the soname the others link to (libggml.so.0, libggml-base.so.0).
  (llama_cpp/_ggml.py would load libggml.so by that name; nothing in llama-cpp-python 0.3.36 imports it.)
- Shared libraries at the bundle's top level that no kept binary links to any more (found by their
  DT_NEEDED entries), so a dropped plugin takes its private dependencies with it; and every symlink
  PyInstaller would write to a file no longer there.
"""

from __future__ import annotations

import posixpath
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
    # every service's models but S3's and the credential providers' (top-level files stay)
    re.compile(r"botocore/data/(?!(s3|sts|sso|sso-oidc)/)[^/]+/"),
    re.compile(r"llama_cpp/lib/lib(llama|mtmd)\.so\.\d"),  # loaded as libllama.so, libmtmd.so
    re.compile(r"llama_cpp/lib/libggml(-base)?\.so(\.\d+\.\d+\.\d+)?$"),  # linked as libggml(-base).so.0
]


def dropped(dest: str) -> bool:
    return any(p.search(dest) for p in _DROP)


def _needed(path: str) -> set[str] | None:
    """The DT_NEEDED names of an ELF file (empty for a file that is not one); None without readelf."""
    try:
        r = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout))


def _target(link: tuple) -> str:
    """Where a SYMLINK entry (dest, target relative to dest's folder, "SYMLINK") points, as a dest path."""
    dest, target, _ = link
    return posixpath.normpath(posixpath.join(posixpath.dirname(dest), target))


def prune(binaries: list, datas: list) -> tuple[list, list]:
    """PyInstaller TOC lists (dest, src, typecode) without the cuts above, without top-level shared
    libraries nothing kept links to, and without symlinks to what is gone. Without readelf only the
    named cuts are made (and a warning printed)."""
    binaries = [b for b in binaries if not dropped(b[0])]
    datas = [d for d in datas if not dropped(d[0])]
    files = [b for b in binaries if b[2] != "SYMLINK"]
    top = {b[0] for b in files if "/" not in b[0]}
    needed_by: dict[str, set[str]] = {}
    for dest, src, _ in files:
        names = _needed(src)
        if names is None:
            print("bundle_prune: readelf not found (binutils): unused libraries are kept")
            return _without_dangling(binaries, datas)
        needed_by[dest] = names
    # roots: everything in a package folder (extension modules, Qt plugins, llama.cpp's libraries, which
    # are dlopen'ed), top-level extension modules, and libpython (the bootloader dlopens it)
    todo = [
        dest
        for dest, _, kind in files
        if "/" in dest or kind == "EXTENSION" or not dest.startswith("lib") or dest.startswith("libpython")
    ]
    keep = set(todo)
    while todo:
        for name in needed_by.get(todo.pop(), ()):
            if name in top and name not in keep:
                keep.add(name)
                todo.append(name)
    binaries = [b for b in binaries if b[2] == "SYMLINK" or b[0] in keep or "/" in b[0]]
    return _without_dangling(binaries, datas)


def _without_dangling(binaries: list, datas: list) -> tuple[list, list]:
    present = {e[0] for e in binaries + datas if e[2] != "SYMLINK"}
    links = {e[0]: _target(e) for e in binaries + datas if e[2] == "SYMLINK"}

    def alive(dest: str, seen: int = 0) -> bool:  # a link to a link counts when the last one lands
        target = links[dest]
        return target in present or (target in links and seen < 8 and alive(target, seen + 1))

    def ok(e: tuple) -> bool:
        return e[2] != "SYMLINK" or alive(e[0])

    return [b for b in binaries if ok(b)], [d for d in datas if ok(d)]
