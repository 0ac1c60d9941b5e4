"""Malformed, foreign or mismatched snapshots are refused with the engine's error type, never a crash."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft.app.core.textgen import prefix_tokens
from kvgraft.engine.errors import EngineError, FingerprintMismatch, SnapshotError
from kvgraft.engine.session import Snapshot
from kvgraft.engine.state import parse_state

REPO = Path(__file__).resolve().parent.parent
N = 600


@pytest.fixture(scope="module")
def reference(engine):
    with engine.session() as s:
        s.prefill(prefix_tokens(engine.model, N, seed=5))
        return s.snapshot()


def _put(data: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def _flip(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x01
    return bytes(b)


def malformed_cases(snap: Snapshot, layout_parse) -> dict[str, bytes]:
    d = snap.data
    p = layout_parse
    h = p.header_size  # u32 arch_len + "gemma3"
    c0 = h  # cache 0: u32 n_stream, u32 cell_count, cell meta...
    meta0 = c0 + 8
    k0 = [s for s in p.spans if s.cache == 0 and s.kind == "k"][0]
    v0_last = [s for s in p.spans if s.cache == 0 and s.kind == "v"][-1]
    c1 = v0_last.offset + v0_last.size
    k_hdr = k0.offset - 12  # i32 type, u64 row size
    data_hdr = k_hdr - 8  # u32 v_trans, u32 n_layer
    arch = d[4:h]
    return {
        "empty": b"",
        "truncated-3": d[:3],
        "truncated-header": d[: h - 1],
        "truncated-meta": d[: meta0 + 100],
        "truncated-half": d[: len(d) // 2],
        "truncated-last-byte": d[:-1],
        "extended-1": d + b"\0",
        "extended-4k": d + bytes(4096),
        "arch-len-huge": _put(d, 0, "<I", 0xFFFFFFF0),
        "arch-len-zero": _put(d, 0, "<I", 0),
        "arch-flipped": _flip(d, 5),
        "other-architecture": struct.pack("<I", 5) + b"llama" + d[h:],
        "n-stream-2": _put(d, c0, "<I", 2),
        "cell-count-plus-1": _put(d, c0 + 4, "<I", N + 1),
        "cell-count-huge": _put(d, c0 + 4, "<I", 0xFFFFFFFF),
        "cell-count-zero": _put(d, c0 + 4, "<I", 0),
        "cell-position-moved": _put(d, meta0 + 12 * 10, "<i", 11),
        "cell-two-sequences": _put(d, meta0 + 12 * 3 + 4, "<I", 2),
        "cell-sequence-id": _put(d, meta0 + 12 * 3 + 8, "<i", 1),
        "v-trans-flag": _put(d, data_hdr, "<I", 2),
        "layer-count": _put(d, data_hdr + 4, "<I", 4),
        "k-type-q8_0": _put(d, k_hdr, "<i", 8),
        "k-type-invalid": _put(d, k_hdr, "<i", 999),
        "k-row-size": _put(d, k_hdr + 4, "<Q", 1024),
        "k-row-size-huge": _put(d, k_hdr + 4, "<Q", 1 << 62),
        "second-cache-cell-count": _put(d, c1 + 4, "<I", N - 1),
        "second-cache-missing": d[:c1],
        "arch-only": struct.pack("<I", len(arch)) + arch,
    }


def test_parser_refuses_every_malformation(engine, reference):
    parsed = parse_state(reference.data, engine.layout, max_cells=engine.config.n_ctx)
    assert parsed.n_tokens == N
    for name, data in malformed_cases(reference, parsed).items():
        with pytest.raises(SnapshotError) as info:
            parse_state(data, engine.layout, max_cells=engine.config.n_ctx)
        assert str(info.value), name


def test_malformed_snapshots_refused_in_subprocess(engine, model_path, reference, tmp_path):
    """Every malformed snapshot goes to a real graft in a separate process: refused, no crash."""
    parsed = parse_state(reference.data, engine.layout)
    cases = []
    for name, data in malformed_cases(reference, parsed).items():
        f = tmp_path / f"{name}.state"
        f.write_bytes(data)
        cases.append({"name": name, "file": str(f), "mode": "raw", "tokens": list(reference.tokens)})
    # payload flips keep the structure valid: the content hash catches them
    for i, off in enumerate(
        [parsed.spans[0].offset + 17, parsed.spans[-1].offset + parsed.spans[-1].size - 1, len(reference.data) // 2]
    ):
        f = tmp_path / f"payload-flip-{i}.state"
        f.write_bytes(_flip(reference.data, off))
        cases.append(
            {
                "name": f"payload-flip-{i}",
                "file": str(f),
                "mode": "hashed",
                "tokens": list(reference.tokens),
                "sha256": reference.sha256,
            }
        )
    good = tmp_path / "good.state"
    good.write_bytes(reference.data)
    cases.append(
        {
            "name": "control-good",
            "file": str(good),
            "mode": "hashed",
            "tokens": list(reference.tokens),
            "sha256": reference.sha256,
        }
    )
    cases.append({"name": "wrong-token-count", "file": str(good), "mode": "raw", "tokens": list(reference.tokens)[:-1]})
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases))

    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "graft_worker.py"), str(model_path), str(cases_file)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, f"worker died with {proc.returncode}: {proc.stderr[-2000:]}"
    results = {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert results.pop("control-good")["ok"] is True
    assert len(results) == len(cases) - 1
    for name, r in results.items():
        assert r["ok"] is False, f"{name} was accepted"
        assert r["error_type"] == "SnapshotError", (name, r)
        assert r["message"]


def test_fingerprint_mismatch_refused(engine, engine_fa, probe):
    with engine_fa.session() as s:
        s.prefill(prefix_tokens(engine.model, 100, seed=1))
        snap_fa = s.snapshot()
    with engine.session() as g:
        with pytest.raises(FingerprintMismatch, match="fingerprint"):
            g.graft(snap_fa)
        assert g.n_past == 0
        # bypassing the fingerprint, the layout check still refuses the transposed-V mismatch
        with pytest.raises(SnapshotError, match="flash attention"):
            g.graft_bytes(snap_fa.data, snap_fa.tokens)


def test_graft_needs_empty_context(engine, reference):
    with engine.session() as s:
        s.prefill([engine.model.bos])
        with pytest.raises(EngineError, match="empty context"):
            s.graft(reference)


def test_snapshot_too_long_for_context(engine, reference):
    small = engine.with_config(engine.config.replace(n_ctx=512, n_batch=512, n_ubatch=512))
    with small.session() as s, pytest.raises(SnapshotError, match="more than the context"):
        s.graft(reference)
