"""The byte layout of a llama.cpp whole-state snapshot, parsed and validated in pure Python.

No byte of a snapshot reaches llama.cpp before `parse_state` has walked it completely and found
that it adds up to exactly its length and matches the layout of the loaded model. This module
imports neither llama_cpp nor anything native, so it can be fuzzed in-process.

Whole-state layout, as written by `llama_state_get_data` in the llama.cpp that llama-cpp-python
0.3.36 vendors (src/llama-context.cpp `state_write_data`, src/llama-kv-cache.cpp
`state_write` / `state_write_meta` / `state_write_data`), all little-endian:

    u32 arch_len, arch_len bytes of architecture name            <- the "header"
    per KV cache (one for plain models; for sliding-window models two: global, then SWA):
        u32 n_stream
        per stream:
            u32 cell_count                                        (0: nothing else for this stream)
            cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id)
            u32 v_trans, u32 n_layer
            n_layer x (i32 k_type, u64 k_row_size, cell_count * k_row_size bytes)
            if not v_trans: n_layer x (i32 v_type, u64 v_row_size, cell_count * v_row_size bytes)
            else:           n_layer x (i32 v_type, u32 v_el_size, u32 n_embd_v,
                                       n_embd_v * cell_count * v_el_size bytes)

The per-sequence restore (`llama_state_seq_set_data`) reads the same memory payload after a
different header (u32 magic 0xaf143cd8, i32 seq_id). See docs/exact-graft.md for why kvgraft
grafts the whole-state payload through that path.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .errors import SnapshotError

SEQ_STATE_MAGIC = 0xAF143CD8
MAX_ARCH_LEN = 128
MAX_LAYERS = 4096
MAX_ROW_BYTES = 1 << 26
MAX_CACHES = 8

GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 30: "bf16"}

_CELL_META = np.dtype([("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])


def type_name(ggml_type: int) -> str:
    return GGML_TYPE_NAMES.get(ggml_type, f"type {ggml_type}")


@dataclass(frozen=True)
class CacheLayout:
    """What one KV cache's payload looks like, independent of how many cells it holds."""

    v_trans: bool
    k_rows: tuple[tuple[int, int], ...]  # per layer: (ggml type, bytes per cell)
    v_rows: tuple[tuple[int, int, int], ...]  # per layer: (ggml type, element size, n_embd) if v_trans,
    #                                           else (ggml type, bytes per cell, 0)

    @property
    def n_layer(self) -> int:
        return len(self.k_rows)

    def bytes_per_cell(self) -> int:
        k = sum(row for _, row in self.k_rows)
        v = sum(el * n_embd for _, el, n_embd in self.v_rows) if self.v_trans else sum(row for _, row, _ in self.v_rows)
        return k + v


@dataclass(frozen=True)
class StateLayout:
    """The layout a model + context configuration produces: architecture and one entry per cache."""

    arch: str
    caches: tuple[CacheLayout, ...]

    def bytes_per_token(self) -> int:
        return sum(c.bytes_per_cell() for c in self.caches)


@dataclass(frozen=True)
class TensorSpan:
    """Where one layer's K or V bytes sit in the snapshot (for compaction and diagnostics)."""

    cache: int
    layer: int
    kind: str  # "k" or "v"
    offset: int
    size: int


@dataclass(frozen=True)
class ParsedState:
    layout: StateLayout
    n_tokens: int
    header_size: int  # bytes before the memory payload: u32 + architecture name
    spans: tuple[TensorSpan, ...]

    @property
    def arch(self) -> str:
        return self.layout.arch


class _Reader:
    def __init__(self, data) -> None:
        self.view = memoryview(data).cast("B")
        self.size = len(self.view)
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise SnapshotError(
                f"snapshot truncated: {what} needs {n} bytes at offset {self.pos}, only {self.size - self.pos} left"
            )

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.view, self.pos)
        self.pos += n
        return values if len(values) > 1 else values[0]

    def skip(self, n: int, what: str) -> int:
        self.need(n, what)
        start = self.pos
        self.pos += n
        return start


def _read_header(r: _Reader) -> str:
    arch_len = r.unpack("<I", "architecture name length")
    if not 1 <= arch_len <= MAX_ARCH_LEN:
        raise SnapshotError(f"not a llama.cpp state: architecture name length {arch_len} is out of range")
    start = r.skip(arch_len, "architecture name")
    raw = bytes(r.view[start : start + arch_len])
    if not all(0x21 <= b < 0x7F for b in raw):
        raise SnapshotError("not a llama.cpp state: architecture name is not printable ASCII")
    return raw.decode("ascii")


