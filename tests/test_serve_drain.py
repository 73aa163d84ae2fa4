"""``codekv serve`` when its process is told to stop, and when its clients leave: SIGTERM drains
what is in flight (streamed or not) while refusing new requests with 503; a client that closes
its connection, while its request runs or waits in the queue, stops its work. Real server
processes on a tiny random-weight model, real sockets."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import pytest
from fixtures.needs import require
from fixtures.servers import TINY, ServeProcess

httpx = require("httpx", "httpx is not installed (the 'serve' extra)")
require("uvicorn", "uvicorn is not installed (the 'serve' extra)")



def body(lead: str, max_tokens: int, **fields) -> dict:
    return {"model": TINY, "max_tokens": max_tokens, "temperature": 0, **fields,
            "messages": [{"role": "system", "content": "You answer briefly."},
                         {"role": "user", "content": f"{lead} Tell me about Python."}]}


def endless(lead: str) -> dict:
    """A request that decodes 900 tokens whatever the random weights pick: its reply is forced
    (``codekv.continuation``), so no end token cuts it short before its client leaves."""
    return body(lead, 900, codekv={"continuation": "Python is a language. " * 300})


def health(server) -> httpx.Response:
    return httpx.get(server.url + "/health", timeout=10)


def until(condition, seconds: float, what: str) -> float:
    """Seconds until ``condition()`` holds (polled), failing after ``seconds``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.02)
    return time.monotonic() - start


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text,
                                                    re.MULTILINE))


def sent(server, request: dict) -> socket.socket:
    """A connection that has sent ``request`` (a chat completion) and reads nothing: closing
    it is the client leaving."""
    data = json.dumps(request).encode()
    connection = socket.create_connection(("127.0.0.1", server.port))
    connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(data), data))
    return connection


def test_sigterm_drains_what_is_in_flight_and_refuses_what_comes(tiny_model_dir, tmp_path):
    server = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY],
                          tmp_path / "home").wait()
    results: dict = {}

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                          json=body("Streamed.", 300, stream=True)) as response:
            results["stream_status"] = response.status_code
            results["stream"] = [line for line in response.iter_lines()
                                 if line.startswith("data:")]

    def plain() -> None:
        results["plain"] = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                                      json=body("Not streamed.", 60))

    threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
    try:
        threads[0].start()
        until(lambda: health(server).json()["busy"], 60, "the stream runs")
        threads[1].start()
        until(lambda: health(server).json()["waiting"] == 1, 60, "the second request waits")
        server.process.send_signal(signal.SIGTERM)
        until(lambda: health(server).status_code == 503, 10, "/health says draining")
        assert health(server).json()["status"] == "draining"
        refused = httpx.post(server.url + "/v1/chat/completions", json=body("Late.", 4),
                             timeout=30)
        assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "server_shutting_down"
        assert all(thread.is_alive() for thread in threads)  # both still in flight
        for thread in threads:
            thread.join(timeout=120)
        # Drained, uvicorn shuts down and raises the signal again: the process ends by it.
        assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        server.stop()
    assert results["stream_status"] == 200 and results["stream"][-1] == "data: [DONE]"
    last = json.loads(results["stream"][-2][5:])
    assert last["choices"][0]["finish_reason"] in ("length", "stop")
    assert results["plain"].status_code == 200
    assert results["plain"].json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert "Traceback" not in server.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    process = ServeProcess(["--model", str(tiny_model_dir), "--served-model-name", TINY,
                            "--max-queue", "4"], tmp_path_factory.mktemp("serve-drain")).wait()
    yield process
    process.stop()


def idle(server) -> bool:
    state = health(server).json()
    return not state["busy"] and state["waiting"] == 0


def test_a_client_that_leaves_stops_its_request_between_decode_steps(server):
    """900 tokens take the tiny model seconds: once the client hangs up, the model is idle
    within a few decode steps, the reply counted cut short and never served."""
    cancelled, served = (metric(server, "codekv_cancelled_requests"),
                         metric(server, "codekv_requests_total"))
    connection = sent(server, endless("Go on and on."))
    until(lambda: health(server).json()["busy"], 60, "the request runs")
    time.sleep(0.5)  # decoding
    connection.close()
    waited = until(lambda: idle(server), 5, "the model is idle after the client left")
    assert metric(server, "codekv_cancelled_requests") == cancelled + 1
    assert metric(server, "codekv_requests_total") == served
    print(f"idle {waited:.2f} s after the client left")
    # The server goes on: the next request is answered.
    assert httpx.post(server.url + "/v1/chat/completions", json=body("Next.", 4),
                      timeout=60).status_code == 200


def test_queued_requests_whose_clients_left_are_dropped_before_prefill(server):
    cancelled, served = (metric(server, "codekv_cancelled_requests"),
                         metric(server, "codekv_requests_total"))
    running = sent(server, endless("The one running."))
    until(lambda: health(server).json()["busy"], 60, "the first request runs")
    queued = [sent(server, endless(f"Queued {n}.")) for n in range(3)]
    until(lambda: health(server).json()["waiting"] == 3, 30, "three requests wait")
    for connection in queued:
        connection.close()
    time.sleep(0.3)
    running.close()
    waited = until(lambda: idle(server), 5, "the model is idle after every client left")
    assert metric(server, "codekv_cancelled_requests") == cancelled + 4
    assert metric(server, "codekv_requests_total") == served
    print(f"idle {waited:.2f} s after four clients left")
