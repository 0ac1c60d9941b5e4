"""Committed golden hashes, one file per probe family: the paper's "moves byte-identical between machines
of the same architecture".

The bits decide, not a CPU string: the probe (engine/probe.py) is recomputed here and the family
whose committed probe equals it is this machine's. Every golden case of that family (more lengths,
flash attention on, cases made on other machines of the family: see each case's `made_on`) must
reproduce byte for byte, so the test can fail. Only a machine whose probe matches no committed
family (truly other bits: another ISA, another build) skips, saying so and how to add its family.
"""

from __future__ import annotations

import pytest

from tests.golden_cases import (
    CASES,
    HASH_KEYS,
    compute_case,
    family_files,
    family_name,
    matching_family,
)

FAMILIES = family_files()


@pytest.fixture(scope="module")
def golden(engine):
    """This machine's family file; the only skip is a machine whose probe no family has."""
    path = matching_family(engine.probe, FAMILIES)
    if path is None:
        here = {c["tokens"]: c["logits_sha256"][:16] for c in engine.probe["cases"]}
        pytest.skip(
            f"no committed golden family has this machine's probe {here} ({engine.environment.get('cpu')}; "
            f"{len(FAMILIES)} families: {', '.join(p.name for p in FAMILIES)}): run `make golden` to add "
            f"tests/golden/engine_golden-{family_name(engine.environment)}.json and commit it"
        )
    return FAMILIES[path]


@pytest.mark.parametrize("path", list(FAMILIES), ids=[p.name for p in FAMILIES])
def test_family_file_covers_the_cases(path):
    golden = FAMILIES[path]
    assert [c["name"] for c in golden["cases"]] == [c["name"] for c in CASES]
    assert any(c["tokens"] > 512 for c in golden["cases"]), "one golden prompt must pass the sliding window"
    assert any(c.get("flash_attn") for c in golden["cases"]), "one golden case must have flash attention on"
    assert any(c["tokens"] > 512 for c in golden["probe"]["cases"]), "the probe must pass the sliding window"
    for case in golden["cases"]:
        assert all(len(case[k]) == 64 for k in HASH_KEYS if k.endswith("sha256")), case["name"]


def test_families_have_different_bits():
    """Two files with one probe would be one family whose cases could disagree: each probe once."""
    # the AVX2 family is committed for the tiled-small mode; an AVX-512 one is made by `make golden` on such a machine
    assert len(FAMILIES) >= 1, "at least one family is committed"
    probes = [str(g["probe"]) for g in FAMILIES.values()]
    assert len(set(probes)) == len(probes)


def test_family_name_reads_the_machine():
    xeon = {"system_info": "CPU : AVX = 1 | AVX2 = 1 | AVX512 = 1 |", "cpu": "Intel(R) Xeon(R) Processor"}
    epyc = {"system_info": "CPU : AVX = 1 | AVX2 = 1 | FMA = 1 |", "cpu": "AMD EPYC 7B13 64-Core Processor"}
    assert family_name(xeon) == "avx512-intel-xeon"
    assert family_name(epyc) == "avx2-amd-epyc"


def test_config_matches_the_golden_one(engine, golden):
    """The committed config is this test session's default engine config (else the probe could not match)."""
    here = {k: v for k, v in engine.fingerprint_info.items() if k != "probe"}
    assert here == golden["config"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden_hashes(engine, golden, case):
    want = next(c for c in golden["cases"] if c["name"] == case["name"])
    got = compute_case(engine, case)
    for key in HASH_KEYS:
        assert got[key] == want[key], f"{case['name']}: {key} differs from the one made on {want.get('made_on')}"


def test_make_golden_adds_a_family_beside_the_others(tmp_path, monkeypatch):
    """`make golden` on a machine whose probe no file has writes a new family file; a matching one is reused."""
    import scripts.make_golden as mg

    monkeypatch.setattr(mg, "GOLDEN_DIR", tmp_path)
    env = {"system_info": "CPU : AVX = 1 | AVX2 = 1 |", "cpu": "AMD EPYC 9B14"}
    other = type("E", (), {"probe": {"cases": ["other bits"]}, "environment": env})()
    assert mg.destination(other, FAMILIES) == tmp_path / "engine_golden-avx2-amd-epyc.json"
    (tmp_path / "engine_golden-avx2-amd-epyc.json").write_text("{}")  # the name is taken by another family
    assert mg.destination(other, FAMILIES) == tmp_path / "engine_golden-avx2-amd-epyc-2.json"
    path, golden = next(iter(FAMILIES.items()))
    same = type("E", (), {"probe": golden["probe"], "environment": env})()
    assert mg.destination(same, FAMILIES) == path
