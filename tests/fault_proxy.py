"""An HTTP proxy in front of the test S3 server that can stall: requests whose path holds `stall_on` get no
answer until the proxy stops (a remote that hangs mid-fetch); every other request is passed through as it
came, its Host header kept (boto3 signed it), so the S3 server checks the signature as if asked directly."""

from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse


class FaultProxy:
    def __init__(self, upstream: str, stall_on: str | None = None) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.stall_on = stall_on
        self.stalled = 0
        self._release = threading.Event()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.stall_on and proxy.stall_on in self.path:
                    proxy.stalled += 1
                    proxy._release.wait(60)  # no answer: the client's deadline decides
                    self.close_connection = True
                    return
                up = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                up.request(self.command, self.path, body=body, headers=headers)
                resp = up.getresponse()
                data = resp.read()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                up.close()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _relay  # noqa: N815

        return Handler
