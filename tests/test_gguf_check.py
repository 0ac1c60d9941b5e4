"""The GGUF header check (app/core/gguf_check.py): the same facts the `gguf` package reads, in a fraction of
its time, and a file cut short anywhere refused before llama.cpp opens it."""

from __future__ import annotations

import time

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


def test_the_real_model_is_read_in_well_under_a_second_per_hundred_mb(model_path):
    t0 = time.perf_counter()
    info = inspect_gguf(model_path)
    elapsed = time.perf_counter() - t0
    assert (info["architecture"], info["sliding_window"], info["tensors"]) == ("gemma3", 512, 236)
    assert elapsed < 5, f"{elapsed:.1f} s to read a header (the gguf package took 10 s: a frozen window)"


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
