"""A local site, over HTTP and HTTPS, that sees where each request leaves from.

Each local provider of a test leaves from its own loopback address (``outgoingAddress``), so the
address a request reaches the site from names the egress it took, as a real site sees a proxy's
public address: no header of the proxies' is needed. The site records every visit and answers
with the address it saw (and a POST with its body's length), one request per connection.
``/blocked`` is answered 403 to the first address that asks for it and to every later request
from there, as a site answers an address it has banned; 200 to others.

The HTTPS side serves a certificate for ``127.0.0.1`` from a CA made for the test (trustme);
``ca_file`` is that CA for clients that take a file, ``spki`` its key's pin for a browser.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

BLOCKED = "/blocked"
MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Visit:
    address: str
    """The address the request came from: the egress it took."""
    scheme: str
    path: str
    status: int
    agent: str


@dataclass
class EgressSite:
    http_port: int = 0
    https_port: int = 0
    ca_file: Path = Path()
    spki: str = ""
    """The base64 SHA-256 of the certificate's public key (Chromium's
    ``--ignore-certificate-errors-spki-list`` trusts exactly that key)."""
    banned: str = ""
    visits: list[Visit] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str, *, tls: bool = False) -> str:
        if tls:
            return f"https://127.0.0.1:{self.https_port}{path}"
        return f"http://127.0.0.1:{self.http_port}{path}"

    def answer(self, address: str, scheme: str, path: str, agent: str) -> int:
        with self._lock:
            if path == BLOCKED and not self.banned:
                self.banned = address
            status = 403 if path == BLOCKED and address == self.banned else 200
            self.visits.append(Visit(address, scheme, path, status, agent))
            return status

    def seen(self, path: str) -> list[Visit]:
        with self._lock:
            return [v for v in self.visits if v.path == path]


def _handler(site: EgressSite, scheme: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 20

        def setup(self) -> None:
            super().setup()
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()

        def do_GET(self) -> None:
            self._answer("")

        def do_POST(self) -> None:
            """A body sent through a proxy arrives whole: the answer says how long it was."""
            length = int(self.headers.get("Content-Length") or 0)
            received = self.rfile.read(length) if 0 < length <= MAX_BODY else b""
            self._answer(f" with {len(received)} bytes")

        def _answer(self, what: str) -> None:
            address = self.client_address[0]
            agent = self.headers.get("User-Agent", "")
            status = site.answer(address, scheme, self.path, agent)
            body = f"{scheme} {self.path}{what} seen from {address}\n".encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            # One request per connection: a tunnel to the site ends with its answer, so the
            # gateway's lease is idle (and let go) as soon as the client is done.
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    return Handler


@contextmanager
def _serve(server: ThreadingHTTPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def egress_site(directory: Path) -> Iterator[EgressSite]:
    """The site on two free ports of 127.0.0.1, plain and TLS; ``directory`` keeps the CA."""
    site = EgressSite()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    site.ca_file = directory / "site-ca.pem"
    ca.cert_pem.write_to_path(str(site.ca_file))
    key = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).public_key()
    der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    site.spki = base64.b64encode(hashlib.sha256(der).digest()).decode()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    plain = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site, "http"))
    secure = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site, "https"))
    # The handshake in the handler's thread, not in the accepting one: a slow client stalls
    # only its own connection.
    secure.socket = context.wrap_socket(
        secure.socket, server_side=True, do_handshake_on_connect=False
    )
    with ExitStack() as stack:
        site.http_port = stack.enter_context(_serve(plain))
        site.https_port = stack.enter_context(_serve(secure))
        yield site
