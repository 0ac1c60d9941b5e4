"""The one way in (app/packs/admission.py): every blob of a pack or a pull is read once and its content
hashed once on its way into the library, on the real model, real packs and a real S3 server."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from types import SimpleNamespace

import pytest

import kvgraft.app.packs.admission as admission_mod
import kvgraft.library.admission as library_admission
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.packs.export import export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.remote.pull import pull
from kvgraft.app.remote.push import push
from kvgraft.app.service import LibraryService
from kvgraft.library.library import Library
from kvgraft.library.maintenance import gc
from kvgraft.library.pack import PackError, PackReader
from kvgraft.library.remote import RemoteRepo, RemoteSpec, S3BlobStore
from kvgraft.library.signing import generate_key

PROBLEMS = [p for p in starter_problems(24) if len(p.solution) < 1000][:3]


@pytest.fixture(scope="module")
def source(engine, tmp_path_factory):
    """A library of 3 short solutions, its signing key, and a signed and an unsigned pack of them."""
    d = tmp_path_factory.mktemp("admission")
    signer = generate_key(d / "alice.key")
    with Library(d / "alice") as lib:
        svc = LibraryService(engine, lib)
        entries = [
            svc.deposit_solution(
                p.question, p.solution, p.answer, checker=p.checker, vouched_by="checker:numeric"
            ).entry
            for p in PROBLEMS
        ]
        export_pack(lib, entries, d / "signed.kvpack", sign_key=d / "alice.key")
        export_pack(lib, entries, d / "plain.kvpack")
        svc.close()
    return SimpleNamespace(dir=d, home=d / "alice", key=d / "alice.key", signer=signer, entries=entries)


@pytest.fixture
def counted(monkeypatch):
    """Counts of what an admission does: pack members read (by name) and SHA-256 digests computed in one
    call over whole bytes (by digest; a blob's content hash is its address)."""
    reads, digests = Counter(), Counter()
    real_read, real_sha = PackReader._read_member, hashlib.sha256

    def read_member(self, sha):
        reads[sha] += 1
        return real_read(self, sha)

    def sha256(data=b"", **kw):
        h = real_sha(data, **kw)
        if len(data):
            digests[h.hexdigest()] += 1
        return h

    monkeypatch.setattr(PackReader, "_read_member", read_member)
    monkeypatch.setattr(hashlib, "sha256", sha256)
    return SimpleNamespace(reads=reads, digests=digests)


def _addresses(source) -> set[str]:
    return {e.blob_sha256 for e in source.entries}


def test_a_signed_pack_reads_and_hashes_each_blob_once(engine, source, counted, tmp_path):
    home = tmp_path / "bob"
    trust_store(home).trust(source.signer.public_key_b64, "alice")
    with Library(home) as lib:
        res = import_pack(LibraryService(engine, lib), source.dir / "signed.kvpack")
        assert (res.imported, res.proof) == (3, {"signed:alice": 3})
        assert {e.blob_sha256 for e in lib.entries()} == _addresses(source)
    assert {s: counted.reads[s] for s in _addresses(source)} == {s: 1 for s in _addresses(source)}
    assert {s: counted.digests[s] for s in _addresses(source)} == {s: 1 for s in _addresses(source)}


def test_an_unsigned_pack_reads_each_blob_once_and_replays_it(engine, source, counted, monkeypatch, tmp_path):
    in_replays, real_replay = Counter(), admission_mod.run_replay

    def replay(*a, **k):  # what the replay hashes is its own computed state: counted apart
        before = Counter(counted.digests)
        r = real_replay(*a, **k)
        in_replays.update(counted.digests - before)
        return r

    monkeypatch.setattr(admission_mod, "run_replay", replay)
    with Library(tmp_path / "carol") as lib:
        res = import_pack(LibraryService(engine, lib), source.dir / "plain.kvpack")
        assert (res.imported, res.proof, res.replayed) == (3, {"replayed": 3}, 3)
    assert {s: counted.reads[s] for s in _addresses(source)} == {s: 1 for s in _addresses(source)}
    assert all(in_replays[s] >= 1 for s in _addresses(source))  # the replays reproduced each address: the proof
    assert {s: counted.digests[s] - in_replays[s] for s in _addresses(source)} == {s: 1 for s in _addresses(source)}


def test_past_the_memory_budget_blobs_are_staged_at_once_and_a_refusal_leaves_only_what_gc_takes(
    engine, source, counted, monkeypatch, tmp_path
):
    monkeypatch.setattr(library_admission, "memory_budget", lambda: 0)
    with Library(tmp_path / "dan") as lib:
        res = import_pack(LibraryService(engine, lib), source.dir / "plain.kvpack")
        assert res.imported == 3 and len(list(lib.blobs.iter_shas())) == 3
    assert {s: counted.reads[s] for s in _addresses(source)} == {s: 1 for s in _addresses(source)}

    wrong = SimpleNamespace(sha256="0" * 64, seconds=0.0, receipt=None)  # a replay that does not reproduce the blob
    monkeypatch.setattr(admission_mod, "run_replay", lambda *a, **k: wrong)
    with Library(tmp_path / "erin") as lib:
        with pytest.raises(PackError, match="its blob is not the state of its text"):
            import_pack(LibraryService(engine, lib), source.dir / "plain.kvpack")
        assert lib.count() == 0
        assert lib._db.execute("SELECT count(*) FROM pending_blobs").fetchone()[0] == 0
        assert lib._db.execute("SELECT count(*) FROM packs").fetchone()[0] == 0
        gc(lib, grace_s=0)
        assert list(lib.blobs.iter_shas()) == []


def test_a_pull_reads_and_hashes_each_blob_once(engine, source, s3_env, counted, monkeypatch, tmp_path):
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_env.make_bucket(bucket)
    spec = RemoteSpec("team", bucket, "team/", s3_env.endpoint)
    with Library(source.home) as lib:
        push(lib, RemoteRepo(spec), [lib.get(e.id) for e in source.entries], sign_key=source.key)
    gets, real_get = Counter(), S3BlobStore.get_stored

    def get_stored(self, sha, limit=None):
        gets[sha] += 1
        return real_get(self, sha, limit)

    monkeypatch.setattr(S3BlobStore, "get_stored", get_stored)
    counted.digests.clear()  # what the push above hashed is not the pull's
    home = tmp_path / "frank"
    trust_store(home).trust(source.signer.public_key_b64, "alice")
    with Library(home) as lib:
        got = pull(LibraryService(engine, lib), RemoteRepo(spec))
        assert (got.imported, got.refused, got.proof) == (3, [], {"signed:alice": 3})
    want = {s: 1 for s in _addresses(source)}
    assert {s: gets[s] for s in want} == want and {s: counted.digests[s] for s in want} == want
