"""A fleet's shared prompt cache (app/serve/shared_cache.py, library/remote_cache.py) against a real S3 server
(SeaweedFS), the real model and two prompt caches with their own libraries, as two instances have: what one
computed the other grafts with the same bits; a record unsigned, untrusted, of another fingerprint or of
other tokens is never grafted, nor an altered blob; a remote that stalls mid-fetch or cannot be reached
degrades to a prefill here within the deadline, never to an error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from click.testing import CliRunner

from kvgraft.app.core.textgen import synthetic_text
from kvgraft.app.core.watchdog import guarded_popen
from kvgraft.app.serve.prompt_cache import PromptCache
from kvgraft.app.serve.shared_cache import SharedCache
from kvgraft.app.service import LibraryService
from kvgraft.engine.compare import logits_sha256
from kvgraft.entry import cli
from kvgraft.library.library import Library
from kvgraft.library.remote import RemoteSpec
from kvgraft.library.remote_cache import CacheRecord, RemoteCacheStore, cache_key, read_record, signed_record
from kvgraft.library.signing import TrustStore, generate_key, public_identity
from kvgraft.library.tokens import tokens_sha256
from tests.fault_proxy import FaultProxy


@pytest.fixture
def fleet(s3_env, tmp_path, engine):
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_env.make_bucket(bucket)
    key = tmp_path / "fleet.key"
    signer = generate_key(key)
    made = []

    def instance(name: str, push: bool, pull: bool, endpoint: str | None = None, lookup_ms: float = 50.0):
        home = tmp_path / name
        trust = TrustStore(home / "trusted_keys.json")
        home.mkdir(exist_ok=True)
        trust.trust(signer.public_key_b64, "fleet")
        service = LibraryService(engine, Library(home))
        cache = PromptCache(service, 1 << 30)
        spec = RemoteSpec("team", bucket, "fleet/", endpoint or s3_env.endpoint)
        cache.remote = SharedCache(spec, trust, push, pull, key if push else None, lookup_ms=lookup_ms)
        made.append(cache)
        return cache

    instance.spec = RemoteSpec("team", bucket, "fleet/", s3_env.endpoint)
    instance.key = key
    yield instance
    for cache in made:
        cache.remote.close()
        cache.close_session()
        cache.service.close()
        cache.library.close()


def doc_prompt(engine, seed: int) -> tuple[list[int], tuple[int, ...]]:
    """A document and a question after it: the document's end is the boundary instances share."""
    doc = engine.model.tokenize(synthetic_text(420, seed=seed) + "\n\n")
    question = engine.model.tokenize("Q: What does the text say about the harbor?\nA:", add_bos=False)
    return doc + question, (len(doc),)


def computed_by(a: PromptCache, tokens, boundaries) -> str:
    """Prefill on instance `a`, store its states and wait for their upload; the cold logits' SHA-256."""
    prep = a.prepare(tokens, boundaries=boundaries)
    assert prep.source == "cold"
    cold = logits_sha256(a.session.logits())
    a.flush()
    a.remote.close()  # the queued uploads finish
    assert a.remote.counters.uploaded >= 1 and a.remote.counters.upload_failed == 0
    return cold


def test_an_instance_grafts_what_another_computed_with_the_same_bits(fleet, engine):
    a, b = fleet("a", push=True, pull=False), fleet("b", push=False, pull=True)
    tokens, boundaries = doc_prompt(engine, 61)
    cold = computed_by(a, tokens, boundaries)
    prep = b.prepare(tokens, boundaries=boundaries)
    assert prep.source == "remote:team" and prep.cached_tokens >= boundaries[0]
    assert prep.remote_fetch_ms is not None and prep.remote_fetch_ms > 0
    assert logits_sha256(b.session.logits()) == cold  # bit for bit what A computed cold
    entry = b.library.get(prep.entry_id)
    assert entry.kind == "cache" and entry.proof == "signed:fleet"  # a cache state, evicted as the rest
    assert b.library.rank_documents("harbor", engine.fingerprint) == []  # never a knowledge entry
    assert b.remote.counters.hits == 1 and b.remote.counters.bytes_fetched > 0
    again = b.prepare(tokens, boundaries=boundaries)  # now held here: no second fetch
    assert again.source == "warm" and b.remote.counters.hits == 1


