"""The index: entries, dedupe, exact question lookup, full-text search, longest prefix, stats."""

from __future__ import annotations

import os
import random

import pytest

from kvgraft.library.errors import BlobCorrupt, BlobMissing, EntryNotFound, LibraryError
from kvgraft.library.library import Library
from kvgraft.library.normalize import question_key
from kvgraft.library.tokens import PREFIX_BLOCK

FP = "a" * 64
OTHER_FP = "b" * 64


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path / "lib") as library:
        yield library


def add(lib, tokens, fp=FP, **kw):
    kw.setdefault("kind", "document")
    kw.setdefault("text", "text " + " ".join(map(str, tokens[:5])))
    return lib.add_entry(tokens=tokens, blob=kw.pop("blob", os.urandom(256)), fingerprint=fp, **kw)[0]


def test_add_get_and_dedupe(lib):
    blob = os.urandom(1000)
    e, created = lib.add_entry(
        kind="solution",
        text="t",
        tokens=[1, 2, 3],
        blob=blob,
        fingerprint=FP,
        question="Q?",
        answer="42",
        vouched_by="you",
    )
    assert created and e.id == 1 and e.n_tokens == 3 and e.answer == "42" and e.verified_at
    assert e.verified and e.vouched_by == "you" and e.proof == "local"
    again, created2 = lib.add_entry(
        kind="solution", text="t", tokens=[1, 2, 3], blob=blob, fingerprint=FP, question="Q?", answer="42"
    )
    assert not created2 and again.id == e.id
    # same blob under a different question: a second entry, still one blob
    other, created3 = lib.add_entry(
        kind="solution", text="t", tokens=[1, 2, 3], blob=blob, fingerprint=FP, question="Another?", answer="42"
    )
    assert created3 and other.blob_sha256 == e.blob_sha256
    assert not other.verified and other.verified_at is None  # an answer nobody vouched for is stated, not verified
    assert lib.stats()["blobs"] == 1 and len(list(lib.blobs.iter_shas())) == 1
    assert lib.get(e.id).tokens == [1, 2, 3]
    with pytest.raises(EntryNotFound):
        lib.get(999)


def test_bad_input_refused(lib):
    with pytest.raises(LibraryError, match="kind"):
        lib.add_entry(kind="poem", text="t", tokens=[1], blob=b"x", fingerprint=FP)
    with pytest.raises(LibraryError, match="at least one token"):
        lib.add_entry(kind="document", text="t", tokens=[], blob=b"x", fingerprint=FP)
    with pytest.raises(BlobCorrupt, match="declared"):
        lib.add_entry(kind="document", text="t", tokens=[1], blob=b"x", fingerprint=FP, blob_sha256="0" * 64)
    assert lib.count() == 0 and list(lib.blobs.iter_shas()) == []


@pytest.mark.parametrize(
    "variant",
    [
        "What is the capital of Vorn?",
        "  what IS the capital   of vorn ",
        "WHAT IS THE CAPITAL OF VORN??",
        "What is the capital of Vorn\u00a0?",
    ],
)
def test_exact_question_normalized(lib, variant):
    e = add(lib, [5, 6, 7], kind="solution", question="What is the capital of Vorn?", answer="Quell")
    add(lib, [8, 9], kind="solution", question="What is the capital of Ash?", answer="Ember")
    assert question_key(variant) == question_key("What is the capital of Vorn?")
    assert lib.find_question(variant, FP).id == e.id
    assert lib.find_question("What is the capital of Vorns?", FP) is None


def test_find_question_prefers_graftable(lib):
    foreign = add(lib, [1, 2], fp=OTHER_FP, kind="solution", question="q", answer="1")
    local = add(lib, [1, 2, 3], kind="solution", question="q", answer="1")
    assert lib.find_question("q", FP).id == local.id
    assert lib.find_question("q", OTHER_FP).id == foreign.id
    assert not foreign.graftable(FP) and local.graftable(FP)


def test_full_text_search(lib):
    a = add(lib, [1], text="The river carries silver stones to the harbor.", title="River notes")
    b = add(lib, [2], text="Counting seventeen orange windows in the village.", question="How many windows?")
    assert [e.id for e in lib.search("river")] == [a.id]
    assert [e.id for e in lib.search("windows")] == [b.id]
    assert [e.id for e in lib.search("carrying")] == [a.id]  # porter stemming
    assert {e.id for e in lib.search("river windows", any_term=True)} == {a.id, b.id}
    assert lib.search("river windows") == []  # all terms by default
    assert lib.search('"); DROP TABLE entries; --') == []
    assert lib.count() == 2


