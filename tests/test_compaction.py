"""Exact state compaction: canonical snapshots, the compact blob container, migration, packs.

The exactness claims use the real model: a blob written to disk as a compact container, read back
(zero-filled into a reused buffer holding garbage) and grafted gives logits SHA-256-equal to a
fresh prefill, with flash attention off (transposed V: dead cells are strided runs) and on.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.app.maintain.recompaction import compact_library
from kvgraft.app.service import LibraryService, model_record, open_library
from kvgraft.app.verify.items import compare_receipts, library_items, run_verify
from kvgraft.engine.compaction import WindowSpec, canonicalize, dead_cells, dead_ranges, is_canonical
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.state import parse_state
from kvgraft.library import container
from kvgraft.library.blobstore import CHUNK, BlobStore, chunk_digests
from kvgraft.library.errors import BlobCorrupt, LibraryError
from kvgraft.library.maintenance import fsck

PROBE = " Question: which word came up most often above? Answer:"


# -- pure: the byte ranges of dead cells, on synthetic states of a known layout ----------------
def synthetic_state(
    n: int, caches: list[tuple[int, bool]], k_row: int = 8, v_el: int = 2, v_embd: int = 4, arch: bytes = b"toy"
) -> tuple[bytes, list]:
    """A whole-state in llama.cpp's layout with every K/V byte set to 1 + (cell % 250), and the
    list of (offset, cell) for each K/V byte, so a test can say which cell each byte belongs to."""
    out = bytearray(struct.pack("<I", len(arch)) + arch)
    owner = []
    for n_layer, v_trans in caches:
        out += struct.pack("<II", 1, n)
        for i in range(n):
            out += struct.pack("<iIi", i, 1, 0)
        out += struct.pack("<II", int(v_trans), n_layer)
        for _ in range(n_layer):
            out += struct.pack("<iQ", 1, k_row)
            for cell in range(n):
                owner.append((len(out), k_row, cell))
                out += bytes([1 + cell % 250]) * k_row
        for _ in range(n_layer):
            if v_trans:
                out += struct.pack("<iII", 1, v_el, v_embd)
                for _row in range(v_embd):
                    for cell in range(n):
                        owner.append((len(out), v_el, cell))
                        out += bytes([1 + cell % 250]) * v_el
            else:
                out += struct.pack("<iQ", 1, v_el * v_embd)
                for cell in range(n):
                    owner.append((len(out), v_el * v_embd, cell))
                    out += bytes([1 + cell % 250]) * (v_el * v_embd)
    return bytes(out), owner


@pytest.mark.parametrize("v_trans", [False, True], ids=["v-rows", "v-transposed"])
@pytest.mark.parametrize("n", [1, 5, 6, 7, 20])
def test_exactly_the_dead_window_cells_are_zeroed(n, v_trans):
    n_swa = 6
    data, owner = synthetic_state(n, [(2, v_trans), (3, v_trans)])
    parsed = parse_state(data)
    spec = WindowSpec.for_model(n_swa, "toy", len(parsed.layout.caches))
    assert spec == WindowSpec(6, (1,))
    buf = bytearray(data)
    canonicalize(buf, parsed, spec)
    d = dead_cells(n, n_swa)
    assert d == max(0, n - 6)
    swa_start = owner[len(owner) * 2 // 5][0]  # caches hold 2 and 3 layers: the SWA cache's bytes start 2/5 in
    for off, size, cell in owner:
        dead = off >= swa_start and cell <= n - 1 - n_swa  # n_swa or more behind the last position
        assert buf[off : off + size] == (bytes(size) if dead else data[off : off + size]), (off, cell)
    # nothing outside K/V changed, and canonicalization is idempotent
    again = bytearray(buf)
    canonicalize(again, parse_state(again), spec)
    assert again == buf and is_canonical(buf, parsed, spec)
    assert is_canonical(data, parsed, spec) == (d == 0)


def test_a_model_without_sliding_window_is_untouched():
    data, _ = synthetic_state(40, [(4, True)])
    parsed = parse_state(data)
    for spec in (
        WindowSpec.for_model(0, "toy", 1),
        WindowSpec.for_model(8, "toy", 1),
        WindowSpec.for_model(8, "llama4", 2),
        WindowSpec.for_model(0, "gemma3", 2),
    ):
        assert not spec.active
        buf = bytearray(data)
        assert len(canonicalize(buf, parsed, spec)) == 0 and buf == data


# -- the container --------------------------------------------------------------------------------
def _zeroed(size: int, ranges, seed: int = 0) -> bytearray:
    rng = np.random.default_rng(seed)
    buf = bytearray(rng.integers(1, 256, size, dtype=np.uint8).tobytes())
    for off, n in ranges:
        buf[off : off + n] = bytes(n)
    return buf


def test_container_round_trip_across_chunk_boundaries(tmp_path):
    size = 3 * CHUNK + 23456
    ranges = [(0, 100), (CHUNK - 50, 100), (CHUNK + 7, CHUNK), (3 * CHUNK, 1), (size - 10, 10)]
    ranges += [(3 * CHUNK + 1000 + 64 * k, 32) for k in range(200)]  # many small strided runs
    data = _zeroed(size, ranges)
    store = BlobStore(tmp_path / "blobs")
    stored = store.put(data, elide=ranges)
    assert stored.sha256 == hashlib.sha256(data).hexdigest() and stored.size == size
    on_disk = store.path(stored.sha256).stat().st_size
    assert on_disk == stored.stored_size < size - CHUNK
    assert stored.chunks == chunk_digests(store.path(stored.sha256).read_bytes())
    garbage = bytearray(os.urandom(size + 999))  # a reused graft buffer holding another blob's bytes
    view = store.read_chunked(stored.sha256, size, stored.chunks, into=garbage)
    assert bytes(view) == bytes(data)
    assert bytes(store.read_verified(stored.sha256, size)) == bytes(data)
    assert store.verify(stored.sha256) is None
    again = store.put(data, elide=ranges)  # the same bytes: not written again
    assert not again.written and again.chunks == stored.chunks
    # one chunk holding the header and many small runs (the scratch-and-scatter read path)
    small_ranges = [(100 + 300 * k, 200) for k in range(150)] + [(50000, 7), (50020, 7), (60000, 1)]
    small = _zeroed(70000, small_ranges, seed=1)
    s2 = store.put(small, elide=small_ranges)
    assert bytes(store.read_chunked(s2.sha256, len(small), s2.chunks, into=bytearray(os.urandom(80000)))) == bytes(
        small
    )


def test_container_refuses_eliding_bytes_that_are_not_zero(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    data = _zeroed(4096, [(100, 50)])
    with pytest.raises(LibraryError, match="declared zero"):
        store.put(data, elide=[(90, 60)])
    assert list(store.iter_shas()) == [] and list(store.iter_temp()) == []


def test_hostile_container_headers_are_refused_before_allocating():
    huge = container.encode_header(1 << 39, np.array([[0, (1 << 39) - 10]], dtype=np.uint64)) + b"x" * 10
    with pytest.raises(container.ContainerError, match="implausible"):
        container.parse_header(huge, stored_size=len(huge))
    long_table = struct.pack("<4sHHQQ", b"KVGC", 1, 0, 100, 1 << 22) + bytes(32)
    with pytest.raises(container.ContainerError, match="truncated"):
        container.parse_header(long_table, stored_size=len(long_table))
    overlapping = container.encode_header(100, np.array([[10, 20], [20, 5]], dtype=np.uint64)) + bytes(75)
    with pytest.raises(container.ContainerError, match="sorted"):
        container.parse_header(overlapping, stored_size=len(overlapping))
    with pytest.raises(container.ContainerError, match="bad magic"):
        container.parse_header(b"GGUF" + bytes(40))
    # sums that would wrap around 2**64 (a range of length 2**63 - 1) are caught before any addition
    wrap = container.encode_header(100, np.array([[1, (1 << 63) - 1]], dtype=np.uint64)) + bytes(100)
    with pytest.raises(container.ContainerError, match="past the end"):
        container.parse_header(wrap)


def test_tampered_range_table_cannot_steer_the_zero_fill(tmp_path):
    """Even a header that parses cannot place zeros before its chunk digest has been checked."""
    ranges = [(1000, 5000)]
    data = _zeroed(CHUNK + 50000, ranges)
    store = BlobStore(tmp_path / "blobs")
    stored = store.put(data, elide=ranges)
    path = store.path(stored.sha256)
    raw = bytearray(path.read_bytes())
    raw[container.HEAD_SIZE : container.HEAD_SIZE + 16] = np.array(
        [[500, 5000]], dtype="<u8"
    ).tobytes()  # same size, moved
    path.write_bytes(raw)
    buf = bytearray(b"\xff" * stored.size)
    with pytest.raises(BlobCorrupt):
        store.read_chunked(stored.sha256, stored.size, stored.chunks, into=buf)
    assert buf[500:1000] == b"\xff" * 500  # no zero was written from the unchecked table


def test_an_intact_file_in_another_form_is_kept(tmp_path):
    """Storing bytes whose address already holds a plain (pre-compaction) file keeps that file:
    replacing it would pull it from under readers holding its chunk digests."""
    store = BlobStore(tmp_path / "blobs")
    data = bytes(_zeroed(10000, [(0, 4000)]))
    sha = hashlib.sha256(data).hexdigest()
    store.path(sha).parent.mkdir(parents=True)
    store.path(sha).write_bytes(data)
    before = store.path(sha).stat().st_ino
    stored = store.put(data, elide=[(0, 4000)])
    assert not stored.written and stored.stored_size == 10000 and store.path(sha).stat().st_ino == before
    assert bytes(store.read_chunked(sha, 10000, stored.chunks)) == data


@pytest.mark.parametrize("where", ["header", "table", "live", "truncate"])
def test_damaged_container_is_caught_by_both_read_paths(tmp_path, where):
    ranges = [(1000, 5000), (CHUNK + 10, 20000)]
    data = _zeroed(CHUNK + 50000, ranges)
    store = BlobStore(tmp_path / "blobs")
    stored = store.put(data, elide=ranges)
    path = store.path(stored.sha256)
    raw = bytearray(path.read_bytes())
    if where == "header":
        raw[8] ^= 1  # canonical size
    elif where == "table":
        raw[container.HEAD_SIZE + 16] ^= 4  # second range's offset
    elif where == "live":
        raw[len(raw) // 2] ^= 0x80
    else:
        raw = raw[:-1]
    path.write_bytes(raw)
    with pytest.raises(BlobCorrupt):
        store.read_chunked(stored.sha256, stored.size, stored.chunks, into=bytearray(stored.size))
    with pytest.raises(BlobCorrupt):
        store.read_verified(stored.sha256, stored.size)
    assert store.verify(stored.sha256) is not None


# -- the real model: compacted grafts are exact ----------------------------------------------------
@pytest.fixture
def service(engine):
    lib = open_library()
    with LibraryService(engine, lib) as service:  # frees its warm context
        yield service
    lib.close()


def _fresh_logits_sha(engine, tokens, probe) -> str:
    with engine.session() as s:
        s.prefill(tokens)
        s.prefill(probe)
        return logits_sha256(s.logits())


def check_compacted_graft(eng, n: int) -> None:
    """Snapshot an n-token prefix, store it compact, read it back over garbage, graft: exact."""
    tokens = prefix_tokens(eng.model, n, seed=n)
    probe = eng.model.tokenize(PROBE, add_bos=False)
    with eng.session() as s:
        s.prefill(tokens)
        snap = s.snapshot()
        s.prefill(probe)
        want = logits_sha256(s.logits())
    with open_library() as lib:
        service = LibraryService(eng, lib)
        e, _ = lib.add_entry(
            kind="document",
            text=f"prefix {n}",
            tokens=tokens,
            blob=snap.data,
            blob_sha256=snap.sha256,
            fingerprint=eng.fingerprint,
            elided=snap.elided,
        )
        parsed = parse_state(snap.data)
        d = dead_cells(n, eng.window.n_swa)
        assert d == n - 512 > 0
        ranges = dead_ranges(parsed, eng.window)
        assert int(ranges[:, 1].sum()) == d * parsed.layout.caches[1].bytes_per_cell()
        assert lib.blobs.stored_size(e.blob_sha256) == container.make(e.blob_size, ranges).stored_size
        service._graft_buf = bytearray(os.urandom(e.blob_size + 4096))  # garbage where the zeros go
        with eng.session() as g:
            service.graft(g, e)
            g.prefill(probe)
            assert logits_sha256(g.logits()) == want
    with eng.session() as fresh:  # replay: a fresh prefill canonicalizes to the stored address
        fresh.prefill(tokens)
        assert fresh.snapshot().sha256 == e.blob_sha256
        assert fresh.snapshot(canonical=False).sha256 != e.blob_sha256


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("n", [513, 1000, pytest.param(2048, marks=pytest.mark.slow)])  # 2,048: `make test-slow`
def test_compacted_graft_from_disk_is_exact(engine, engine_fa, n, flash_attn):
    check_compacted_graft(engine_fa if flash_attn else engine, n)


def test_grafted_context_snapshots_canonical_again(engine):
    toks = prefix_tokens(engine.model, 1200, seed=3)
    with engine.session() as s:
        s.prefill(toks)
        snap = s.snapshot()
    assert len(snap.elided) == 15 + 15 * 256  # K runs + one run per transposed V row, 15 window layers
    with engine.session() as g:
        g.graft(snap)
        raw = g.snapshot(canonical=False)
        again = g.snapshot()
    assert again.sha256 == snap.sha256
    assert raw.sha256 == snap.sha256  # the grafted context holds the canonical bytes themselves


# -- migration of blobs stored before compaction ----------------------------------------------------
def _make_legacy(service, engine, text):
    """A library entry exactly as kvgraft stored it before compaction: a plain file named by the
    SHA-256 of llama.cpp's bytes, a blob row without stored_size/canonical."""
    lib = service.library
    tokens = engine.model.tokenize(text)
    with engine.session() as s:
        s.prefill(tokens)
        raw = s.snapshot(canonical=False)
    entry, _ = lib.add_entry(
        kind="document",
        text=text,
        tokens=tokens,
        blob=raw.data,
        fingerprint=engine.fingerprint,
        model=model_record(engine),
        receipt=None,
    )
    lib.blobs.path(raw.sha256).write_bytes(raw.data)
    with lib.write():
        lib._db.execute(
            "UPDATE blobs SET stored_size = NULL, canonical = NULL, chunks = ? WHERE sha256 = ?",
            [chunk_digests(raw.data), raw.sha256],
        )
    return lib.get(entry.id), raw