def _read_cells(r: _Reader, cache: int, cell_count: int) -> None:
    """Per-cell metadata: kvgraft snapshots hold one sequence (0) at positions 0..n-1, in order."""
    r.need(cell_count * _CELL_META.itemsize, f"cache {cache} cell metadata")
    meta = np.frombuffer(r.view, dtype=_CELL_META, count=cell_count, offset=r.pos)
    bad = np.flatnonzero(meta["n_seq_id"] != 1)
    if bad.size:
        raise SnapshotError(
            f"cache {cache} cell {int(bad[0])} belongs to {int(meta['n_seq_id'][bad[0]])} sequences; "
            "kvgraft snapshots hold exactly one sequence"
        )
    bad = np.flatnonzero(meta["seq_id"] != 0)
    if bad.size:
        raise SnapshotError(
            f"cache {cache} cell {int(bad[0])} has sequence id {int(meta['seq_id'][bad[0]])}, expected 0"
        )
    bad = np.flatnonzero(meta["pos"] != np.arange(cell_count, dtype="<i4"))
    if bad.size:
        i = int(bad[0])
        raise SnapshotError(
            f"cache {cache} cell {i} is at position {int(meta['pos'][i])}, expected {i}: "
            "an own-position graft needs cells at positions 0..n-1 in order"
        )
    r.pos += cell_count * _CELL_META.itemsize


def _read_type(r: _Reader, cache: int, layer: int, kind: str) -> int:
    ggml_type = r.unpack("<i", f"cache {cache} layer {layer} {kind} type")
    if ggml_type < 0 or ggml_type > 64:
        raise SnapshotError(f"cache {cache} layer {layer} {kind}: invalid tensor type {ggml_type}")
    return ggml_type


def _read_cache_data(r: _Reader, cache: int, cell_count: int, spans: list) -> CacheLayout:
    v_trans = r.unpack("<I", f"cache {cache} v_trans flag")
    if v_trans not in (0, 1):
        raise SnapshotError(f"cache {cache}: v_trans flag is {v_trans}, expected 0 or 1")
    n_layer = r.unpack("<I", f"cache {cache} layer count")
    if not 1 <= n_layer <= MAX_LAYERS:
        raise SnapshotError(f"cache {cache}: layer count {n_layer} is out of range")
    k_rows = []
    for il in range(n_layer):
        k_type = _read_type(r, cache, il, "K")
        row = r.unpack("<Q", f"cache {cache} layer {il} K row size")
        if not 1 <= row <= MAX_ROW_BYTES:
            raise SnapshotError(f"cache {cache} layer {il} K: row size {row} is out of range")
        start = r.skip(cell_count * row, f"cache {cache} layer {il} K data")
        spans.append(TensorSpan(cache, il, "k", start, cell_count * row))
        k_rows.append((k_type, row))
    v_rows = []
    for il in range(n_layer):
        v_type = _read_type(r, cache, il, "V")
        if v_trans:
            el = r.unpack("<I", f"cache {cache} layer {il} V element size")
            n_embd = r.unpack("<I", f"cache {cache} layer {il} V width")
            if not 1 <= el <= 64 or not 1 <= n_embd <= MAX_ROW_BYTES or el * n_embd > MAX_ROW_BYTES:
                raise SnapshotError(f"cache {cache} layer {il} V: element size {el} x width {n_embd} is out of range")
            size = el * n_embd * cell_count
            v_rows.append((v_type, el, n_embd))
        else:
            row = r.unpack("<Q", f"cache {cache} layer {il} V row size")
            if not 1 <= row <= MAX_ROW_BYTES:
                raise SnapshotError(f"cache {cache} layer {il} V: row size {row} is out of range")
            size = cell_count * row
            v_rows.append((v_type, row, 0))
        start = r.skip(size, f"cache {cache} layer {il} V data")
        spans.append(TensorSpan(cache, il, "v", start, size))
    return CacheLayout(bool(v_trans), tuple(k_rows), tuple(v_rows))