def test_records_never_grafted_unless_trusted_of_this_engine_and_these_tokens(fleet, engine, tmp_path):
    a = fleet("a", push=True, pull=False)
    tokens, boundaries = doc_prompt(engine, 62)
    computed_by(a, tokens, boundaries)
    p = boundaries[0]
    store = RemoteCacheStore(fleet.spec)
    key = cache_key(engine.fingerprint, tokens_sha256(tokens[:p]))
    good_raw = store.get_record(key)
    good, signer = read_record(good_raw)
    assert signer.key_id == public_identity(fleet.key).key_id  # A signed it with the fleet key
    generate_key(tmp_path / "stranger.key")
    b = fleet("b", push=False, pull=True)
    client = store.blobs.client

    def planted(raw: bytes) -> dict:
        client.put_object(Bucket=fleet.spec.bucket, Key=store.record_key(key), Body=raw)
        before = dict(b.remote.counters.refused)
        assert b.remote.lookup(b, tokens, boundaries, 0) is None  # never grafted
        return {k: v - before.get(k, 0) for k, v in b.remote.counters.refused.items() if v != before.get(k, 0)}

    unsigned = json.dumps({"record": good.body().decode()}).encode()
    assert planted(unsigned) == {"malformed_or_unsigned": 1}
    assert planted(signed_record(good, tmp_path / "stranger.key")) == {"untrusted_signer": 1}
    other_fp = CacheRecord(**{**good.__dict__, "fingerprint": "0" * 64})
    assert planted(signed_record(other_fp, fleet.key)) == {"other_fingerprint": 1}
    other_tokens = CacheRecord(**{**good.__dict__, "tokens_sha256": tokens_sha256(tokens[: p - 1])})
    assert planted(signed_record(other_tokens, fleet.key)) == {"other_tokens": 1}
    # a trusted record naming a blob whose bytes were altered on the remote: refused and counted
    blob_key = store.blobs.key(good.blob_sha256)
    stored = client.get_object(Bucket=fleet.spec.bucket, Key=blob_key)["Body"].read()
    altered = bytearray(stored)
    altered[-100] ^= 0xFF
    client.put_object(Bucket=fleet.spec.bucket, Key=blob_key, Body=bytes(altered))
    assert planted(good_raw) == {"blob_refused": 1}
    assert b.library.cache.cache_bytes()[0] == 0  # nothing of it was stored here
    client.put_object(Bucket=fleet.spec.bucket, Key=blob_key, Body=stored)  # put right: grafted again
    got = b.remote.lookup(b, tokens, boundaries, 0)
    assert got is not None and got[0].n_tokens == p


def test_a_remote_that_stalls_mid_fetch_or_is_gone_is_a_prefill_here(fleet, engine):
    a = fleet("a", push=True, pull=False)
    tokens, boundaries = doc_prompt(engine, 63)
    cold = computed_by(a, tokens, boundaries)
    proxy = FaultProxy(fleet.spec.endpoint_url, stall_on="/blobs/").start()
    try:
        b = fleet("b", push=False, pull=True, endpoint=proxy.endpoint, lookup_ms=500)
        t0 = time.perf_counter()
        prep = b.prepare(tokens, boundaries=boundaries)
        took = time.perf_counter() - t0
    finally:
        proxy.stop()
    assert proxy.stalled >= 1 and b.remote.counters.fetch_timeouts == 1
    assert prep.source == "cold" and logits_sha256(b.session.logits()) == cold
    saved = boundaries[0] * 2e-3  # the fetch's deadline: the prefill it would have saved (no rate measured yet)
    assert took < 0.5 + saved + prep.prefill_ms / 1e3 + 2.0  # the lookup, the deadline, the prefill: no stall
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{s.getsockname()[1]}"
    c = fleet("c", push=False, pull=True, endpoint=gone)
    prep = c.prepare(tokens, boundaries=boundaries)
    assert prep.source == "cold" and logits_sha256(c.session.logits()) == cold
    assert c.remote.counters.refused["remote_error"] == 1 or c.remote.counters.lookup_timeouts == 1


def test_a_full_upload_queue_drops_and_counts(fleet, engine):
    a = fleet("a", push=True, pull=False)
    a.remote._queue.maxsize = 1
    blocker = threading.Event()
    real = a.remote._uploads.put
    a.remote._uploads.put = lambda *args: (blocker.wait(30), real(*args))[1]  # the uploader is stuck
    for seed in (64, 65, 66):
        tokens, boundaries = doc_prompt(engine, seed)
        a.prepare(tokens, boundaries=boundaries)
        a.flush()
    assert a.remote.counters.upload_dropped >= 1  # never waited for: the requests went on
    blocker.set()