def test_fsck_repair_compacts_old_blobs_and_keeps_receipts_true(service, engine, probe):
    text = engine.model.detokenize(prefix_tokens(engine.model, 1200, seed=15)[1:])  # 688 tokens behind the window
    entry, raw = _make_legacy(service, engine, text)
    lib = service.library
    assert lib.blobs.stored_size(entry.blob_sha256) == entry.blob_size  # plain file
    report = fsck(lib)
    assert report["ok"] and report["uncompacted"] == 1
    with engine.session() as g:  # an old blob still grafts exactly
        service.graft(g, entry)
        g.prefill(probe)
        old_graft = logits_sha256(g.logits())
    assert old_graft == _fresh_logits_sha(engine, entry.tokens, probe)
    old_receipts = run_verify(service, library_items(service, [entry]), [], replay=True, samples=1)
    assert old_receipts["ok"], old_receipts["failures"]
    old_receipts["receipts_version"] = 1  # what kvgraft wrote before compaction (same hashes)

    res = compact_library(lib, window=lambda sha: (engine.model.info.n_swa, engine.model.info.architecture))
    assert res["converted"] == 1 and not res["skipped"]
    assert res["bytes_after"] < 0.6 * res["bytes_before"]
    moved = lib.get(entry.id)
    with engine.session() as s:
        s.prefill(entry.tokens)
        assert s.snapshot().sha256 == moved.blob_sha256 != raw.sha256
    assert not lib.blobs.contains(raw.sha256)
    assert (
        lib._db.execute("SELECT sha256 FROM blob_aliases WHERE legacy_sha256 = ?", [raw.sha256]).fetchone()[0]
        == moved.blob_sha256
    )
    report = fsck(lib)
    assert report["ok"] and report["uncompacted"] == 0, report["problems"]
    with engine.session() as g:
        service.graft(g, moved)
        g.prefill(probe)
        assert logits_sha256(g.logits()) == old_graft
    new_receipts = run_verify(service, library_items(service, [moved]), [], replay=True, samples=1)
    assert new_receipts["ok"], new_receipts["failures"]
    assert compare_receipts(old_receipts, new_receipts) == []
    # a receipt that claimed another hash is still caught
    bad = json.loads(json.dumps(old_receipts))
    bad["results"][0]["checks"]["replay_blob_sha256"] = "0" * 64
    assert [d["check"] for d in compare_receipts(bad, new_receipts)] == ["replay_blob_sha256"]


