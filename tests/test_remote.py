"""The team library on a real S3 server (SeaweedFS 4.48 from PyPI, on loopback): push, pull, verify
--remote, and the faults: killed pushes, a server gone mid-pull, altered and missing objects, two
pushers at once, wrong endpoints and credentials. No mock of the S3 API anywhere here."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.app.lab.local_s3 import ACCESS_KEY, SECRET_KEY, LocalS3
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.remote.check import verify_remote
from kvgraft.app.remote.pull import pull
from kvgraft.app.remote.push import push
from kvgraft.app.service import LibraryService
from kvgraft.entry import cli
from kvgraft.library import container
from kvgraft.library.blobstore import BlobStore
from kvgraft.library.errors import RemoteError
from kvgraft.library.library import Library
from kvgraft.library.remote import RemoteRepo, RemoteSpec, S3BlobStore, entry_key
from kvgraft.library.signing import generate_key

PROBLEMS = [p for p in starter_problems(24) if len(p.solution) < 1000][:6]


@pytest.fixture(scope="module")
def team(engine, tmp_path_factory):
    """Alice's library: 6 short solutions, vouched by their checker; her signing key."""
    d = tmp_path_factory.mktemp("team")
    home = d / "alice"
    signer = generate_key(d / "alice.key")
    with Library(home) as lib:
        svc = LibraryService(engine, lib)
        ids = [
            svc.deposit_solution(
                p.question, p.solution, p.answer, checker=p.checker, vouched_by="checker:numeric"
            ).entry.id
            for p in PROBLEMS
        ]
        svc.close()
    return SimpleNamespace(home=home, key=d / "alice.key", signer=signer, ids=ids)


