"""kvx.vllm.proxy's bounds (docs/security.md, "Bounded everything"; issue 36 finding 11), without
vLLM: the proxy in this process (and once as `python -m kvx.vllm.proxy`) in front of fake P and
D servers on 127.0.0.1 that answer as vLLM's /v1/completions does for what the proxy reads.
Requests are held and let go with events; deadlines are small configured bounds, and a test
asserts on time only that a deadline was not cut short (a lower bound) or was met at all (an
upper bound ten times over)."""
import http.client
import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from kvx.vllm.proxy import Proxy

WAIT_S = 10  # a client's patience: any answer the test expects comes well before
POLL_S = 0.01  # how often the servers look for shutdown(): teardown takes this, not 0.5 s
PARAMS = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "p"}


class Fake:
    """A fake P or D: each POST's JSON body is kept in `requests` and answered by
    `behave(handler, body)` (default: P's or D's answer of vLLM, `role`)."""

    def __init__(self, role, behave=None):
        fake = self
        self.requests = []
        self.arrived = threading.Event()  # a request came
        self.go = threading.Event()       # what waits in behave may go on
        self.behave = behave or (answer_p if role == "p" else answer_d)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                fake.arrived.set()
                fake.behave(self, body)

            def log_message(self, format, *args):
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.fake = self  # for behave
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(POLL_S,), daemon=True).start()

    def close(self):
        self.go.set()
        self.server.shutdown()
        self.server.server_close()


def reply(handler, status, data, content_type="application/json"):
    data = data if isinstance(data, bytes) else json.dumps(data).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    if handler.headers.get("Connection") == "close":  # as vLLM's server (uvicorn) answers
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(data)


def answer_p(handler, body):
    reply(handler, 200, {"choices": [{"text": "x"}], "kv_transfer_params": PARAMS})


def answer_d(handler, body):
    reply(handler, 200, {"choices": [{"text": "decoded"}]})


def held_at_d(handler, body):
    """D's answer once the test lets it go (`go`)."""
    handler.server.fake.go.wait(WAIT_S)
    answer_d(handler, body)


def trickle(handler, body):
    """Headers, then one byte of a long body every 50 ms (never quiet for long) until `go`."""
    handler.send_response(200)
    handler.send_header("Content-Length", "1000000")
    handler.end_headers()
    fake = handler.server.fake
    try:
        while not fake.go.wait(0.05):
            handler.wfile.write(b" ")
    except OSError:
        pass  # the proxy gave up and closed


@pytest.fixture
def start():
    """start(p_behave=None, d_behave=None, **bounds) -> (proxy's port, P, D)."""
    made = []

    def run(p_behave=None, d_behave=None, **bounds):
        p, d = Fake("p", p_behave), Fake("d", d_behave)
        http = Proxy([p.url], [d.url], **bounds).serve("127.0.0.1", 0)
        threading.Thread(target=http.serve_forever, args=(POLL_S,), daemon=True).start()
        made.extend([p, d, http])
        return http.server_address[1], p, d

    yield run
    for thing in made:
        if isinstance(thing, Fake):
            thing.close()
        else:
            thing.shutdown()
            thing.server_close()


def head(body_length=None, *lines, path="/v1/completions"):
    text = "POST %s HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n" % path
    if body_length is not None:
        text += "Content-Length: %d\r\n" % body_length
    return (text + "".join(line + "\r\n" for line in lines) + "\r\n").encode()