def test_cli_fsck_repair_compacts_with_the_window_from_the_gguf(service, engine):
    from click.testing import CliRunner

    from kvgraft.entry import cli

    entry, raw = _make_legacy(service, engine, engine.model.detokenize(prefix_tokens(engine.model, 800, seed=8)[1:]))
    service.library.close()  # the CLI opens the library itself
    run = CliRunner().invoke
    r = run(cli, ["fsck"])
    assert r.exit_code == 0 and "1 blob from before compaction (run kvgraft fsck --repair" in r.stdout, r.output
    assert json.loads(run(cli, ["stats", "--json"]).stdout)["uncompacted_blobs"] == 1
    r = run(cli, ["fsck", "--repair", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["compacted"]["converted"] == 1 and report["uncompacted"] == 0 and report["ok"]
    stats = json.loads(run(cli, ["stats", "--json"]).stdout)
    assert stats["uncompacted_blobs"] == 0 and stats["bytes"] < 0.75 * stats["canonical_bytes"]
    shown = json.loads(run(cli, ["show", str(entry.id), "--json"]).stdout)
    assert shown["blob_sha256"] != raw.sha256 and shown["blob_stored_size"] == stats["bytes"]


def test_short_old_blob_keeps_its_address_and_exports(service, engine, tmp_path):
    """Under the window there is nothing to zero: the address stays, the plain file is kept as it
    is (never replaced under a reader), and export wraps it as a format 2 member."""
    from kvgraft.app.packs.export import export_pack
    from kvgraft.library.pack import PackReader

    entry, raw = _make_legacy(service, engine, "A short note about eleven green doors, " * 20)
    assert entry.n_tokens < 512
    res = compact_library(service.library, window=lambda sha: (engine.model.info.n_swa, engine.model.info.architecture))
    assert res["converted"] == 1
    moved = service.library.get(entry.id)
    assert moved.blob_sha256 == raw.sha256 and service.library.blobs.stored_size(raw.sha256) == len(raw.data)
    assert fsck(service.library)["ok"] and fsck(service.library)["uncompacted"] == 0
    out = tmp_path / "short.kvpack"
    export_pack(service.library, [moved], out)
    with PackReader(out) as reader:
        assert bytes(reader.read_blob(raw.sha256)) == bytes(raw.data)


def test_compaction_skips_blobs_whose_model_is_not_here(service, engine):
    entry, raw = _make_legacy(service, engine, "A short note about eleven green doors, " * 30)
    res = compact_library(service.library, window=lambda sha: None)
    assert res["converted"] == 0 and "not available" in res["skipped"][0]["skipped"]
    assert service.library.get(entry.id).blob_sha256 == raw.sha256 and service.library.blobs.contains(raw.sha256)


def test_format_1_pack_imports_compacted(service, engine, probe, tmp_path):
    """A pack written before compaction (format 1: llama.cpp's bytes, named by their SHA-256)."""
    from kvgraft.app.packs.export import export_pack
    from kvgraft.app.packs.imports import import_pack
    from kvgraft.library.pack import PackError, PackReader, write_pack

    text = engine.model.detokenize(prefix_tokens(engine.model, 1100, seed=11)[1:])
    tokens = engine.model.tokenize(text)
    with engine.session() as s:
        s.prefill(tokens)
        raw = s.snapshot(canonical=False)
        s.prefill(probe)
        fresh = logits_sha256(s.logits())
    manifest = {
        "format_version": 1,
        "kvgraft_version": "0.1.0",
        "model": {"sha256": engine.model.info.sha256, "name": "m", "architecture": "gemma3"},
        "fingerprint": engine.fingerprint,
        "entries": [
            {
                "blob_sha256": raw.sha256,
                "blob_size": len(raw.data),
                "kind": "document",
                "text": text,
                "n_tokens": len(tokens),
                "tokens_sha256": tokens_sha(tokens),
            }
        ],
    }
    # the same bytes dressed as format 2 are refused: a format 2 blob must already be canonical
    fake = tmp_path / "fake.kvpack"
    stored = container.make(len(raw.data), []).header + bytes(raw.data)
    fake_manifest = json.loads(json.dumps(manifest))
    fake_manifest["format_version"] = 2
    fake_manifest["entries"][0]["blob_stored_size"] = len(stored)
    write_pack(fake, fake_manifest, [(raw.sha256, lambda: stored)])
    with pytest.raises(PackError, match="not in canonical form"):
        import_pack(service, fake)
    assert service.library.count() == 0
    old = tmp_path / "old.kvpack"
    write_pack(old, manifest, [(raw.sha256, lambda: bytes(raw.data))])
    res = import_pack(service, old)
    assert res.imported == 1
    [e] = service.library.entries()
    assert e.proof == "replayed" and res.replayed == 1  # an old pack's state is proven by a replay here
    assert e.blob_sha256 != raw.sha256 and service.library.blobs.stored_size(e.blob_sha256) < 0.7 * len(raw.data)
    assert (
        service.library._db.execute("SELECT sha256 FROM blob_aliases WHERE legacy_sha256 = ?", [raw.sha256]).fetchone()[
            0
        ]
        == e.blob_sha256
    )
    with engine.session() as g:
        service.graft(g, e)
        g.prefill(probe)
        assert logits_sha256(g.logits()) == fresh
    # and out again as format 3: the member is the stored container, named by the canonical bytes
    new = tmp_path / "new.kvpack"
    export_pack(service.library, [e], new)
    with PackReader(new) as reader:
        assert reader.manifest.format_version == 3 and reader.blob_shas() == [e.blob_sha256]
        assert reader.manifest.entries[0].blob_stored_size == service.library.blobs.stored_size(e.blob_sha256)
        assert hashlib.sha256(reader.read_blob(e.blob_sha256)).hexdigest() == e.blob_sha256


def tokens_sha(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()