@pytest.fixture
def cli_engine(engine, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return engine


def kv(home: Path, *args: str):
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def new_bucket(server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    server.make_bucket(name)
    return name


def add_remote(home: Path, name: str, bucket: str, server) -> RemoteSpec:
    r = kv(home, "remote", "add", name, f"s3://{bucket}/team", "--endpoint-url", server.endpoint)
    assert r.exit_code == 0, r.output
    return RemoteSpec(name, bucket, "team/", server.endpoint)


def library_state(home: Path):
    with Library(home) as lib:
        pending = lib._db.execute("SELECT count(*) FROM pending_blobs").fetchone()[0]
        return lib.count(), sorted(lib.blobs.iter_shas()), pending


def _container(seed: int) -> tuple[str, bytes]:
    rng = np.random.default_rng(seed)
    canonical = bytearray(rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes())
    canonical[1000:50_000] = bytes(49_000)

    c = container.make(len(canonical), [(1000, 49_000)])
    stored = b"".join(bytes(p) for p in container.pieces(memoryview(canonical), c))
    return hashlib.sha256(canonical).hexdigest(), stored


@pytest.mark.parametrize("tier", ["disk", "s3"])
def test_one_store_interface(tier, s3_env, tmp_path):
    """The disk store and the S3 tier keep the same promises: content-addressed, checked, write-once."""
    if tier == "disk":
        store = BlobStore(tmp_path / "blobs")
    else:
        store = S3BlobStore(RemoteSpec("t", new_bucket(s3_env), "x/", s3_env.endpoint))
    sha, stored = _container(1)
    assert not store.contains(sha) and store.stored_size(sha) is None
    assert store.add_stored(sha, stored) is True
    assert store.add_stored(sha, stored) is False  # already there: not written again
    assert store.contains(sha) and store.stored_size(sha) == len(stored)
    got, canonical, ranges = store.read_checked(sha)
    assert bytes(got) == stored and len(canonical) == 300_000 and ranges.tolist() == [[1000, 49_000]]
    assert sha in set(store.iter_shas())
    if tier == "s3":  # never overwritten: a conditional put over the key is refused by the server
        other = stored[:-1] + bytes([stored[-1] ^ 1])
        assert store.add_stored(sha, other) is False
        assert store.get_stored(sha) == stored


def test_index_updates_never_lose_each_other(s3_env):
    """Eight writers add to the index at once through If-Match: every addition is there."""
    spec = RemoteSpec("t", new_bucket(s3_env), "", s3_env.endpoint)
    barrier = threading.Barrier(8)
    errors = []

    def add(i):
        repo = RemoteRepo(spec)
        barrier.wait()
        try:
            repo.update_index(
                lambda idx, i=i: idx["manifests"].update({f"{i:064x}": {"entries": 1, "keys": [f"{i + 100:064x}"]}})
            )
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    ts = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors
    index, etag = RemoteRepo(spec).read_index()
    assert sorted(index["manifests"]) == [f"{i:064x}" for i in range(8)] and etag


def test_push_pull_graft_and_verify(team, s3_env, cli_engine, tmp_path):
    bucket = new_bucket(s3_env)
    r = kv(team.home, "remote", "add", "t2", f"s3://{bucket}/team", "--endpoint-url", s3_env.endpoint, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {
        "name": "t2",
        "url": f"s3://{bucket}/team",
        "bucket": bucket,
        "prefix": "team/",
        "endpoint_url": s3_env.endpoint,
        "reachable": True,
    }
    ids = [str(i) for i in team.ids[:3]]
    r = kv(team.home, "push", "t2", *ids, "--sign", str(team.key), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    with Library(team.home) as lib:
        sizes = {lib.blobs.stored_size(lib.get(int(i)).blob_sha256) for i in ids}
    assert (out["pushed"], out["skipped"], out["bytes"]) == (3, 0, sum(sizes)) and len(out["manifests"]) == 1
    out = json.loads(kv(team.home, "push", "t2", *ids, "--json").stdout)
    assert (out["pushed"], out["skipped"], out["bytes"]) == (0, 3, 0)  # the remote holds them: nothing sent
    r = kv(team.home, "verify", "--remote", "t2", "--json")
    v = json.loads(r.stdout)
    assert r.exit_code == 0 and v["ok"] and (v["manifests"], v["entries"], v["blobs"]) == (1, 3, 3)
    assert v["signed"] == {team.signer.key_id: 1} and v["problems"] == []

    # Bob trusts Alice: her signed states are taken as signed, no replay; then everything checks out here
    bob = tmp_path / "bob"
    trust_store(bob).trust(team.signer.public_key_b64, "alice")
    add_remote(bob, "t2", bucket, s3_env)
    r = kv(bob, "pull", "t2", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["imported"], out["skipped"], out["refused"]) == (3, 0, []) and out["proof"] == {"signed:alice": 3}
    out = json.loads(kv(bob, "pull", "t2", "--json").stdout)
    assert (out["imported"], out["skipped"], out["refused"]) == (0, 3, [])
    r = kv(bob, "verify", "--library", "--replay", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"], r.output
    p = PROBLEMS[0]
    a = json.loads(kv(bob, "ask", p.question, "--json").stdout)
    assert a["source"] == "graft" and a["proof"] == "signed:alice" and a["exact"] is True and a["answer"] == p.answer

    # Carol trusts no one: --require-signed refuses each entry by name, and her library is unchanged
    carol = tmp_path / "carol"
    add_remote(carol, "t2", bucket, s3_env)
    r = kv(carol, "pull", "t2", "--require-signed", "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 3 and out["imported"] == 0 and len(out["refused"]) == 3
    assert all("not in your trusted keys" in x["reason"] and x["entry"] for x in out["refused"])
    assert library_state(carol)[:2] == (0, [])
    out = json.loads(kv(carol, "pull", "t2", "--json").stdout)  # without it: each entry replayed here
    assert out["imported"] == 3 and out["proof"] == {"replayed": 3}


def test_pull_refuses_altered_and_missing_blobs(team, s3_env, cli_engine, tmp_path):
    bucket = new_bucket(s3_env)
    add_remote(team.home, "t3", bucket, s3_env)
    ids = team.ids[:3]
    assert kv(team.home, "push", "t3", *map(str, ids)).exit_code == 0
    with Library(team.home) as lib:
        shas = [lib.get(i).blob_sha256 for i in ids]
    c = s3_env.client()
    altered = c.get_object(Bucket=bucket, Key=f"team/blobs/sha256/{shas[0]}")["Body"].read()
    c.put_object(Bucket=bucket, Key=f"team/blobs/sha256/{shas[0]}", Body=altered[:-1] + bytes([altered[-1] ^ 0x40]))
    c.delete_object(Bucket=bucket, Key=f"team/blobs/sha256/{shas[1]}")

    r = kv(team.home, "verify", "--remote", "t3", "--json")
    v = json.loads(r.stdout)
    assert r.exit_code == 1 and not v["ok"]
    problems = {p["object"]: p["problem"] for p in v["problems"]}
    assert "SHA-256" in problems[f"team/blobs/sha256/{shas[0]}"]
    assert "absent" in problems[f"team/blobs/sha256/{shas[1]}"]

    bob = tmp_path / "bob"
    add_remote(bob, "t3", bucket, s3_env)
    r = kv(bob, "pull", "t3", "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 3 and out["imported"] == 1 and len(out["refused"]) == 2
    reasons = " | ".join(x["reason"] for x in out["refused"])
    assert "does not match its SHA-256" in reasons and "missing from the remote" in reasons
    named = " | ".join(x["entry"] for x in out["refused"])  # each refusal names its entry
    assert PROBLEMS[0].question[:40] in named and PROBLEMS[1].question[:40] in named
    count, blobs, pending = library_state(bob)
    assert (count, blobs, pending) == (1, [shas[2]], 0)
    assert not list((bob / "tmp").glob("pull-*"))  # the downloads are gone


def test_two_pushers_at_once(team, s3_env):
    """Three people push different entries at the same moment: all three sets end up published."""
    spec = RemoteSpec("t4", new_bucket(s3_env), "team/", s3_env.endpoint)
    barrier = threading.Barrier(3)
    results, errors = {}, []

    def one(i):
        with Library(team.home) as lib:
            e = lib.get(team.ids[i])
            barrier.wait()
            try:
                results[i] = push(lib, RemoteRepo(spec), [e])
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors and all(r.pushed == 1 for r in results.values())
    repo = RemoteRepo(spec)
    index, _ = repo.read_index()
    keys = {k for m in index["manifests"].values() for k in m["keys"]}
    with Library(team.home) as lib:
        es = [lib.get(i) for i in team.ids[:3]]
    assert keys == {entry_key(e.fingerprint, e.kind, e.tokens_sha256, e.blob_sha256, e.question, e.answer) for e in es}
    assert len(index["manifests"]) == 3 and verify_remote(repo).ok


@pytest.mark.parametrize("rounds", [3, pytest.param(6, marks=pytest.mark.slow)])
def test_push_killed_at_random_moments(team, s3_env, rounds):
    """SIGKILL a `kvgraft push` at random moments of its run (each into a fresh prefix, the moments
    spread over a whole push's time): the remote stays consistent every time (every manifest's blobs
    present, verify --remote clean), and the next push completes the job. 3 rounds in `make test`, 6 in
    `make test-slow`."""
    bucket = new_bucket(s3_env)
    exe = str(Path(sys.executable).with_name("kvgraft"))
    env = dict(os.environ, KVGRAFT_HOME=str(team.home))
    r = kv(team.home, "remote", "add", "t5-time", f"s3://{bucket}/time", "--endpoint-url", s3_env.endpoint)
    assert r.exit_code == 0, r.output
    t0 = time.monotonic()  # how long a whole push takes here, start-up included: the kills land inside it
    subprocess.run([exe, "push", "t5-time", "--all"], env=env, check=True, capture_output=True)
    whole = time.monotonic() - t0
    rng = random.Random(29)
    seen = []
    for k in range(rounds):
        spec = RemoteSpec(f"t5-{k}", bucket, f"kill{k}/", s3_env.endpoint)
        assert kv(team.home, "remote", "add", spec.name, spec.url, "--endpoint-url", s3_env.endpoint).exit_code == 0
        proc = subprocess.Popen([exe, "push", spec.name, "--all"], env=env, stdout=subprocess.DEVNULL)
        time.sleep(0.4 + (whole - 0.4) * (k + rng.random()) / rounds)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        repo = RemoteRepo(spec)
        check = verify_remote(repo)
        assert check.ok, check.problems
        seen.append(
            (len(list(repo.blobs.iter_shas())), len(repo.manifest_shas()), len(repo.read_index()[0]["manifests"]))
        )
        r = subprocess.run([exe, "push", spec.name, "--all", "--json"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["pushed"] + out["skipped"] == len(team.ids)
        index, _ = repo.read_index()
        assert len({k for m in index["manifests"].values() for k in m["keys"]}) == len(team.ids)
        check = verify_remote(repo)
        assert check.ok and check.blobs == len(team.ids)
        assert set(repo.manifest_shas()) == set(index["manifests"])  # whatever the killed push left is published
    print(f"a whole push took {whole:.2f} s; what each kill left (blobs, manifests, published): {seen}")


def test_a_blob_cut_off_mid_put_is_sent_again(team, s3_env):
    """A put killed mid-body can leave the blob's key holding what the server received (SeaweedFS kept
    0 bytes of a 9.7 MB blob in CI). Nothing names it, so the next push replaces it; a damaged blob a
    manifest names is never overwritten: the push stops and says so."""
    spec = RemoteSpec("t5c", new_bucket(s3_env), "cut/", s3_env.endpoint)
    repo = RemoteRepo(spec)
    with Library(team.home) as lib:
        first, second = lib.get(team.ids[0]), lib.get(team.ids[1])
        for e in (first, second):  # what a cut-off put leaves: the key there, the body short
            repo.blobs.client.put_object(Bucket=spec.bucket, Key=repo.blobs.key(e.blob_sha256), Body=b"")
        assert not verify_remote(repo).problems  # named by nothing: a note, not a problem
        res = push(lib, repo, [first])
        assert res.pushed == 1 and res.bytes == repo.blobs.stored_size(first.blob_sha256) > 0
        check = verify_remote(repo)
        assert check.ok and check.blobs == 1
        # now damage the blob the published manifest names, and take that manifest out of the index
        (msha,) = res.manifests
        repo.blobs.client.put_object(Bucket=spec.bucket, Key=repo.blobs.key(first.blob_sha256), Body=b"x")
        repo.update_index(lambda idx: idx["manifests"].pop(msha))
        with pytest.raises(RemoteError, match="a manifest names it"):
            push(lib, repo, [first])
        assert repo.blobs.get_key(repo.blobs.key(first.blob_sha256)) == b"x"  # not overwritten
        assert repo.blobs.stored_size(second.blob_sha256) == 0  # untouched: not part of that push


def _dies(self, change):
    raise SystemExit("the process ends here, before the index is updated")


def test_push_stopped_before_publishing_is_completed_by_the_next(team, s3_env, monkeypatch):
    """The narrowest window: blobs and manifest written, the index not yet. Nothing names a missing
    blob (verify is clean, with a note), and the next push publishes that manifest."""
    spec = RemoteSpec("t6", new_bucket(s3_env), "team/", s3_env.endpoint)
    with Library(team.home) as lib:
        entries = [lib.get(i) for i in team.ids[:2]]
        with monkeypatch.context() as m, pytest.raises(SystemExit):
            m.setattr(RemoteRepo, "update_index", _dies)
            push(lib, RemoteRepo(spec), entries)
        repo = RemoteRepo(spec)
        assert repo.read_index()[0]["manifests"] == {} and len(repo.manifest_shas()) == 1
        check = verify_remote(repo)
        assert check.ok and any("not published" in n["note"] for n in check.notes)
        res = push(lib, repo, entries)
    assert (res.pushed, res.skipped, res.recovered) == (0, 2, repo.manifest_shas())
    assert set(repo.read_index()[0]["manifests"]) == set(repo.manifest_shas())


def test_server_stopped_mid_pull(team, s3_env, engine, tmp_path):
    """The server dies while a pull downloads: a clear error, nothing imported; a retry completes."""
    own = LocalS3(identities={ACCESS_KEY: SECRET_KEY}, root=tmp_path / "s3").start()
    try:
        own.make_bucket("team-mid")
        spec = RemoteSpec("mid", "team-mid", "team/", own.endpoint)
        with Library(team.home) as lib:
            res = push(lib, RemoteRepo(spec), [lib.get(i) for i in team.ids[:3]])
        assert res.pushed == 3
        home = tmp_path / "bob"
        repo = RemoteRepo(spec)
        fetch = repo.blobs.get_stored

        def dies_first(sha, limit=None):
            own.kill()
            return fetch(sha, limit)

        repo.blobs.get_stored = dies_first
        with Library(home) as lib, LibraryService(engine, lib) as svc, pytest.raises(RemoteError, match="cannot reach"):
            pull(svc, repo)
        assert library_state(home) == (0, [], 0)
        assert not list((home / "tmp").glob("pull-*"))
        own.start()
        with Library(home) as lib, LibraryService(engine, lib) as svc:
            out = pull(svc, RemoteRepo(spec))
        assert (out.imported, out.refused) == (3, [])
    finally:
        own.stop()


def test_wrong_endpoint_credentials_and_names(s3_env, monkeypatch, tmp_path):
    home = tmp_path / "h"
    bucket = new_bucket(s3_env)
    r = kv(home, "remote", "add", "x", "http://not-s3")
    assert r.exit_code == 3 and "not an S3 URL" in r.stderr
    r = kv(home, "remote", "add", "x", f"s3://{bucket}", "--endpoint-url", "http://127.0.0.1:9")
    assert r.exit_code == 3 and "cannot reach the endpoint" in r.stderr
    r = kv(home, "remote", "add", "x", "s3://no-such-bucket-here", "--endpoint-url", s3_env.endpoint)
    assert r.exit_code == 3 and "no such bucket" in r.stderr
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    r = kv(home, "remote", "add", "x", f"s3://{bucket}", "--endpoint-url", s3_env.endpoint)
    assert r.exit_code == 3 and "refused these credentials" in r.stderr
    assert json.loads(kv(home, "remote", "list", "--json").stdout) == []  # nothing stored for a refused remote
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    assert kv(home, "remote", "add", "x", f"s3://{bucket}", "--endpoint-url", s3_env.endpoint).exit_code == 0
    r = kv(home, "remote", "add", "x", f"s3://{bucket}", "--endpoint-url", s3_env.endpoint)
    assert r.exit_code == 3 and "exists already" in r.stderr
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    r = kv(home, "verify", "--remote", "x")
    assert r.exit_code == 3 and "refused these credentials" in r.stderr
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    r = kv(home, "verify", "--remote", "x")
    assert r.exit_code == 3 and "no S3 credentials" in r.stderr
    r = kv(home, "pull", "nope")
    assert r.exit_code == 3 and "no remote named 'nope'" in r.stderr
    assert kv(home, "remote", "rm", "x").exit_code == 0
    assert json.loads(kv(home, "remote", "list", "--json").stdout) == []


def test_a_cancelled_pull_imports_nothing(team, s3_env, engine, tmp_path):
    """Cancel (the window's button raises Cancelled from the progress callback) while blobs download:
    nothing imported, no temp files left; the next pull completes."""
    from kvgraft.engine.errors import Cancelled

    spec = RemoteSpec("t8", new_bucket(s3_env), "team/", s3_env.endpoint)
    with Library(team.home) as lib:
        assert push(lib, RemoteRepo(spec), [lib.get(i) for i in team.ids[:2]]).pushed == 2

    def cancel_on_download(stage, done, total):
        if stage == "download":
            raise Cancelled("cancelled")

    home = tmp_path / "bob"
    with Library(home) as lib, LibraryService(engine, lib) as svc:
        with pytest.raises(Cancelled):
            pull(svc, RemoteRepo(spec), progress=cancel_on_download)
        assert library_state(home) == (0, [], 0) and not list((home / "tmp").glob("pull-*"))
        assert pull(svc, RemoteRepo(spec)).imported == 2


def test_a_hostile_bucket_is_refused_by_name(team, s3_env, cli_engine, tmp_path):
    """A second manifest that declares a wrong size for a blob another manifest shares: its entry is
    refused, the rest imported, and no good local blob is marked damaged. Then malformed objects:
    a nested index.json is a clear error; a missing bucket is not an empty remote."""
    bucket = new_bucket(s3_env)
    spec = add_remote(team.home, "t9", bucket, s3_env)
    ids = team.ids[:2]
    r = kv(team.home, "push", "t9", *map(str, ids))
    assert r.exit_code == 0, r.output
    repo = RemoteRepo(spec)
    (good,) = repo.manifest_shas()
    m = json.loads(repo.get_manifest(good))
    m["entries"][0]["blob_size"] += 16  # a lie about the canonical size: the SHA-256 still matches
    body = json.dumps(m, indent=1, sort_keys=True).encode()
    bad = hashlib.sha256(body).hexdigest()
    assert repo.blobs.put_once(repo.manifest_key(bad), body)
    from kvgraft.app.remote.push import manifest_keys
    from kvgraft.library.manifest import parse_manifest

    keys = manifest_keys(parse_manifest(m))
    repo.update_index(lambda idx: idx["manifests"].update({bad: {"entries": 2, "keys": keys}}))
    v = json.loads(kv(team.home, "verify", "--remote", "t9", "--json").stdout)
    assert not v["ok"] and any("contradicts" in p["problem"] for p in v["problems"])

    bob = tmp_path / "bob"
    add_remote(bob, "t9", bucket, s3_env)
    r = kv(bob, "pull", "t9", "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 3 and out["imported"] == 2 and len(out["refused"]) == 1
    assert out["refused"][0]["entry"].startswith(bad[:12]) and "manifest says" in out["refused"][0]["reason"]
    r = kv(bob, "verify", "--library", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"], r.output  # nothing marked damaged
    a = json.loads(kv(bob, "ask", PROBLEMS[0].question, "--json").stdout)
    assert a["source"] == "graft" and a["exact"] is True

    c = s3_env.client()
    c.put_object(Bucket=bucket, Key="team/index.json", Body=b"[" * 100_000 + b"]" * 100_000)
    r = kv(bob, "pull", "t9")
    assert r.exit_code == 3 and "index.json is not valid JSON" in r.stderr and "Traceback" not in r.output
    r = kv(bob, "verify", "--remote", "t9")
    assert r.exit_code == 3 and "index.json is not valid JSON" in r.stderr
    for obj in c.list_objects_v2(Bucket=bucket).get("Contents", []):
        c.delete_object(Bucket=bucket, Key=obj["Key"])
    c.delete_bucket(Bucket=bucket)
    r = kv(bob, "pull", "t9")
    assert r.exit_code == 3 and "no such bucket" in r.stderr
