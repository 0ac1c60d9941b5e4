"""The GGUF header check (app/core/gguf_check.py): the same facts the `gguf` package reads, in a fraction of
its time, and a file cut short anywhere refused before llama.cpp opens it."""

from __future__ import annotations

import os
import struct
import time
import tracemalloc

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from kvgraft.app.core.gguf_check import NotAModel, inspect_gguf
from scripts.synthetic_gguf import write_synthetic_gguf


def reference(path) -> dict:
    """What the gguf package's own reader says of the file."""
    r = GGUFReader(str(path))

    def text(key):
        f = r.fields[key]
        return bytes(f.parts[f.data[0]]).decode()

    arch = text("general.architecture")
    window = r.fields.get(f"{arch}.attention.sliding_window")
    return {
        "architecture": arch,
        "name": text("general.name") if "general.name" in r.fields else path.stem,
        "tensors": len(r.tensors),
        "size_bytes": path.stat().st_size,
        "sliding_window": int(window.parts[window.data[0]][0]) if window else 0,
    }


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_the_header_reads_as_the_gguf_package_reads_it(tmp_path, arch):
    path = write_synthetic_gguf(tmp_path / f"{arch}.gguf", arch, seed=1, chat_template=arch == "gemma3")
    got = inspect_gguf(path)
    assert got.pop("path") == str(path.resolve())
    assert got == reference(path)


def test_the_real_model_reads_as_the_embedded_gemma(model_path):
    """The 253 MB file with a 262,144-entry vocabulary (the gguf package took 10 s over it, a frozen window;
    the time is printed, not asserted)."""
    t0 = time.perf_counter()
    info = inspect_gguf(model_path)
    print(f"header read in {time.perf_counter() - t0:.2f} s")
    assert (info["architecture"], info["sliding_window"], info["tensors"]) == ("gemma3", 512, 236)
    assert info["name"] == "Gemma 3 270m" and info["size_bytes"] == model_path.stat().st_size


@pytest.mark.parametrize("keep", [8, 24, 200, 0.5, 0.999])
def test_a_file_cut_short_is_refused(tmp_path, keep):
    """Cut inside the counts, the metadata, the tensor table (a fraction of the header) or the tensor data."""
    whole = write_synthetic_gguf(tmp_path / "whole.gguf", "gemma3", seed=2).read_bytes()
    n = keep if isinstance(keep, int) else int(len(whole) * keep)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:n])
    with pytest.raises(NotAModel, match="truncated|cut short"):
        inspect_gguf(cut)


def test_a_field_of_the_wrong_type_is_refused(tmp_path):
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "gemma3")
    w.add_key_value("general.name", 7, GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotAModel, match="general.name field is not a string"):
        inspect_gguf(path)


def header_only(path, fields: list[tuple[str, object, GGUFValueType]]):
    w = GGUFWriter(str(path), "gemma3")
    for key, value, vtype in fields:
        w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_key_twice_is_refused_as_llama_cpp_refuses_it(tmp_path):
    def kv(key: bytes, text: bytes) -> bytes:  # a string field, written by hand (the writer keeps one per key)
        return struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(text)) + text

    fields = [kv(b"general.architecture", b"gemma3"), kv(b"general.name", b"a"), kv(b"general.name", b"b")]
    path = tmp_path / "twice.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + b"".join(fields))
    with pytest.raises(NotAModel, match="general.name' twice"):
        inspect_gguf(path)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + b"".join(fields[:2]))
    assert inspect_gguf(path)["name"] == "a"  # the same file with the key once reads


def test_a_float_sliding_window_is_refused_as_llama_cpp_refuses_it(tmp_path):
    path = header_only(tmp_path / "f.gguf", [("gemma3.attention.sliding_window", 512.0, GGUFValueType.FLOAT32)])
    with pytest.raises(NotAModel, match="sliding_window field is not an integer"):
        inspect_gguf(path)


def test_a_huge_length_in_a_tiny_file_allocates_nothing(tmp_path):
    path = tmp_path / "liar.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 30) + b"x" * 16)  # a key of 1 GiB in 44 bytes
    tracemalloc.start()
    try:
        with pytest.raises(NotAModel):
            inspect_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak:,} bytes allocated to refuse a 44-byte file"


def test_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(NotAModel, match="not a regular file"):
        inspect_gguf(fifo)  # never opened: opening a FIFO would block until a writer came
