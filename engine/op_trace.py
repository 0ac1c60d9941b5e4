"""Which op gave which bits: every computed op of a decode, read through llama.cpp's eval callback.

`trace(engine, tokens, calls)` decodes `tokens` in calls of the given sizes, every row an output row
(so the last layer keeps every token), and llama.cpp hands each computed op's output to a callback
(`cb_eval`, ggml_backend_sched_eval_callback) right after computing it. Per op (a graph node, keyed by
its name and the how-many-th node of that name it is in the call's graph) and per token, the trace keeps
a digest of that token's slice of the output. Two traces of the same tokens (one call against several,
or one build against another, each from its own process) then compare op by op (`compare`): which ops'
bits part, and where they part first (an op whose output differs while every computed input of it is
the same: that op's kernel, not its inputs, changed the bits). scripts/op_trace.py drives it.

A token's slice is taken along the output's token dimension, found once per graph node from a call of a
size no model dimension has (`_PROBE_ROWS`). Nodes without one (the KV cache writes, whose output is a
view of the whole cache, and the attention mask) are counted but not compared here; the canonical state's
SHA-256 covers what they write. Views (VIEW, RESHAPE, PERMUTE, TRANSPOSE) compute nothing and are skipped.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .bindings import lib_dir, llama
from .errors import EngineError

_PROBE_ROWS = 11  # a call size no dimension of the supported models has (heads, head size, widths)
_VIEWS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


class _Tensor(ctypes.Structure):  # struct ggml_tensor (ggml.h, llama-cpp-python 0.3.36's vendored ggml)
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


@functools.cache
def _ggml() -> "_Ggml":
    return _Ggml()


class _Ggml:
    """The few ggml-base functions the trace reads names and sizes with (the library already loaded;
    one per process: `_ggml()`)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(lib_dir() / "libggml-base.so"))
        for name, res, args in (
            ("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int]),
            ("ggml_type_size", ctypes.c_size_t, [ctypes.c_int]),
            ("ggml_blck_size", ctypes.c_int64, [ctypes.c_int]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)


@dataclass
class OpRows:
    """One graph node over a trace: its op, output type, weight type (a product's or a lookup's first
    input), shape without the token dimension, and per token position the digest of its slice."""

    op: str
    out_type: str
    weight: str | None
    shape: tuple[int, ...] | None  # None: no token dimension (not compared)
    sources: tuple[str, ...]  # the keys of the computed nodes it reads
    rows: dict[int, str] = field(default_factory=dict)
    call_rows: dict[int, int] = field(default_factory=dict)  # position -> rows in the call that computed it

    @property
    def label(self) -> str:
        return f"{self.op} {self.weight}" if self.weight else self.op


class _Recorder:
    def __init__(self, token_dims: dict[str, int | None] | None) -> None:
        self.g = _ggml()
        self.token_dims = token_dims  # None: learning them (the probe call)
        self.learned: dict[str, int | None] = {}
        self.ops: dict[str, OpRows] = {}
        self.start, self.n = 0, 0
        self.seen: Counter = Counter()
        self.keys: dict[int, str] = {}  # tensor address -> key, within one call's graph
        self.callback = llama.ggml_backend_sched_eval_callback(self._on_op)
        self.error: BaseException | None = None

    def begin_call(self, start: int, n: int) -> None:
        self.start, self.n = start, n
        self.seen.clear()
        self.keys.clear()

    def _on_op(self, ptr, ask, _user) -> bool:
        try:
            t = _Tensor.from_address(ptr)
            op = self.g.ggml_op_desc(ptr).decode()
            if ask:
                return op not in _VIEWS
            self._record(ptr, t, op)
        except BaseException as e:  # noqa: BLE001 (never let an exception cross into C)
            self.error = self.error or e
        return True

    def _computed(self, addr) -> str | None:
        """The key of the computed node `addr` is, or is a view of (None: a weight, an input, the cache)."""
        while addr:
            if addr in self.keys:
                return self.keys[addr]
            addr = _Tensor.from_address(addr).view_src
        return None

    def _record(self, ptr, t: _Tensor, op: str) -> None:
        name = t.name.decode(errors="replace")
        key = f"{name}#{self.seen[name]}"
        self.seen[name] += 1
        self.keys[ptr] = key
        ne = [int(x) for x in t.ne]
        if self.token_dims is None:  # the probe call: the outermost dimension of the call's size
            dims = [d for d in (3, 2, 1) if ne[d] == self.n]
            self.learned[key] = dims[0] if dims else None
            return
        dim = self.token_dims.get(key)
        rec = self.ops.get(key)
        if rec is None:
            src0 = t.src[0]
            weight = None
            if op in ("MUL_MAT", "GET_ROWS") and src0:
                weight = self.g.ggml_type_name(_Tensor.from_address(src0).type).decode()
            shape = None if dim is None else tuple(v for d, v in enumerate(ne) if d != dim)
            sources = tuple(k for k in (self._computed(s) for s in t.src if s) if k)
            rec = self.ops[key] = OpRows(op, self.g.ggml_type_name(t.type).decode(), weight, shape, sources)
        if dim is None or ne[dim] != self.n:
            return
        masked = op == "MUL_MAT" and self._root_name(t.src[0]).startswith("cache_k")
        for i, digest in enumerate(self._row_digests(t, dim, self.start if masked else None)):
            rec.rows[self.start + i] = digest
            rec.call_rows[self.start + i] = self.n

    @staticmethod
    def _root_name(addr) -> str:
        while addr and _Tensor.from_address(addr).view_src:
            addr = _Tensor.from_address(addr).view_src
        return _Tensor.from_address(addr).name.decode(errors="replace") if addr else ""

    def _row_digests(self, t: _Tensor, dim: int, masked_from: int | None = None) -> list[str]:
        """The digest of each token's slice along `dim`, read with the tensor's own strides (as blocks of
        its type, so quantized outputs compare by their bytes too). `masked_from`: the call's first
        position, for attention scores (a product with the K cache, one entry per cache cell): only the
        cells up to the token's own are compared, since the mask hides the rest and they hold whatever
        the cache held when the call ran (in a fresh context the cells are filled in position order)."""
        size, blck = int(self.g.ggml_type_size(t.type)), int(self.g.ggml_blck_size(t.type))
        ne = [int(x) for x in t.ne]
        nb = [int(x) for x in t.nb]
        units = [ne[0] // blck, *ne[1:]]
        strides = [size, *nb[1:]]
        span = sum((u - 1) * s for u, s in zip(units, strides, strict=True)) + size
        buf = (ctypes.c_char * span).from_address(t.data)
        arr = np.ndarray(
            tuple(reversed(units)), dtype=np.dtype((np.void, size)), buffer=buf, strides=tuple(reversed(strides))
        )
        axis = 3 - dim
        out = []
        for i in range(arr.shape[axis]):
            row = np.take(arr, i, axis=axis)
            if masked_from is not None:
                row = row[..., : masked_from + i + 1]
            out.append(hashlib.blake2b(np.ascontiguousarray(row).tobytes(), digest_size=8).hexdigest())
        return out


def _decode_all(engine, recorder: _Recorder, tokens: list[int], calls: list[int]) -> None:
    with engine.session(eval_callback=recorder.callback) as s:
        at = 0
        for n in calls:
            recorder.begin_call(at, n)
            s._decode(tokens[at : at + n], want_last_logits=True, logit_rows=slice(0, n))
            at += n
    if recorder.error is not None:
        raise EngineError(f"the op trace failed: {recorder.error!r}") from recorder.error


def trace(engine, tokens: list[int], calls: list[int]) -> dict[str, OpRows]:
    """Every computed op's per-token digests when `tokens` are decoded in calls of `calls` rows."""
    if sum(calls) != len(tokens) or min(calls) < 1:
        raise EngineError(f"the calls {calls} do not cut {len(tokens)} tokens")
    if max(calls) > engine.config.n_batch:
        raise EngineError(f"a call of {max(calls)} rows is more than n_batch ({engine.config.n_batch})")
    probe = _Recorder(None)
    _decode_all(engine, probe, tokens[:_PROBE_ROWS], [_PROBE_ROWS])
    rec = _Recorder(probe.learned)
    _decode_all(engine, rec, tokens, calls)
    return rec.ops


@dataclass(frozen=True)
class OpVerdict:
    label: str
    nodes: int
    compared: int  # (node, token) pairs present in both traces
    equal: int
    origins: int  # pairs that differ while every computed input of the node is equal at that token
    first: tuple[str, int] | None  # the first (node, token) whose bits part, in graph order


def compare(a: dict[str, OpRows], b: dict[str, OpRows]) -> list[OpVerdict]:
    """Op by op, where two traces of the same tokens agree, grouped by op label (op and weight type),
    in the order the labels first occur in the graph."""
    totals: dict[str, dict] = {}
    for key, ra in a.items():
        t = totals.setdefault(ra.label, {"nodes": 0, "compared": 0, "equal": 0, "origins": 0, "first": None})
        t["nodes"] += 1
        rb = b.get(key)
        if rb is None or ra.shape is None or ra.shape != rb.shape:
            continue
        for pos, da in ra.rows.items():
            db = rb.rows.get(pos)
            if db is None:
                continue
            t["compared"] += 1
            if da == db:
                t["equal"] += 1
                continue
            t["first"] = t["first"] or (key, pos)
            # an origin: every computed input with a token dimension is equal at this token
            t["origins"] += all(
                a[s].rows.get(pos) == b[s].rows.get(pos) for s in ra.sources if s in a and s in b and a[s].shape
            )
    return [OpVerdict(label, **t) for label, t in totals.items()]


def to_json(ops: dict[str, OpRows]) -> dict:
    return {
        k: {
            "op": r.op,
            "out_type": r.out_type,
            "weight": r.weight,
            "shape": r.shape,
            "sources": r.sources,
            "rows": r.rows,
            "call_rows": r.call_rows,
        }
        for k, r in ops.items()
    }


def from_json(d: dict) -> dict[str, OpRows]:
    return {
        k: OpRows(
            v["op"],
            v["out_type"],
            v["weight"],
            tuple(v["shape"]) if v["shape"] is not None else None,
            tuple(v["sources"]),
            {int(p): h for p, h in v["rows"].items()},
            {int(p): n for p, n in v["call_rows"].items()},
        )
        for k, v in d.items()
    }