def _describe_difference(cache: int, got: CacheLayout, want: CacheLayout) -> str:
    if got.n_layer != want.n_layer:
        return f"cache {cache} has {got.n_layer} layers, the engine's has {want.n_layer}"
    if got.v_trans != want.v_trans:
        return (
            f"cache {cache} V layout is {'transposed' if got.v_trans else 'row-major'}, the engine's is not "
            "(snapshots made with flash attention on and off are not interchangeable)"
        )
    for il, (g, w) in enumerate(zip(got.k_rows, want.k_rows, strict=False)):
        if g != w:
            return (
                f"cache {cache} layer {il} K is {type_name(g[0])} x {g[1]} B, the engine's is {type_name(w[0])} "
                f"x {w[1]} B"
            )
    for il, (g, w) in enumerate(zip(got.v_rows, want.v_rows, strict=False)):
        if g != w:
            return (
                f"cache {cache} layer {il} V is {type_name(g[0])} ({g[1]}, {g[2]}), the engine's is "
                f"{type_name(w[0])} ({w[1]}, {w[2]})"
            )
    return f"cache {cache} differs from the engine's layout"


def parse_state(data, expected: StateLayout | None = None, max_cells: int | None = None) -> ParsedState:
    """Walk a whole-state snapshot; raise SnapshotError unless it is complete and consistent.

    With `expected`, the architecture, cache count, layer count, tensor types and row sizes must
    match it (the layout probed from the loaded model); `max_cells` bounds the cell count (n_ctx).
    """
    r = _Reader(data)
    if r.size == 0:
        raise SnapshotError("snapshot is empty")
    arch = _read_header(r)
    if expected is not None and arch != expected.arch:
        raise SnapshotError(f"snapshot is for architecture '{arch}', the loaded model is '{expected.arch}'")
    header_size = r.pos
    caches: list[CacheLayout] = []
    spans: list[TensorSpan] = []
    n_tokens: int | None = None
    while r.pos < r.size:
        ci = len(caches)
        if ci >= (len(expected.caches) if expected is not None else MAX_CACHES):
            raise SnapshotError(f"snapshot has {r.size - r.pos} bytes past its last KV cache (offset {r.pos})")
        n_stream = r.unpack("<I", f"cache {ci} stream count")
        if n_stream != 1:
            raise SnapshotError(f"cache {ci} has {n_stream} streams; kvgraft snapshots have exactly one")
        cell_count = r.unpack("<I", f"cache {ci} cell count")
        if cell_count == 0:
            raise SnapshotError(f"cache {ci} is empty: a snapshot must hold at least one token")
        if max_cells is not None and cell_count > max_cells:
            raise SnapshotError(f"cache {ci} holds {cell_count} cells, more than the context's {max_cells}")
        if n_tokens is not None and cell_count != n_tokens:
            raise SnapshotError(f"cache {ci} holds {cell_count} cells but cache 0 holds {n_tokens}")
        n_tokens = cell_count
        _read_cells(r, ci, cell_count)
        layout = _read_cache_data(r, ci, cell_count, spans)
        if expected is not None and layout != expected.caches[ci]:
            raise SnapshotError(
                "snapshot does not match the loaded model: " + _describe_difference(ci, layout, expected.caches[ci])
            )
        caches.append(layout)
    if not caches:
        raise SnapshotError("snapshot holds no KV cache")
    if expected is not None and len(caches) != len(expected.caches):
        raise SnapshotError(f"snapshot holds {len(caches)} KV caches, the loaded model has {len(expected.caches)}")
    assert n_tokens is not None
    return ParsedState(StateLayout(arch, tuple(caches)), n_tokens, header_size, tuple(spans))


def seq_payload(data, parsed: ParsedState, seq_id: int = 0) -> bytearray:
    """The bytes `llama_state_seq_set_data` reads: its 8-byte header, then the whole-state payload.

    One copy of the payload (a memcpy; the parse above reads only headers and cell metadata).
    """
    view = memoryview(data).cast("B")
    payload = view[parsed.header_size :]
    out = bytearray(8 + len(payload))
    struct.pack_into("<Ii", out, 0, SEQ_STATE_MAGIC, seq_id)
    out[8:] = payload
    return out


def write_seq_header(buf: bytearray, parsed: ParsedState, seq_id: int = 0) -> int:
    """Overwrite the last 8 bytes of the whole-state header with the per-sequence header, in place.

    Returns the offset where the per-sequence bytes start (`buf[offset:]` is what
    `llama_state_seq_set_data` reads). The buffer no longer holds the whole-state bytes afterwards.
    """
    start = parsed.header_size - 8
    if start < 0:
        raise ValueError("the whole-state header is shorter than the per-sequence header")
    struct.pack_into("<Ii", buf, start, SEQ_STATE_MAGIC, seq_id)
    return start
