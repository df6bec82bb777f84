"""A real Kubernetes API server for tests: etcd and kube-apiserver (built from pinned modules,
``tests.support.peers``) on free loopback ports, in a temporary directory.

No scheduler, controller-manager or kubelet: nothing runs pods, and the tests play the kubelet
by patching a pod's status when they need it running. RBAC is on; the admin (a static token in
``system:masters``) sets things up, and the product runs as its ServiceAccounts with tokens the
server issues (TokenRequest API), so a verb missing from deploy/rbac fails for real.

``ApiServer`` offers: ``kubectl(...)`` (admin kubeconfig), ``kubeconfig_for(namespace, sa)``
(a kubeconfig carrying a minted ServiceAccount token), ``restart()`` (kube-apiserver only; etcd
keeps the data), ``compact()`` (etcd compaction at its current revision, through etcd's v3 HTTP
gateway), and ``namespace()`` (a fresh namespace per test).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from services.runtime.ports import free_port
from tests.support.peers import ROOT, peer

DEPLOY = ROOT / "deploy"
CRD = DEPLOY / "crd" / "proxies.yaml"
SYSTEM_NAMESPACE = "egress-proxies"
"""The kustomize base's namespace, where the ServiceAccounts live."""
START_TIMEOUT = 60.0
_counter = itertools.count(1)


def poll(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds (the
    synchronous twin of ``tests.support.waiting.until``, for session fixtures)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(every)


@dataclass
class ApiServer:
    root: Path
    etcd_url: str = ""
    port: int = 0
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    etcd: subprocess.Popen[bytes] | None = None
    apiserver: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters)."""
        return self.root / "admin.kubeconfig"

    @property
    def ca(self) -> Path:
        """kube-apiserver's self-signed serving certificate, which is its own CA."""
        return self.root / "certs" / "apiserver.crt"

    # ------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        (self.root / "certs").mkdir(parents=True, exist_ok=True)
        self._write_key()
        (self.root / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        etcd_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        log = self._log("etcd")
        self.etcd = subprocess.Popen(
            [
                str(peer("etcd")),
                "--name=test",
                f"--data-dir={self.root / 'etcd'}",
                "--unsafe-no-fsync",
                "--log-level=error",
                f"--listen-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert self.etcd.stdout is not None
        line = self.etcd.stdout.readline()
        if b"ready" not in line:
            raise AssertionError(f"etcd did not start: {line!r}\n{self._tail('etcd')}")
        self.port = free_port()
        self._start_apiserver()
        self.kubeconfig.write_text(self._kubeconfig("admin", self.token))

    def _start_apiserver(self) -> None:
        T = self.root
        self.apiserver = subprocess.Popen(
            [
                str(peer("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={T / 'certs'}",
                f"--token-auth-file={T / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={T / 'sa.key'}",
                f"--service-account-signing-key-file={T / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--v=0",
            ],
            stdout=self._log("kube-apiserver"),
            stderr=subprocess.STDOUT,
        )
        poll(self._ready, START_TIMEOUT, "kube-apiserver /readyz")

    def _ready(self) -> bool:
        assert self.apiserver is not None
        if self.apiserver.poll() is not None:
            code = self.apiserver.returncode
            raise AssertionError(f"kube-apiserver exited {code}:\n{self._tail('kube-apiserver')}")
        try:
            status, body = self.request("GET", "/readyz")
        except (OSError, urllib.error.URLError):
            return False
        return status == 200 and body == "ok"

    def restart(self) -> None:
        """Stop kube-apiserver (SIGTERM, as a rollout would; SIGKILL if it has not ended after
        10 s) and start it again on the same port; etcd, and so every object, stays."""
        assert self.apiserver is not None
        self.apiserver.terminate()
        try:
            # It drains open watches first, which may outlast a test's patience.
            self.apiserver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.apiserver.kill()
            self.apiserver.wait()
        self.restarts += 1
        self._start_apiserver()

    def stop(self) -> None:
        for process in (self.apiserver, self.etcd):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self.etcd is not None and self.etcd.stdout is not None:
            self.etcd.stdout.close()
        for log in self.logs:
            log.close()

    # ----------------------------------------------------------------------------- operations

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(peer("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def apply(
        self, obj: dict[str, Any] | str, *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        return self.kubectl("apply", "-f", "-", input=text, check=check)

    def get(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None:
        done = self.kubectl("get", resource, name, "-n", namespace, "-o", "json", check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr:
                return None
            raise AssertionError(done.stderr)
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    def namespace(self, prefix: str = "t") -> str:
        """A new namespace for one test."""
        name = f"{prefix}-{os.getpid()}-{next(_counter)}"
        self.kubectl("create", "namespace", name)
        return name

    def deploy_base(self) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -k deploy/``: the namespace, CRD, RBAC, ServiceAccounts, config and
        Deployments (which stay without pods: there is no controller-manager)."""
        done = self.kubectl("apply", "-k", str(DEPLOY))
        self.kubectl(
            "wait", "--for=condition=Established", "crd/proxies.crawl.example.com", "--timeout=60s"
        )
        return done

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for the ServiceAccount, minted by the server through the TokenRequest API."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        body["spec"] = {"expirationSeconds": seconds}  # type: ignore[assignment]
        status, text = self.request("POST", path, body)
        if status != 201:
            raise AssertionError(f"TokenRequest for {namespace}/{name}: {status} {text}")
        token: str = json.loads(text)["status"]["token"]
        return token

    def kubeconfig_for(self, namespace: str, name: str) -> Path:
        """A kubeconfig file that authenticates as the ServiceAccount ``namespace/name``."""
        path = self.root / f"{namespace}.{name}.{next(_counter)}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        path.write_text(self._kubeconfig(user, self.service_account_token(namespace, name)))
        return path

    def compact(self) -> int:
        """Compact etcd at its current revision (after one write of our own, so the revision is
        past anything a client saw); returns that revision."""
        self._etcd("/v3/kv/put", {"key": _b64("/egress-tests/compact"), "value": _b64("x")})
        revision = int(self._etcd("/v3/kv/range", {"key": _b64("/")})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, str]:
        """A call to the API as the admin."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # only for readiness, before the cert is read
        if self.ca.is_file():
            context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:  # it holds the response's socket until closed
                return exc.code, exc.read().decode()

    # -------------------------------------------------------------------------------- details

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def _kubeconfig(self, user: str, token: str) -> str:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        }
        return yaml.safe_dump(config)

    def _write_key(self) -> None:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - test-only
        from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: PLC0415

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        (self.root / "sa.key").write_bytes(pem)

    def _log(self, name: str) -> IO[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        self.logs.append(log)
        return log

    def _tail(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.is_file() else ""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@contextlib.contextmanager
def running_apiserver(root: Path) -> Iterator[ApiServer]:
    server = ApiServer(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
