"""What every peer server shares (llmkiln.bench.peer_server), on a real process: a stand-in OpenAI server (a few
lines of http.server in a child Python) started on a free port under a reaper, ready only once its health path and
/v1/models say so, stopped with its process group; a busy port refused before anything starts; a process that dies
before it is ready reported with its log."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmkiln.bench.peer_server import PeerServer, get_json
from llmkiln.dynamo.launcher import LaunchFailed, Proc
from llmkiln.errors import BadInput
from llmkiln.serve.ports import free_ports

STAND_IN = textwrap.dedent(
    """
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port, model, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    if model == "die":
        print("stand-in: no model to serve", flush=True)
        sys.exit(3)
    t0 = time.monotonic()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            up = time.monotonic() - t0 > delay
            if self.path == "/health":
                code, body = (200 if up else 503), {}
            elif self.path == "/v1/models":
                code, body = 200, {"data": [{"id": model}] if up else []}
            else:
                code, body = 404, {}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    print("stand-in: serving", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@dataclass(frozen=True)
class Opts:
    host: str
    port: int
    served_model_name: str


class StandIn(PeerServer):
    display = "stand-in"
    reaper_name = "stand-in"
    health_path = "/health"
    poll_s = 0.05
    ready_timeout_s = 30.0

    def __init__(self, tmp: Path, model: str = "m", delay: float = 0.3, port: int | None = None) -> None:
        self.opts = Opts("127.0.0.1", port or free_ports(1, "127.0.0.1")[0], model)
        self.echo = None
        self.proc = Proc(
            "stand-in",
            [sys.executable, "-c", STAND_IN, str(self.opts.port), model, str(delay)],
            dict(os.environ),
            tmp / "stand-in.log",
        )
        self.reaper = None
        self.ready_s = None
        self.starts = 0

    def _starting(self) -> None:
        self.starts += 1


def test_a_peer_is_ready_once_it_serves_its_model_and_stops_with_its_group(tmp_path):
    with StandIn(tmp_path) as s:
        assert s.starts == 1 and s.ready_s is not None and s.ready_s >= 0.2  # not before the stand-in is up
        assert s.url == f"http://127.0.0.1:{s.opts.port}/v1" and s.model == "m"
        assert get_json(s.root_url + "/health")[0] == 200 and s.ready()
        pid = s.proc.popen.pid
    assert not s.proc.alive() and s.reaper is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_listing_another_model_is_not_ready(tmp_path):
    s = StandIn(tmp_path, model="other")
    s.opts = Opts(s.opts.host, s.opts.port, "m")  # asks for m; the process serves "other"
    s.start()
    try:
        with pytest.raises(LaunchFailed, match="not ready after 1 s"):
            s.wait_ready(1.0)
    finally:
        s.stop()


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        s = StandIn(tmp_path, port=busy.getsockname()[1])
        with pytest.raises(BadInput, match="stand-in port .* is already in use"):
            s.start()
        assert s.starts == 0 and s.proc.popen is None and s.reaper is None


def test_a_peer_that_dies_before_it_is_ready_is_reported_with_its_log(tmp_path):
    with pytest.raises(LaunchFailed, match="(?s)exited before it was ready .*exit code 3.*no model to serve"):
        with StandIn(tmp_path, model="die"):
            pass