def _brute_longest(entries, prompt):
    best = None
    for e in entries:
        t = e.tokens
        if len(t) <= len(prompt) and prompt[: len(t)] == t and (best is None or len(t) > len(best.tokens)):
            best = e
    return best


def test_longest_prefix_matches_brute_force(lib):
    rng = random.Random(1)
    base = [rng.randrange(1000) for _ in range(1200)]
    entries = []
    # entries sharing prefixes of many lengths, around block boundaries, plus unrelated ones
    for n in [1, 5, 63, 64, 65, 127, 128, 300, 511, 512, 640, 1000, 1199]:
        entries.append(add(lib, base[:n]))
    for _ in range(30):
        n = rng.randint(1, 900)
        toks = base[: rng.randint(0, n)] + [rng.randrange(1000) for _ in range(n)]
        entries.append(add(lib, toks[: max(1, n)]))
    for trial in range(60):
        cut = rng.randint(1, 1200)
        prompt = base[:cut] + [rng.randrange(1000) for _ in range(rng.randint(0, 50))]
        if trial % 7 == 0:
            prompt = [rng.randrange(1000) for _ in range(cut)]
        want = _brute_longest(entries, prompt)
        got = lib.longest_prefix(prompt, FP)
        assert (got.id if got else None) == (want.id if want else None), (cut, len(prompt))


def test_longest_prefix_respects_fingerprint_and_damage(lib):
    toks = list(range(10, 10 + 3 * PREFIX_BLOCK))
    e = add(lib, toks[:100], fp=OTHER_FP)
    assert lib.longest_prefix(toks, FP) is None
    assert lib.longest_prefix(toks, OTHER_FP).id == e.id
    lib.mark_damaged(e.blob_sha256, "test")
    assert lib.longest_prefix(toks, OTHER_FP) is None


def test_read_blob_checks_integrity_and_marks_damage(lib):
    blob = os.urandom(5000)
    e = add(lib, [1, 2, 3], blob=blob)
    assert bytes(lib.read_blob(e)) == blob
    path = lib.blobs.path(e.blob_sha256)
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x40
    path.write_bytes(data)
    with pytest.raises(BlobCorrupt, match=e.blob_sha256):
        lib.read_blob(e)
    assert lib.get(e.id).damaged == "blob hash mismatch"
    path.unlink()
    with pytest.raises(BlobMissing):
        lib.read_blob(lib.get(e.id))
    assert lib.get(e.id).damaged == "blob missing"


def test_stats_contract(lib):
    add(lib, list(range(100)), blob=os.urandom(1000))
    add(lib, list(range(300)), blob=os.urandom(3000))
    s = lib.stats(n_ctx=200, fingerprint=FP)
    # bytes on disk: each blob is a compact container with a 24-byte header and nothing elided
    assert (s["entries"], s["blobs"], s["bytes"], s["canonical_bytes"], s["tokens"]) == (2, 2, 4048, 4000, 400)
    assert s["context_multiple"] == 2.0 and s["bytes_per_token"] == 10.12 and s["canonical_bytes_per_token"] == 10.0
    assert s["graftable"] == 2 and s["uncompacted_blobs"] == 0


def test_remove_keeps_blob_until_gc(lib):
    from kvgraft.library.maintenance import gc

    e = add(lib, [1, 2])
    lib.remove(e.id)
    assert lib.count() == 0 and lib.blobs.contains(e.blob_sha256)
    assert gc(lib)["removed_blobs"] == 1
    assert not lib.blobs.contains(e.blob_sha256)
    assert lib._db.execute("SELECT count(*) FROM prefix_keys").fetchone()[0] == 0


def test_a_thread_number_is_never_given_again_after_a_delete(lib):
    made = [lib.threads.create_thread(format="plain", fingerprint="f" * 64, model_sha256=None).id for _ in range(3)]
    lib.threads.remove_thread(made[-1])  # the newest goes: its number must not come back
    again = lib.threads.create_thread(format="plain", fingerprint="f" * 64, model_sha256=None).id
    assert made == [1, 2, 3] and again == 4