def request(body, *lines):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return head(len(data), *lines) + data


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def read_answer(sock):
    """(status, headers, text) of the next answer on `sock`."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.headers, response.read().decode()


def exchange(port, data):
    with connect(port) as sock:
        sock.sendall(data)
        return read_answer(sock)


def until_served(port, data):
    """The answer to `data` once the proxy has let go of what an earlier client held: the
    slot or the bytes come back after that client has its answer, so a 503 is asked again
    (bounded by WAIT_S)."""
    end = time.monotonic() + WAIT_S
    while True:
        status, headers, text = exchange(port, data)
        if status != 503 or time.monotonic() > end:
            return status, text
        time.sleep(0.02)


def test_a_request_goes_to_p_then_to_d_with_ps_params(start):
    port, p, d = start()
    status, _, text = exchange(port, request({"prompt": "hi", "max_tokens": 5}))
    assert (status, json.loads(text)) == (200, {"choices": [{"text": "decoded"}]})
    assert p.requests[0]["max_tokens"] == 1
    assert p.requests[0]["kv_transfer_params"] == {"do_remote_decode": True}
    assert d.requests == [{"prompt": "hi", "max_tokens": 5, "kv_transfer_params": PARAMS}]


BAD_LENGTHS = [
    # rule, header lines (no body is ever sent), status, part of the answer
    ("over_max_body", ["Content-Length: 1001"], 413,
     "body of 1001 bytes is larger than the proxy's limit of 1000 bytes (--max-body)"),
    ("a_gigabyte_and_a_half", ["Content-Length: 1500000000"], 413, "body of 1500000000 bytes"),
    ("over_max_body_asking_100_continue", ["Content-Length: 1001", "Expect: 100-continue"], 413,
     "body of 1001 bytes"),
    ("missing", [], 411, "a POST needs a Content-Length"),
    ("chunked", ["Transfer-Encoding: chunked"], 411,
     "Transfer-Encoding: chunked is not accepted: send the body with a Content-Length"),
    ("not_a_number", ["Content-Length: abc"], 400, "Content-Length: 'abc' is not a byte count"),
    ("negative", ["Content-Length: -1"], 400, "Content-Length: '-1' is not a byte count"),
    ("not_ascii_digits", ["Content-Length: \u00b2"], 400, "is not a byte count"),
    ("given_twice", ["Content-Length: 5", "Content-Length: 6"], 400,
     "Content-Length: given 2 times"),
]


@pytest.mark.parametrize("rule,lines,status,part", BAD_LENGTHS, ids=[c[0] for c in BAD_LENGTHS])
def test_a_body_is_refused_by_its_announced_length_without_reading_it(start, rule, lines,
                                                                       status, part):
    """Answered from the head alone: the client sends no body, and its answer comes (a proxy
    that read on would wait for the body past the client's patience); nothing reaches P."""
    port, p, _ = start(max_body=1000, client_timeout_s=60)
    with connect(port) as sock:
        sock.sendall(head(None, *lines))
        data = b""
        while True:  # to the proxy's half-close: the one answer (never a 100 Continue first)
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    lines_in, _, text = data.decode().partition("\r\n\r\n")
    assert lines_in.startswith("HTTP/1.1 %d " % status) and part in text, (rule, data)
    assert "\r\nConnection: close" in lines_in
    assert p.requests == []


def test_a_body_of_max_body_is_served_and_read_to_its_end_only(start):
    """A body of exactly --max-body is served; a second request right behind it on the same
    connection is read as a request (the proxy stopped at the first body's end)."""
    port, _, d = start(max_body=1000)
    first = {"prompt": ""}
    first["prompt"] = "a" * (1000 - len(json.dumps(first).encode()))
    with connect(port) as sock:
        sock.sendall(request(first) + request({"prompt": "second"}))
        assert read_answer(sock)[0] == 200
        assert read_answer(sock)[0] == 200
    assert [r["prompt"] for r in d.requests] == [first["prompt"], "second"]


def nested(depth):
    """A JSON object nested `depth` deep: the object, then lists."""
    value = 0
    for _ in range(depth - 1):
        value = [value]
    return {"prompt": "a", "x": value}


BAD_JSON = [
    # rule, body, part of the 400's text
    ("deeper_than_the_parser", b"[" * 100000,
     "bad JSON body: nested deeper than the parser allows; the limit is 128 levels"),
    ("deeper_than_the_parser_in_an_object", b'{"prompt": ' + b"[" * 100000,
     "nested deeper than the parser allows"),
    ("deeper_than_max_depth", json.dumps(nested(129)).encode(),
     "bad JSON body: nested deeper than 128 levels (--max-depth)"),
    ("not_an_object", b"[1]", "bad JSON body: not an object"),
    ("not_json", b"nope", "bad JSON body: Expecting value"),
]


def test_bad_json_is_answered_400_and_the_proxy_serves_on(start):
    """However deep, a body is answered (RecursionError is the parser's answer to depth);
    exactly --max-depth is served, and so is the next request."""
    port, p, _ = start()
    for rule, body, part in BAD_JSON:
        status, _, text = exchange(port, request(body))
        assert status == 400 and part in text, (rule, status, text)
    assert p.requests == []
    assert exchange(port, request(nested(128)))[0] == 200
    assert exchange(port, request({"prompt": "next"}))[0] == 200


def test_clients_beyond_max_clients_hear_503_at_once(start):
    """Two clients in flight (held at D) take both slots; a third is answered 503 by the
    accepting thread at once, and is served once the two are done."""
    port, _, d = start(d_behave=held_at_d, max_clients=2, client_timeout_s=60)
    held = [connect(port), connect(port)]
    for sock in held:
        sock.sendall(request({"prompt": "held"}))
    while len(d.requests) < 2:  # both at D
        assert d.arrived.wait(WAIT_S)
        d.arrived.clear()
    status, headers, text = exchange(port, request({"prompt": "third"}))
    assert status == 503 and "the proxy serves 2 clients already (--max-clients)" in text
    d.go.set()
    for sock in held:
        assert read_answer(sock)[0] == 200
        sock.close()
    assert until_served(port, request({"prompt": "third"}))[0] == 200


def slow_send(sock, data, stop):
    """Send `data` a byte every 50 ms: never quiet for the proxy's 1 s."""
    try:
        for i in range(len(data)):
            if stop.wait(0.05):
                return
            sock.send(data[i:i + 1])
    except OSError:
        pass  # the proxy closed


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_slow_client_is_cut_at_its_total_deadline(start, where):
    """A client that sends a byte every 50 ms holds its thread no longer than
    --client-timeout (1 s) in all, and hears 408; with --max-clients 1, the next client is
    then served."""
    port, p, _ = start(max_clients=1, client_timeout_s=1)
    data = request({"prompt": "slow " * 100})
    split = len(data) - 400 if where == "body" else 0
    stop = threading.Event()
    with connect(port) as sock:
        began = time.monotonic()
        sock.sendall(data[:split])
        sender = threading.Thread(target=slow_send, args=(sock, data[split:], stop))
        sender.start()
        try:
            status, _, text = read_answer(sock)
        finally:
            stop.set()
            sender.join()
        assert time.monotonic() - began >= 1
    assert status == 408 and "request not received whole within 1 s (--client-timeout)" in text
    assert p.requests == []
    assert until_served(port, request({"prompt": "next"}))[0] == 200


def test_an_idle_connection_is_closed_at_the_client_deadline(start):
    port, _, _ = start(client_timeout_s=1)
    with connect(port) as sock:
        began = time.monotonic()
        assert sock.recv(1) == b""  # closed, nothing said: no request was begun
        assert time.monotonic() - began >= 1
        sock.close()
    with connect(port) as sock:  # and after an answer, for the next request
        sock.sendall(request({"prompt": "one"}))
        assert read_answer(sock)[0] == 200
        assert sock.recv(1) == b""


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_trickling_server_ends_at_the_requests_total_deadline(start, role):
    """P or D answering a byte every 50 ms (never quiet for long) is cut at --timeout (1 s)
    for the whole request, and the client hears a 504 naming that server."""
    p_behave, d_behave = (trickle, None) if role == "prefill" else (None, trickle)
    port, p, d = start(p_behave, d_behave, timeout_s=1)
    began = time.monotonic()
    status, _, text = exchange(port, request({"prompt": "hi"}))
    elapsed = time.monotonic() - began
    url = (p if role == "prefill" else d).url
    assert status == 504 and ("%s server %s/v1/completions did not answer within the request's "
                              "1 s (--timeout)" % (role, url)) in text, text
    assert 1 <= elapsed < WAIT_S


def answer_too_much(handler, body):
    reply(handler, 200, b"x" * 1001, "text/plain")


def break_off(handler, body):
    handler.send_response(200)
    handler.send_header("Content-Length", "100")
    handler.end_headers()
    handler.wfile.write(b"only ten..")
    handler.close_connection = True


def dead_url():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


def test_what_a_server_answers_is_bounded_and_a_fault_names_it(start):
    """An answer of D over --max-body, or one cut short, is a 502 naming D; so is a P that
    cannot be reached (as before)."""
    port, _, d = start(d_behave=answer_too_much, max_body=1000)
    status, _, text = exchange(port, request({"prompt": "hi"}))
    assert status == 502 and "decode server %s/v1/completions answered more than 1000 bytes " \
        "(--max-body)" % d.url in text
    d.behave = break_off
    status, _, text = exchange(port, request({"prompt": "hi"}))
    assert status == 502 and "decode server %s/v1/completions broke off its answer: " \
        "IncompleteRead" % d.url in text
    dead = dead_url()
    http = Proxy([dead], [dead]).serve("127.0.0.1", 0)
    threading.Thread(target=http.serve_forever, args=(POLL_S,), daemon=True).start()
    try:
        status, _, text = exchange(http.server_address[1], request({"prompt": "hi"}))
        assert status == 502 and "cannot reach %s/v1/completions" % dead in text
    finally:
        http.shutdown()
        http.server_close()


def test_bodies_held_at_once_stay_within_max_buffered(start):
    """A request's body counts from before it is read until its answer is sent, parsed copy
    and P's and D's answers included: the one that would pass --max-buffered is answered 503,
    unread, and is served once the first is done; one that could never fit is a 413."""
    port, p, d = start(d_behave=held_at_d, max_body=2000, max_buffered=6000)
    first = request({"prompt": "a" * 1500})  # 1500 bytes, 3 times that parsed and sent on
    second = request({"prompt": "b" * 1600})
    with connect(port) as sock:
        sock.sendall(first)
        assert d.arrived.wait(WAIT_S)
        status, _, text = exchange(port, second)
        assert status == 503 and "the proxy's bodies take 6000 bytes already " \
            "(--max-buffered)" in text
        d.go.set()
        assert read_answer(sock)[0] == 200
    assert until_served(port, second)[0] == 200
    assert [r["prompt"][0] for r in p.requests] == ["a", "b"]
    ids = json.dumps({"prompt": [0] * 600}).encode()  # 80 bytes a value parsed
    status, _, text = exchange(port, request(ids))
    assert status == 413 and "body of %d bytes would take" % len(ids) in text
    assert "more than the proxy's 6000 (--max-buffered)" in text


def test_the_command_line_sets_every_bound(tmp_path):
    """python -m kvx.vllm.proxy: each bound is an option with its default in --help, a bad
    value is refused, and the options reach the proxy."""
    help_text = subprocess.run([sys.executable, "-m", "kvx.vllm.proxy", "--help"],
                               capture_output=True, text=True, timeout=WAIT_S).stdout
    help_text = " ".join(help_text.split())
    for option, default in [("--timeout", "600"), ("--client-timeout", "60"),
                            ("--max-body", "67108864"), ("--max-buffered", "1073741824"),
                            ("--max-clients", "256"), ("--max-depth", "128")]:
        assert re.search(r"%s \S+ .*?\(default: %s\)" % (option, default), help_text), option
    refused = subprocess.run([sys.executable, "-m", "kvx.vllm.proxy", "--prefill", "x",
                              "--decode", "y", "--max-depth", "501"],
                             capture_output=True, text=True, timeout=WAIT_S)
    assert refused.returncode == 2 and "--max-depth: 501 is not within 1..500" in refused.stderr

    p, d = Fake("p"), Fake("d", held_at_d)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "kvx.vllm.proxy", "--prefill", p.url, "--decode", d.url,
         "--port", "0", "--max-body", "200", "--max-depth", "3", "--client-timeout", "1",
         "--max-clients", "1", "--max-buffered", "100000", "--timeout", "5"],
        stderr=subprocess.PIPE, text=True)
    try:
        line = proxy.stderr.readline()
        port = int(re.search(r"kvx proxy on http://127.0.0.1:(\d+)", line).group(1))
        with connect(port) as sock:  # one connection, the one slot
            sock.sendall(request({"prompt": "hi", "x": [[1]]}))
            assert d.arrived.wait(WAIT_S)
            status, _, text = exchange(port, request({"prompt": "other"}))
            assert status == 503 and "serves 1 clients already" in text
            d.go.set()
            assert read_answer(sock)[0] == 200
            sock.sendall(request({"prompt": "hi", "x": [[[1]]]}))
            status, _, text = read_answer(sock)
            assert status == 400 and "nested deeper than 3 levels" in text
            sock.sendall(request({"prompt": "a" * 200}))
            status, _, text = read_answer(sock)
            assert status == 413 and "limit of 200 bytes" in text
        status, text = until_served(port, b"P")  # once the slot is free
        assert status == 408 and "within 1 s" in text
    finally:
        proxy.terminate()
        proxy.wait(WAIT_S)
        proxy.stderr.close()
        p.close()
        d.close()