def test_remote_gc_beside_an_uploading_process_and_a_kill_9_leave_the_bucket_consistent(fleet, engine, tmp_path):
    from kvgraft.app.remote.check import verify_remote
    from kvgraft.library.remote import RemoteRepo
    from kvgraft.library.remote_cache import gc_cache

    a = fleet("a", push=True, pull=False)
    tokens, boundaries = doc_prompt(engine, 67)
    computed_by(a, tokens, boundaries)
    repo = RemoteRepo(fleet.spec)
    store = RemoteCacheStore(fleet.spec)
    assert len(store.records()) >= 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-m", "tests.cache_uploader", fleet.spec.bucket, fleet.spec.endpoint_url, str(fleet.key)]
    uploader = guarded_popen([*args, "12", "0.15"], env=env, stdout=subprocess.PIPE, text=True)
    rounds = []
    while uploader.poll() is None:  # gc of everything written before now, again and again, beside the uploads
        rounds.append(gc_cache(store, set(), older_than_s=0.5, grace_s=60))
        time.sleep(0.2)
    assert uploader.returncode == 0, uploader.stdout.read()
    assert sum(r["records_removed"] for r in rounds) > 0 and all(r["blobs_removed"] == 0 for r in rounds)
    check = verify_remote(repo)
    assert check.ok, check.problems  # no record names a blob the bucket lacks
    # an uploader killed between a blob and its record: the blob is a note, never a problem
    killed = guarded_popen([*args, "5", "30"], env=env, stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "blob 0"
    killed.kill()
    killed.wait()
    check = verify_remote(repo)
    assert check.ok and any("no manifest or cache record names" in n["note"] for n in check.notes), check.as_dict()
    # past the grace period the blobs nothing names go, but never one a knowledge manifest names
    unnamed = sorted(
        set(store.blobs.iter_shas()) - {read_record(store.get_record(k))[0].blob_sha256 for k, _ in store.records()}
    )
    knowledge = unnamed[0]
    later = gc_cache(store, {knowledge}, older_than_s=3600, grace_s=60, now=time.time() + 120)
    assert later["blobs_removed"] == len(unnamed) - 1 >= 1 and later["records_removed"] == 0
    assert store.blobs.contains(knowledge)
    assert verify_remote(repo).ok
    # the command: nothing young removed; its words
    home = tmp_path / "admin"
    r = CliRunner().invoke(
        cli,
        [
            "--home",
            str(home),
            "remote",
            "add",
            "team",
            f"s3://{fleet.spec.bucket}/fleet",
            "--endpoint-url",
            fleet.spec.endpoint_url,
        ],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["--home", str(home), "remote", "gc", "team", "--cache-older-than", "7d", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert (out["remote"], out["records_removed"], out["blobs_removed"]) == ("team", 0, 0)  # all young
    assert out["blobs_in_grace"] >= 1  # the blob the last gc kept as knowledge: nothing names it now, it is young
    r = CliRunner().invoke(cli, ["--home", str(home), "remote", "gc", "team", "--cache-older-than", "soon"])
    assert r.exit_code == 2 and "not an age" in r.output


def test_remote_gc_keeps_the_newest_states_within_a_budget(fleet, tmp_path):
    from kvgraft.library.remote_cache import gc_cache
    from tests.cache_uploader import main as upload

    store = RemoteCacheStore(fleet.spec)
    for i in range(3):  # S3 times an object to the second: one record a second, oldest first
        upload(fleet.spec.bucket, fleet.spec.endpoint_url, str(fleet.key), 1, 0, first=i)
        time.sleep(1.1)
    sizes = [read_record(store.get_record(k))[0].stored_size for k, _ in store.records()]
    newest = max(store.records(), key=lambda km: km[1])[0]
    out = gc_cache(store, set(), older_than_s=3600, grace_s=3600, budget_bytes=2 * max(sizes))
    assert out["records_removed"] == 1 and out["bytes_named"] <= 2 * max(sizes)
    assert len(store.records()) == 2 and newest in {k for k, _ in store.records()}
    out = gc_cache(store, set(), older_than_s=3600, grace_s=0, now=time.time() + 1, budget_bytes=0)
    assert out["records_removed"] == 2 and out["blobs_removed"] == 3 and store.records() == []
