"""What a burst of passes would make once and keep is made before it, and what it opened is closed
when work goes quiet (docs/performance.md, "Where the memory is"): against a local HTTP server
that counts the requests and connections it sees."""

from __future__ import annotations

import gc
import http.server
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from clef_operator import apiclient
from clef_operator.kube import Kube
from clef_operator.writes import EVENT_POSTERS


class KeepAlive:
    """Answers every request with an empty object on a kept-alive connection; counts requests and
    connections open."""

    def __init__(self) -> None:
        self.requests = 0
        self.open = 0
        self.closed = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the connection stays open for the next request

            def setup(self) -> None:
                super().setup()
                outer.open += 1

            def finish(self) -> None:
                super().finish()
                outer.open -= 1
                outer.closed.set()

            def do_GET(self) -> None:  # an empty object, kept alive
                outer.requests += 1
                self.send_response(200)
                for name, value in (("Content-Type", "application/json"), ("Content-Length", "2")):
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[KeepAlive]:
    s = KeepAlive()
    yield s
    s.server.shutdown()
    s.server.server_close()


def test_warm_up_builds_every_pass_method_and_starts_the_event_threads_without_a_request(
    server: KeepAlive,
) -> None:
    k = Kube(client.ApiClient(client.Configuration(host=server.url)))
    k.warm_up()
    assert server.requests == 0, "a warm-up sent a request"
    # What a first call would have built for good (~100 objects a method) is there already.
    gc.collect()
    before = len(gc.get_objects())
    for api_name, names in apiclient.PASS_METHODS.items():
        for name in names:
            with pytest.raises((TypeError, ValueError)):
                getattr(getattr(k, api_name), name)()
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert server.requests == 0
    posters = [t for t in threading.enumerate() if t.name.startswith("events")]
    assert len(posters) == EVENT_POSTERS


def test_idle_connections_are_closed_and_the_next_request_opens_one(server: KeepAlive) -> None:
    api = client.ApiClient(client.Configuration(host=server.url))
    core = client.CoreV1Api(api)
    core.read_namespaced_service("s", "ns")
    assert server.open == 1, "the connection is kept for the next request"
    assert apiclient.close_idle_connections(api) == 1
    assert server.closed.wait(10), "the server never saw the connection close"
    assert server.open == 0
    assert apiclient.close_idle_connections(api) == 0
    core.read_namespaced_service("s", "ns")
    assert (server.requests, server.open) == (2, 1)


def test_a_client_without_urllib3_pools_closes_nothing() -> None:
    assert apiclient.close_idle_connections(object()) == 0  # type: ignore[arg-type]


def test_the_newest_cached_model_is_read_from_its_packed_body() -> None:
    """The cache keeps a ClefModel packed (`observed.Packed`, a Mapping that is no dict): its
    metadata is read without an ABC check and without mistaking it for a typed object."""
    k = Kube(client.ApiClient(client.Configuration(host="http://127.0.0.1:1")))
    table = k.cache["clefmodels"]
    for version, replicas in (("12", 2), ("9", 1)):
        meta = {"name": "m", "namespace": "ns", "uid": f"u{version}", "resourceVersion": version}
        table.put({"metadata": meta, "spec": {"replicas": replicas}})
    read = k.read_model("ns", "m")
    assert read is not None and read["spec"] == {"replicas": 2}
    assert k.read_model("ns", "other") is None
