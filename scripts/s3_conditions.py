"""Measure the S3 conditional writes kvgraft's remote format could build on (docs/remote-format.md).

    python scripts/s3_conditions.py                     # a throwaway SeaweedFS on loopback
    python scripts/s3_conditions.py --endpoint-url URL --bucket B   # any S3 server you configured

1. A conditional put (If-None-Match: *) over an existing key: refused?
2. Concurrent If-None-Match: * puts of one new key from N threads, R rounds: how many succeed per round
   (1 is correct; more means two writers both believed they created it).
3. If-Match on an ETag: a stale ETag refused? Then N threads each add K increments to one counter
   object by read / If-Match put / retry: the final count against N*K (lower means lost updates).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packaging"))

from botocore.exceptions import ClientError  # noqa: E402

from kvgraft.app.lab.local_s3 import LocalS3  # noqa: E402


def refused(exc: ClientError) -> bool:
    code = exc.response.get("Error", {}).get("Code")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


def measure(make_client, bucket: str, threads: int, rounds: int, increments: int) -> dict:
    c = make_client()
    out = {}
    key = f"cond/{uuid.uuid4().hex}"
    c.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    try:
        c.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
        out["if_none_match_over_existing"] = "accepted (overwrote)"
    except ClientError as exc:
        out["if_none_match_over_existing"] = "refused" if refused(exc) else f"error {exc}"
    body = c.get_object(Bucket=bucket, Key=key)["Body"].read()
    out["existing_kept"] = body == b"first"

    clients = [make_client() for _ in range(threads)]
    winners = []
    for _ in range(rounds):
        key = f"cond/race-{uuid.uuid4().hex}"
        ok = []
        barrier = threading.Barrier(threads)

        def put(i, key=key, ok=ok, barrier=barrier):
            barrier.wait()
            try:
                clients[i].put_object(Bucket=bucket, Key=key, Body=f"writer {i}".encode(), IfNoneMatch="*")
                ok.append(i)
            except ClientError as exc:
                if not refused(exc):
                    ok.append(("error", str(exc)))

        ts = [threading.Thread(target=put, args=(i,)) for i in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        winners.append(len(ok))
    out["concurrent_if_none_match"] = {"threads": threads, "rounds": rounds, "successes_per_round": winners}

    key = f"cond/counter-{uuid.uuid4().hex}"
    first = c.put_object(Bucket=bucket, Key=key, Body=b"0", IfNoneMatch="*")
    try:
        c.put_object(Bucket=bucket, Key=key, Body=b"1", IfMatch='"0000000000000000000000000000dead"')
        out["if_match_stale"] = "accepted (overwrote)"
    except ClientError as exc:
        out["if_match_stale"] = "refused" if refused(exc) else f"error {exc}"
    out["if_match_etag_after_put"] = first.get("ETag")
    conflicts = [0] * threads

    def bump(i):
        cl = clients[i]
        for _ in range(increments):
            while True:
                got = cl.get_object(Bucket=bucket, Key=key)
                n = int(got["Body"].read())
                try:
                    cl.put_object(Bucket=bucket, Key=key, Body=str(n + 1).encode(), IfMatch=got["ETag"])
                    break
                except ClientError as exc:
                    if not refused(exc):
                        raise
                    conflicts[i] += 1

    ts = [threading.Thread(target=bump, args=(i,)) for i in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    final = int(c.get_object(Bucket=bucket, Key=key)["Body"].read())
    out["if_match_counter"] = {
        "threads": threads,
        "increments_each": increments,
        "expected": threads * increments,
        "final": final,
        "conflicts_retried": sum(conflicts),
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint-url")
    ap.add_argument("--bucket", default="kvgraft-conditions")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--increments", type=int, default=10)
    args = ap.parse_args()
    if args.endpoint_url:
        import boto3

        res = measure(
            lambda: boto3.client("s3", endpoint_url=args.endpoint_url),
            args.bucket,
            args.threads,
            args.rounds,
            args.increments,
        )
        res["server"] = args.endpoint_url
    else:
        with LocalS3() as s3:
            s3.make_bucket(args.bucket)
            res = measure(s3.client, args.bucket, args.threads, args.rounds, args.increments)
            res["server"] = "SeaweedFS " + s3.version()
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
