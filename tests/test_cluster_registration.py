"""tutti.cluster.registration asks the metadata server why a node did not start; whatever the server
answers (nothing, garbage, a reply cut short), the answer is a value, never an exception on the path that
builds the one-line error (no Mooncake needed)."""
import http.server
import json
import socket
import threading

import pytest

from tutti.cluster import registration


class _Reply(http.server.BaseHTTPRequestHandler):
    body = b""
    length = None   # a Content-Length larger than the body: the reply is cut short

    def do_GET(self):  # noqa: N802 - the http.server API
        self.send_response(200)
        self.send_header("Content-Length", str(self.length or len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    made = []

    def start(body, length=None):
        handler = type("H", (_Reply,), {"body": body, "length": length})
        srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        made.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/metadata"

    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def test_a_registration_is_read_and_a_listener_is_alive(server):
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        meta = {"ip_or_host_name": "127.0.0.1", "rpc_port": ls.getsockname()[1]}
        got = registration.registered(server(json.dumps(meta).encode()), "127.0.0.1:1234", 2.0)
        assert got == meta
        assert registration.alive(got, 2.0)
    assert not registration.alive(got, 2.0)  # nothing listens there any more


@pytest.mark.parametrize("body,length", [
    (b"not json", None),
    (b"[1, 2]", None),
    (b'{"rpc_port": 1}', None),
    (b'{"ip_or_host_name": "h", "rpc_port": 1}', 4096),   # cut short: http.client.IncompleteRead
])
def test_what_is_not_a_registration_is_none(server, body, length):
    assert registration.registered(server(body, length), "127.0.0.1:1234", 2.0) is None


def test_no_server_or_another_kind_is_none():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert registration.registered(f"http://127.0.0.1:{port}/metadata", "x:1", 1.0) is None
    assert registration.registered("etcd://127.0.0.1:2379", "x:1", 1.0) is None
    assert not registration.alive({"ip_or_host_name": "127.0.0.1", "rpc_port": 99999}, 1.0)
