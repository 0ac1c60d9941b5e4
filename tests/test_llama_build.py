"""packaging/llama_build.py: the pinned sdist, our patches applied exactly or not at all, the wheel cache key.

The build itself runs in `make setup`; the test that the installed llama.cpp is the patched one is the
probe's (tests/test_batch_invariance.py): these cases check the script's refusals without building."""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parent.parent / "packaging"
spec = importlib.util.spec_from_file_location("llama_build", PACKAGING / "llama_build.py")
llama_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llama_build)

SGEMM = "vendor/llama.cpp/ggml/src/ggml-cpu/llamafile/sgemm.cpp"


def _tree(tmp_path: Path, body: str) -> Path:
    root = tmp_path / "src"
    (root / SGEMM).parent.mkdir(parents=True)
    (root / SGEMM).write_text(body)
    return root


def _patch(tmp_path: Path, name: str, old: list[str], new: list[str], start: int = 2) -> Path:
    hunk = [f"@@ -{start},{len(old)} +{start},{len(new)} @@", *(f"-{x}" for x in old), *(f"+{x}" for x in new)]
    path = tmp_path / name
    path.write_text(
        "Why: a header in prose, as ours have.\n\n" + "\n".join([f"--- a/{SGEMM}", f"+++ b/{SGEMM}", *hunk]) + "\n"
    )
    return path


def test_every_patch_says_why_and_names_its_files():
    patches = llama_build.patches()
    assert {p.name for p in patches} == {"sgemm-switch.patch", "flash-attn-one-path.patch", "tiled-small-rows.patch"}
    for p in patches:
        text = p.read_text()
        assert text.index("Why:") < text.index("--- a/"), f"{p.name} must say why before its diff"
        files = llama_build.parse_patch(text)
        assert files and all(rel.startswith("vendor/llama.cpp/") for rel, _ in files)


def test_a_patch_applies_at_its_line_and_refuses_other_context(tmp_path):
    root = _tree(tmp_path, "a\nb\nc\n")
    llama_build.apply_patch(_patch(tmp_path, "ok.patch", ["b"], ["B", "b2"]), root)
    assert (root / SGEMM).read_text() == "a\nB\nb2\nc\n"
    with pytest.raises(llama_build.PatchError, match="does not match the pinned source"):
        llama_build.apply_patch(_patch(tmp_path, "stale.patch", ["b"], ["x"]), root)
    assert (root / SGEMM).read_text() == "a\nB\nb2\nc\n", "a refused patch wrote nothing"


def test_a_patch_naming_a_file_outside_the_tree_is_refused(tmp_path):
    root = _tree(tmp_path, "a\nb\n")
    evil = tmp_path / "evil.patch"
    evil.write_text("--- a/../outside.txt\n+++ b/../outside.txt\n@@ -1,1 +1,1 @@\n-a\n+b\n")
    (tmp_path / "outside.txt").write_text("a\n")
    with pytest.raises(llama_build.PatchError, match="not a file of the source tree"):
        llama_build.apply_patch(evil, root)
    assert (tmp_path / "outside.txt").read_text() == "a\n"
    with pytest.raises(llama_build.PatchError, match="no file with hunks"):
        llama_build.parse_patch("only prose\n")


def test_the_cache_key_follows_each_patch_and_the_cmake_arguments(tmp_path, monkeypatch):
    key = llama_build.build_key("")
    assert key["sdist_sha256"] == llama_build.SDIST_SHA256 and re.fullmatch(r"[0-9a-f]{64}", key["sdist_sha256"])
    for name, sha in key["patches"].items():
        assert sha == hashlib.sha256((PACKAGING / "llama-cpp-python" / name).read_bytes()).hexdigest()
    assert llama_build.build_key(llama_build.CUDA_CMAKE_ARGS) != key
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    wheel = wheel_dir / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"built")
    info = {"key": key, "wheel": wheel.name, "sha256": hashlib.sha256(b"built").hexdigest()}
    (wheel_dir / "BUILD.json").write_text(__import__("json").dumps(info))
    assert llama_build.cached_wheel(wheel_dir, key) == wheel
    assert llama_build.cached_wheel(wheel_dir, {**key, "patches": {}}) is None, "a wheel of other patches was reused"
    wheel.write_bytes(b"changed")
    assert llama_build.cached_wheel(wheel_dir, key) is None, "a changed wheel was reused"


def test_an_sdist_with_another_hash_is_refused_and_removed(tmp_path, monkeypatch):
    cache = tmp_path / "sdist"
    cache.mkdir()
    calls = []

    def fake_download(cmd, check):  # stands in for pip: it "downloads" a tampered sdist
        calls.append(cmd)
        (cache / llama_build.SDIST).write_bytes(b"not the pinned source")

    monkeypatch.setattr(llama_build.subprocess, "run", fake_download)
    with pytest.raises(SystemExit, match="refusing to build from it"):
        llama_build.fetch_sdist(cache)
    assert calls and not (cache / llama_build.SDIST).exists()


def test_the_makefile_builds_the_patched_source_before_kvgraft():
    make = (PACKAGING.parent / "Makefile").read_text()
    stamp = next(line for line in make.splitlines() if line.startswith("$(STAMP):"))
    assert "$(LLAMA_BUILD)" in stamp and "llama-cpp-python/*.patch" in make, "a changed patch must rebuild"
    recipe = make[make.index("$(STAMP):") :]
    assert recipe.index("packaging/llama_build.py --install --cuda $(CUDA)") < recipe.index("pip install -e")
    assert "--no-binary llama-cpp-python" not in make, "the CUDA line would reinstall the unpatched source"


def test_the_stock_build_is_keyed_without_patches_and_unpacks_only_its_libraries(tmp_path):
    """`--stock` (the benchmarks' "llama.cpp as shipped"): its own cache key, never the patched wheel's."""
    import json
    import zipfile

    key = llama_build.build_key("")
    stock = {**key, "patches": {}}
    wheel_dir, lib_dir = tmp_path / "stock-wheel", tmp_path / "default" / "lib"
    wheel_dir.mkdir()
    wheel = wheel_dir / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/lib/libllama.so", b"stock llama")
        z.writestr("llama_cpp/lib/libggml-cpu.so", b"stock kernels")
        z.writestr("llama_cpp/__init__.py", b"")
    info = {"key": stock, "wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    (wheel_dir / "BUILD.json").write_text(json.dumps(info))
    assert llama_build.cached_wheel(wheel_dir, key) is None, "the stock wheel must never pass for the patched one"
    assert llama_build.stock_libraries(key, wheel_dir, lib_dir) == 0
    assert sorted(p.name for p in lib_dir.iterdir()) == ["libggml-cpu.so", "libllama.so"]
    assert (lib_dir / "libllama.so").read_bytes() == b"stock llama"
