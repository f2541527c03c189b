#!/usr/bin/env python3
"""Runs kwok behind a small pass-through proxy to the API server that makes its watches work.

Why: kwok v0.8.0 opens every watch at resourceVersion=0 with allowWatchBookmarks=true. The
API server (WatchList feature on, the default since 1.34) treats that as a streaming list
(sendInitialEvents), which needs etcd's RequestWatchProgress; Debian's etcd 3.4.23 lacks it
(3.4.31+ has it), so every such watch fails at once. kwok's informers then only see changes
when they re-list, after a backoff that grows to 30-60 s: pods would become Running, or vanish
when deleted, up to a minute late. Dropping allowWatchBookmarks from those requests gives the
classic watch from 0 (the current objects, then every change), which kwok handles. Nothing
else is changed. fake-nodes.sh uses this only when the API server shows the problem; running
kube-apiserver with --feature-gates=WatchList=false (or a newer etcd) makes it unnecessary.

    watch-proxy.py PORT SERVER CA CERT KEY -- COMMAND...

Listens on 127.0.0.1:PORT (plain HTTP, no authentication: the local cluster's admin
credentials CERT/KEY are used upstream, like `kubectl proxy`), runs COMMAND (kwok, given a
kubeconfig for http://127.0.0.1:PORT), and exits with it. Standard library only.
"""

from __future__ import annotations

import http.client
import http.server
import signal
import ssl
import subprocess
import sys
import threading
from urllib.parse import parse_qsl, urlencode, urlsplit

# Hop-by-hop headers (RFC 9110 7.6.1) and Host: never forwarded.
HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
       "upgrade", "host"}


def rewrite(target: str) -> str:
    """The request target, with allowWatchBookmarks dropped from watches at resourceVersion 0."""
    parts = urlsplit(target)
    query = parse_qsl(parts.query, keep_blank_values=True)
    q = dict(query)
    streaming_list = (
        q.get("watch") in ("true", "1") and q.get("resourceVersion", "") in ("", "0")
        and q.get("allowWatchBookmarks") in ("true", "1") and "sendInitialEvents" not in q
    )
    if not streaming_list:
        return target
    kept = [(k, v) for k, v in query if k != "allowWatchBookmarks"]
    return f"{parts.path}?{urlencode(kept)}"


class Proxy(http.server.BaseHTTPRequestHandler):
    """One instance per client connection, with its own upstream connection kept alive."""

    protocol_version = "HTTP/1.1"
    upstream_host: str
    upstream_port: int
    tls: ssl.SSLContext
    _conn: http.client.HTTPSConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown kwok's own log

    def _connection(self) -> http.client.HTTPSConnection:
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(
                self.upstream_host, self.upstream_port, context=self.tls, timeout=None)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        target = rewrite(self.path)
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
            try:
                conn = self._connection()
                conn.request(self.command, target, body=body, headers=headers)
                response = conn.getresponse()
                break
            except (OSError, http.client.HTTPException):
                self._drop_connection()
                if attempt == 2:
                    self.send_error(502, "API server unreachable")
                    return
        try:
            self._relay(response)
        except OSError:  # the client went away (a cancelled watch): the stream is abandoned
            self._drop_connection()
            self.close_connection = True
            return
        if response.will_close:
            self._drop_connection()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response_only(response.status, response.reason)
        for k, v in response.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        streamed = response.getheader("Content-Length") is None and self.command != "HEAD" \
            and response.status not in (204, 304)
        if streamed:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not streamed:
            self.wfile.write(response.read())
            self.wfile.flush()
            return
        while data := response.read1(64 * 1024):  # a watch: pass each event on as it comes
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward


def main(argv: list[str]) -> int:
    if len(argv) < 7 or argv[5] != "--":
        sys.exit(__doc__)
    port, server, ca, cert, key = argv[:5]
    command = argv[6:]
    upstream = urlsplit(server)
    Proxy.upstream_host, Proxy.upstream_port = upstream.hostname or "", upstream.port or 443
    Proxy.tls = ssl.create_default_context(cafile=ca)
    Proxy.tls.load_cert_chain(cert, key)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Proxy)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    signal.signal(signal.SIGINT, lambda *_: child.terminate())
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
