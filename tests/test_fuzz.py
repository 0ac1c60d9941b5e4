"""CI-sized fuzzing of pack import and snapshot validation (scripts/fuzz.py runs 10,000+ cases).

Every case must end in a typed refusal or a clean graft/import: no crash, no partial import, no
file written outside the data dir. KVGRAFT_FUZZ_CASES scales it (default: 500 packs + 500 snapshots).
"""

from __future__ import annotations

import os

import pytest

from kvgraft.app.packs.export import build_pack
from kvgraft.app.proof.problems import Problem, write_jsonl
from kvgraft.app.service import LibraryService
from kvgraft.library.library import Library
from tests.fuzz_harness import FuzzStats, fuzz_pack_import, fuzz_snapshots

CASES = int(os.environ.get("KVGRAFT_FUZZ_CASES", "500"))
TINY = Problem("f1", "A hut holds 9 barrels and gets 3 more. How many barrels?", "9 + 3 = 12", "12")


@pytest.fixture(scope="module")
def tiny_pack(engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-pack")
    write_jsonl([TINY], d / "p.jsonl")
    with Library(d / "lib") as lib:
        build_pack(LibraryService(engine, lib), d / "p.jsonl", d / "tiny.kvpack")
    return d / "tiny.kvpack"


def test_fuzz_pack_import(engine, tiny_pack, tmp_path):
    stats = FuzzStats()
    fuzz_pack_import(engine, tiny_pack, tmp_path, CASES, seed=1, stats=stats)
    assert stats.cases == CASES
    assert stats.other_errors == [], stats.other_errors[:5]
    assert stats.partial_imports == 0 and stats.stray_files == 0
    assert stats.refused > CASES // 2  # the mutations do reach the checks
    print(f"\npack fuzz: {stats.as_dict()}")


def test_fuzz_snapshots_in_a_worker(engine, model_path, tmp_path):
    small = engine.with_config(engine.config.replace(n_ctx=256, n_batch=256, n_ubatch=256))
    with small.session() as s:
        s.prefill(small.model.tokenize("The river carries silver stones to the harbor every winter."))
        snap = s.snapshot()
    stats = FuzzStats()
    fuzz_snapshots(small, model_path, snap.data, snap.n_tokens, tmp_path, CASES, seed=2, stats=stats)
    assert stats.cases == CASES
    assert stats.crashes == 0
    assert stats.other_errors == [], stats.other_errors[:5]
    assert stats.refused > 0 and stats.accepted_states > 0  # both sides of the walk were exercised
    print(f"\nsnapshot fuzz: {stats.as_dict()}")
