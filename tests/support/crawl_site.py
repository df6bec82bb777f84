"""A local site for crawl tests: pages linked from each other, one proxy blocked.

Page ``i`` (``/page/i``) links to pages ``2i+1`` and ``2i+2``, so a crawl from ``/page/0`` reaches
every page. Unless told not to, the site blocks the first proxy a request comes through (named by
``crawl_squid.PROXY_HEADER``): that request and every later one through it are answered 403, as a
site answers an address it has banned, whichever proxy a crawl happens to lease first (the first
``blocks`` proxies, if told more). A request through no proxy at all gets 400. Every
request is recorded with the proxy it came through and the status it got.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.crawl_squid import PROXY_HEADER

_PAGE = re.compile(r"^/page/(\d+)$")


@dataclass(frozen=True, slots=True)
class Visit:
    proxy: str
    """The proxy's uid, "" for a request that came through none."""
    path: str
    status: int
    at: float = 0.0
    """When it was answered (``time.monotonic()``): a benchmark's crawl span."""


@dataclass
class Site:
    pages: int
    block: bool = True
    """Whether the site blocks the first proxy it sees."""
    latency: float = 0.0
    """Seconds each answer takes, as a real site's would."""
    proxied: bool = True
    """Whether a request through no proxy is refused."""
    blocked: str = ""
    """The uid of the proxy the site refuses: the first one it saw."""
    blocks: int = 1
    """How many proxies it refuses when it blocks: the first ones it sees."""
    refused: set[str] = field(default_factory=set)
    """Their uids."""
    port: int = 0
    visits: list[Visit] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/page/0"

    def answer(self, path: str, proxy: str) -> tuple[int, str]:
        found = _PAGE.match(path)
        with self._lock:
            self.blocked = self.blocked or (proxy if self.block else "")
            if self.block and proxy and len(self.refused) < self.blocks:
                self.refused.add(proxy)
        if not proxy and self.proxied:
            status, body = 400, "come through a proxy"
        elif proxy and proxy in self.refused:
            status, body = 403, "your address is blocked"
        elif found is None or int(found[1]) >= self.pages:
            status, body = 404, "no such page"
        else:
            page = int(found[1])
            links = "".join(
                f'<a href="/page/{n}">page {n}</a>\n'
                for n in (2 * page + 1, 2 * page + 2)
                if n < self.pages
            )
            status, body = 200, f"<h1>page {page}</h1>\n{links}"
        with self._lock:
            self.visits.append(Visit(proxy, path, status, time.monotonic()))
        return status, f"<html><body>{body}</body></html>"


class _Server(ThreadingHTTPServer):
    # A real site's listen backlog: the standard library's 5 overflows under a crawl's burst of
    # new connections (HTTP/1.0, one per request), and each dropped SYN costs the crawler a 1 s
    # retransmission: 400 pages at 32 at once took 16 s instead of 2.5 s (docs/benchmarks.md).
    request_queue_size = 128


@contextlib.contextmanager
def crawl_site(
    pages: int, *, block: bool = True, latency: float = 0.0, proxied: bool = True, blocks: int = 1
) -> Iterator[Site]:
    """The site on a free loopback port, served from a thread while the block runs."""
    site = Site(pages, block, latency, proxied, blocks=blocks)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(site.latency)  # this request's thread only
            status, body = site.answer(self.path, self.headers.get(PROXY_HEADER, ""))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # ``visits`` is the log

    server = _Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="crawl-site", daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
