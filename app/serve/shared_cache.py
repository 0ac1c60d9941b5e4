"""A fleet's shared prompt cache: `kvgraft serve --remote NAME` (docs/server.md, "A fleet").

Uploads (`--share-cache push` or `both`): a cache state the prompt cache stored here is queued for upload
(its stored container read on the engine thread in idle time, as the store itself is) and written by an
uploader thread: blob first, then its record signed with the instance's key (library/remote_cache.py). The
queue is bounded: what it cannot keep up with is dropped and counted, never waited for.

Lookups (`pull` or `both`): on a prompt the warm context and the local library cover less of than a
candidate boundary, the candidates (the request's message boundaries and every whole block, longest
first) are looked up by key, in parallel, within a deadline (`lookup_ms`). The longest record that
verifies with a trusted key, carries this engine's fingerprint and the prompt's token hash is fetched if
the expected fetch time (its size at the bandwidth measured so far) is below the prefill time it saves
(the prefill rate measured so far); the fetch has that saving as its deadline. Its blob is checked as
every state from elsewhere is (app/packs/admission.py `check_blob`: the SHA-256 of its canonical bytes,
a state of this model, canonical, of the record's token count), stored here as a cache state with proof
`signed:<trusted key name>` (evicted by the same LRU budget, never a knowledge entry, never in search),
and grafted. Anything else (no record, a record unsigned or untrusted, another fingerprint or token hash,
a blob that fails a check, a deadline passed, an error reaching the remote) is counted and the prompt is
prefilled here: never an error to the client.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from kvgraft.app.packs.admission import check_blob, state_size_limit
from kvgraft.app.proof.replay import schedule_of
from kvgraft.app.remote.fetched import DownloadedBlobs, Held
from kvgraft.app.service import model_record
from kvgraft.library.errors import LibraryError
from kvgraft.library.remote import RemoteSpec
from kvgraft.library.remote_cache import (
    CacheRecord,
    RecordError,
    RemoteCacheStore,
    cache_key,
    lookup_client,
    read_record,
    signed_record,
)
from kvgraft.library.signing import TrustStore
from kvgraft.library.tokens import tokens_sha256

log = logging.getLogger(__name__)

LOOKUP_MS = 50.0  # the deadline of a lookup round
UPLOAD_QUEUE = 16
MAX_CANDIDATES = 64  # keys one lookup asks for, longest first
PREFILL_S_PER_TOKEN = 2e-3  # the prefill rate assumed until one was measured here
BANDWIDTH = 20e6  # bytes/s assumed until a fetch was measured


@dataclass
class SharedCounters:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    lookup_timeouts: int = 0
    fetch_skipped_slow: int = 0  # a record found, its fetch expected to take longer than the prefill
    fetch_timeouts: int = 0
    refused: Counter = field(default_factory=Counter)  # why a record or blob was not grafted
    uploaded: int = 0
    upload_dropped: int = 0
    upload_failed: int = 0
    fetch_s: float = 0.0
    bytes_fetched: int = 0
    bytes_uploaded: int = 0


class SharedCache:
    def __init__(
        self,
        spec: RemoteSpec,
        trust: TrustStore,
        push: bool,
        pull: bool,
        sign_key: Path | None,
        lookup_ms: float = LOOKUP_MS,
        upload_queue: int = UPLOAD_QUEUE,
        client=None,
    ) -> None:
        if push and sign_key is None:
            raise LibraryError("sharing the cache (push) needs the instance's signing key (--sign)")
        self.spec, self.trust, self.push, self.pull = spec, trust, push, pull
        self.sign_key = sign_key
        self.lookup_s = lookup_ms / 1e3
        self.counters = SharedCounters()
        self.bandwidth = BANDWIDTH
        self._lookups = RemoteCacheStore(spec, lookup_client(spec, max(1.0, 4 * self.lookup_s)))
        self._uploads = RemoteCacheStore(spec, client)
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="kvgraft-remote-lookup")
        self._queue: queue.Queue = queue.Queue(upload_queue)
        self._uploader = threading.Thread(target=self._upload_loop, name="kvgraft-remote-upload", daemon=True)
        if push:
            self._uploader.start()

    @property
    def name(self) -> str:
        return self.spec.name

    # -- lookups (the engine thread) ----------------------------------------------------------------
    def candidates(self, n: int, boundaries, block: int, beyond: int) -> list[int]:
        """Prefix lengths worth a lookup, longest first: the request's boundaries (the whole prompt's state
        is used one token short: its last token is decoded here for its logits), then every whole block (a
        2,000-token prompt in 64-token blocks: 31 keys besides its boundaries), past `beyond`."""
        points = {p for p in boundaries if p <= n and min(p, n - 1) > beyond}
        points |= {p for p in range(block, n, block) if beyond < p}
        return sorted(points, reverse=True)[:MAX_CANDIDATES]

    def lookup(self, cache, tokens: list[int], boundaries, beyond: int):
        """A state of one of the prompt's candidate prefixes longer than `beyond`, fetched, checked and
        stored here: (its Entry, fetch ms), or None (the prompt is prefilled here)."""
        engine = cache.engine
        points = self.candidates(len(tokens), boundaries, cache.block, beyond)
        if not self.pull or not points:
            return None
        self.counters.lookups += 1
        keyed = {}
        for p in points:
            sha = tokens_sha256(tokens[:p])
            keyed[p] = (sha, self._pool.submit(self._lookups.get_record, cache_key(engine.fingerprint, sha)))
        t0 = time.perf_counter()
        found = None
        for p in points:  # longest first: the first good one wins
            sha, fut = keyed[p]
            left = self.lookup_s - (time.perf_counter() - t0)
            try:
                raw = fut.result(timeout=max(0.0, left))
            except FutureTimeout:
                self.counters.lookup_timeouts += 1
                break
            except Exception as exc:  # noqa: BLE001 (whatever boto3 raises for an unreachable remote: prefill here)
                self.counters.refused["remote_error"] += 1
                log.info("remote %s: lookup failed: %s", self.name, exc)
                break
            if raw is None:
                continue
            record = self._trusted(raw, engine.fingerprint, sha, p)
            if record is not None:
                found = (p, record)
                break
        if found is None:
            self.counters.misses += 1
            return None
        return self._fetch(cache, tokens, *found)

    def _trusted(self, raw: bytes, fingerprint: str, sha: str, n: int) -> tuple[CacheRecord, str] | None:
        try:
            record, signer = read_record(raw)
        except RecordError as exc:
            self.counters.refused["malformed_or_unsigned"] += 1
            log.info("remote %s: a cache record refused: %s", self.name, exc)
            return None
        name = self.trust.name_of(signer.key_id) if self.trust.trusts(signer) else None
        if name is None:
            self.counters.refused["untrusted_signer"] += 1
            return None
        if record.fingerprint != fingerprint:
            self.counters.refused["other_fingerprint"] += 1
            return None
        if record.tokens_sha256 != sha or record.n_tokens != n:
            self.counters.refused["other_tokens"] += 1
            return None
        return record, name

    def _fetch(self, cache, tokens: list[int], p: int, found: tuple[CacheRecord, str]):
        record, signer_name = found
        engine, c = cache.engine, cache.counters
        per_token = c.prefill_s / c.tokens_prefilled if c.tokens_prefilled >= 256 else PREFILL_S_PER_TOKEN
        saved_s = p * per_token
        if record.stored_size / self.bandwidth >= saved_s:
            self.counters.fetch_skipped_slow += 1
            return None
        t0 = time.perf_counter()
        fut = self._pool.submit(self._checked, engine, record)
        try:
            data, dead = fut.result(timeout=saved_s)
        except FutureTimeout:
            self.counters.fetch_timeouts += 1
            return None
        except Exception as exc:  # noqa: BLE001 (BlobCorrupt, PackError, a remote error: never grafted, prefilled)
            self.counters.refused["blob_refused"] += 1
            log.warning("remote %s: cache state %s... refused: %s", self.name, record.blob_sha256[:16], exc)
            return None
        fetch_s = time.perf_counter() - t0
        self.counters.fetch_s += fetch_s
        self.counters.bytes_fetched += record.stored_size
        self.bandwidth = 0.5 * self.bandwidth + 0.5 * record.stored_size / max(fetch_s, 1e-3)
        entry, _ = cache.library.cache.add_cache_state(
            0,
            text=engine.model.detokenize(tokens[:p]),
            tokens=list(tokens[:p]),
            blob=data,
            blob_sha256=record.blob_sha256,
            fingerprint=engine.fingerprint,
            model=model_record(engine),
            title=f"prompt cache: {p} tokens (remote {self.name})",
            elided=dead,
            schedule=schedule_of(engine),
            proof=f"signed:{signer_name}",
        )
        self.counters.hits += 1
        return entry, fetch_s * 1e3

    def _checked(self, engine, record: CacheRecord):
        """(canonical bytes, dead ranges) of the record's blob: one GET, one SHA-256 pass, then the one
        way in's checks of a state from elsewhere."""
        limit = state_size_limit(engine)
        stored, data, ranges = self._lookups.blobs.read_checked(record.blob_sha256, record.blob_size, limit)
        source = DownloadedBlobs({record.blob_sha256: Held(stored, data, ranges, b"")})
        checked = check_blob(engine, source, record.blob_sha256, record.blob_size, limit)
        if checked.n_tokens != record.n_tokens:
            raise RecordError(f"the state holds {checked.n_tokens} tokens, its record says {record.n_tokens}")
        return data, checked.dead

    # -- uploads --------------------------------------------------------------------------------------
    def offer(self, library, entry) -> None:
        """Queue a state just stored here for upload (the engine thread; never waits)."""
        if not self.push:
            return
        try:
            stored = library.blobs.get_stored(entry.blob_sha256)
        except (LibraryError, OSError):
            self.counters.upload_failed += 1
            return
        record = CacheRecord(
            entry.fingerprint, entry.tokens_sha256, entry.n_tokens, entry.blob_sha256, entry.blob_size, len(stored)
        )
        try:
            self._queue.put_nowait((record, stored))
        except queue.Full:
            self.counters.upload_dropped += 1

    def _upload_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            record, stored = item
            try:
                self._uploads.put(record, signed_record(record, self.sign_key), stored)
                self.counters.uploaded += 1
                self.counters.bytes_uploaded += len(stored)
            except Exception as exc:  # noqa: BLE001 (a failed upload loses that state, never the server)
                self.counters.upload_failed += 1
                log.warning("remote %s: upload of a cache state failed: %s", self.name, exc)
            finally:
                self._queue.task_done()

    def close(self, timeout: float = 10.0) -> None:
        """Let queued uploads finish (up to `timeout`), then stop the threads."""
        if self.push and self._uploader.is_alive():
            deadline = time.monotonic() + timeout
            while self._queue.unfinished_tasks and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)
            self._uploader.join(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)
