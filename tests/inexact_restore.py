"""llama.cpp's plain whole-state restore (`llama_state_set_data`), kept for the tests only.

It is NOT exact past the sliding window (FINDINGS.md: the cache's search head is reset to 0, so
new tokens reuse masked cells); tests/test_exactness.py uses it to show that the engine's graft
path is needed. The engine never offers it.
"""

from __future__ import annotations

import ctypes

from kvgraft.engine.bindings import llama
from kvgraft.engine.errors import SnapshotError
from kvgraft.engine.session import Session, Snapshot
from kvgraft.engine.state import parse_state


def restore_whole_state_inexact(session: Session, snapshot: Snapshot) -> None:
    session._check()
    parse_state(snapshot.data, session.engine.layout, max_cells=session.n_ctx)  # validated before llama.cpp
    buf = bytearray(snapshot.data)
    read = llama.llama_state_set_data(session._ctx, (ctypes.c_uint8 * len(buf)).from_buffer(buf), len(buf))
    if read != len(buf):
        llama.llama_memory_clear(session._mem, True)
        raise SnapshotError(f"llama_state_set_data read {read} of {len(buf)} bytes")
    session.tokens = list(snapshot.tokens)
    session._has_logits = False
