"""Pull speed, side by side in one run (docs/remote-format.md, README "A team library").

    python scripts/remote_bench.py [--entries 50] [--workers 4] [--json FILE]

A throwaway SeaweedFS 4.48 on loopback (app/lab/local_s3.py). Alice's library holds N solutions
(the starter problems, deposited here on the embedded model); she pushes them signed. Then, each
into an empty data dir that trusts her key:

  floor     boto3 downloads the same objects (manifests and blobs) to files, no checks (1 and W threads)
  pack      copying a signed .kvpack of the same entries (one file, the page cache warm), and
            importing it (signed: no replay)
  signed    kvgraft pull: every object re-hashed, every entry checked as import checks it, one
            transaction per manifest (no replay: a trusted key signed them)
  unsigned  kvgraft pull of the same entries unsigned (each replayed here), reported apart

MB are the blob bytes as stored (compact containers), the same for every row.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvgraft.app.core.model_store import embedded_model_path, model_sha256
from kvgraft.app.lab.local_s3 import ACCESS_KEY, SECRET_KEY, LocalS3
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.packs.export import export_pack
from kvgraft.app.packs.imports import import_pack
from kvgraft.app.packs.trust import trust_store
from kvgraft.app.remote.pull import pull
from kvgraft.app.remote.push import push
from kvgraft.app.service import LibraryService
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine
from kvgraft.library.library import Library
from kvgraft.library.remote import RemoteRepo, RemoteSpec
from kvgraft.library.signing import generate_key


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import os

    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    work = Path(tempfile.mkdtemp(prefix="kvgraft-remote-bench-"))
    path = embedded_model_path()
    engine = Engine.load(EngineConfig(model_path=path), model_sha256(path))
    rows, out = [], {"entries": args.entries, "workers": args.workers}
    try:
        with LocalS3(identities={ACCESS_KEY: SECRET_KEY}, root=work / "s3") as s3:
            s3.make_bucket("team")
            key = work / "alice.key"
            alice = generate_key(key)
            problems = starter_problems(args.entries)
            t = time.perf_counter()
            with Library(work / "alice") as lib, LibraryService(engine, lib) as svc:
                entries = [
                    svc.deposit_solution(p.question, p.solution, p.answer, checker=p.checker).entry for p in problems
                ]
                print(f"deposited {len(entries)} solutions in {time.perf_counter() - t:.1f} s", file=sys.stderr)
                signed = RemoteSpec("signed", "team", "signed/", s3.endpoint)
                plain = RemoteSpec("plain", "team", "plain/", s3.endpoint)
                t = time.perf_counter()
                res = push(lib, RemoteRepo(signed), entries, sign_key=key, workers=args.workers)
                push_s = time.perf_counter() - t
                push(lib, RemoteRepo(plain), entries, workers=args.workers)
                mb = res.bytes / 1e6
                rows.append(("push (signed)", push_s, mb))
                pack = work / "alice.kvpack"
                export_pack(lib, entries, pack, sign_key=key)

            repo = RemoteRepo(signed)
            index, _ = repo.read_index()
            keys = [repo.manifest_key(m) for m in index["manifests"]]
            keys += [repo.blobs.key(s) for s in repo.blobs.iter_shas()]
            for workers in sorted({1, args.workers}):
                dest = work / f"floor-{workers}"
                dest.mkdir()
                client = RemoteRepo(signed).blobs.client
                t = time.perf_counter()

                def get(k, dest=dest, client=client):
                    body = client.get_object(Bucket="team", Key=k)["Body"].read()
                    (dest / k.replace("/", "_")).write_bytes(body)

                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(get, keys))
                rows.append(
                    (
                        f"boto3 download, no checks ({workers} thread{'s' if workers > 1 else ''})",
                        time.perf_counter() - t,
                        mb,
                    )
                )
            t = time.perf_counter()
            shutil.copyfile(pack, work / "copy.kvpack")
            rows.append(("copy the .kvpack file", time.perf_counter() - t, mb))

            def fresh(name: str):
                home = work / name
                trust_store(home).trust(alice.public_key_b64, "alice")
                return home

            home = fresh("bob-pack")
            t = time.perf_counter()
            with Library(home) as lib, LibraryService(engine, lib) as svc:
                imp = import_pack(svc, work / "copy.kvpack")
            rows.append(("kvgraft import of the signed .kvpack", time.perf_counter() - t, mb))
            assert imp.imported == len(entries), imp
            home = fresh("bob")
            t = time.perf_counter()
            with Library(home) as lib, LibraryService(engine, lib) as svc:
                got = pull(svc, RemoteRepo(signed), workers=args.workers)
            signed_s = time.perf_counter() - t
            rows.append(("kvgraft pull, signed by a trusted key", signed_s, mb))
            assert got.imported == len(entries) and not got.refused, got
            home = fresh("carol")
            t = time.perf_counter()
            with Library(home) as lib, LibraryService(engine, lib) as svc:
                got = pull(svc, RemoteRepo(plain), workers=args.workers)
            rows.append(("kvgraft pull, unsigned (each entry replayed)", time.perf_counter() - t, mb))
            assert got.imported == len(entries) and got.proof == {"replayed": len(entries)}, got
    finally:
        engine.close()
        shutil.rmtree(work, ignore_errors=True)

    floor = min(s for name, s, _ in rows if name.startswith("boto3"))
    print(f"{len(entries)} entries, {mb:.1f} MB of blobs, SeaweedFS 4.48 on loopback, {args.workers} transfer threads")
    print(f"{'':48} {'seconds':>8} {'MB/s':>8} {'x floor':>8}")
    for name, s, m in rows:
        print(f"{name:48} {s:8.2f} {m / s:8.1f} {s / floor:8.2f}")
    out["rows"] = [
        {"what": n, "seconds": round(s, 3), "mb": round(m, 1), "ratio_to_floor": round(s / floor, 2)}
        for n, s, m in rows
    ]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
