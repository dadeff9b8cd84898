"""A small P/D proxy for vLLM's OpenAI servers (docs/vllm.md), standard library only.

    python -m kvx.vllm.proxy --prefill http://P:8100 --decode http://D:8200 [--port 8000]

Each POST to /v1/completions or /v1/chat/completions goes to P first with
kv_transfer_params {"do_remote_decode": true} and max_tokens 1; P's answer carries the
kv_transfer_params that name its held blocks, and the original request goes to D with them,
verbatim (without, when P handed nothing over: D computes the prompt). D's answer is the
client's. Several prefill or decode servers are taken in turn.
Streaming (stream: true) is passed to D as asked; P is always asked without it. Errors of
either server reach the client with their status and body.

Everything a client or a server sends is bounded (docs/security.md, "Bounded everything"):
bodies by --max-body each and --max-buffered in all, clients by --max-clients, a client's
request by --client-timeout, P and D by --timeout for both together, JSON by --max-depth. A
bound that is hit is answered (413, 411, 400, 408, 503, 502 or 504) with a line that names
it, and never read past."""

import argparse
import http.client
import http.server
import io
import itertools
import json
import socket
import sys
import threading
import time
import urllib.parse

PATHS = ("/v1/completions", "/v1/chat/completions")

# The documented defaults (docs/security.md); each is a command-line option.
MAX_BODY = 64 << 20       # bytes of one body: a client's request, or P's or D's answer
MAX_BUFFERED = 1 << 30    # bytes the bodies take at once, all requests together, parsed
                          # copies counted (parsed_bytes)
MAX_CLIENTS = 256         # connections served at once (vLLM batches 256 requests by default)
CLIENT_TIMEOUT_S = 60     # to receive one request whole (and to send its answer)
TIMEOUT_S = 600           # for P and D together, per request
MAX_DEPTH = 128           # nesting of a request's JSON
MAX_DEPTH_LIMIT = 500     # above it json's C code meets Python's recursion limit (1000)
MAX_HEAD = 64 << 10       # bytes of a request line and headers; not an option
VALUE_BYTES = 80          # the most one parsed JSON value other than an object takes: an
                          # empty list, 56 bytes, its 8-byte slot and malloc's share (72 measured)
OBJECT_BYTES = 320        # the most a parsed JSON object of one key takes (273 measured)


class HeadTooLarge(Exception):
    pass


class DeadlineReader(io.RawIOBase):
    """A socket's reading side that ends at a total deadline (time.monotonic()), not after
    one quiet read: a peer that sends a byte a second is cut at the deadline as one that
    sends nothing. `limit` caps the bytes read since `arm` (None: no cap)."""

    def __init__(self, sock):
        super().__init__()
        self.sock = sock
        self.deadline = None
        self.limit = None
        self.count = 0  # bytes read since arm()
        self.expired = False

    def arm(self, seconds, limit=None):
        self.deadline = time.monotonic() + seconds
        self.limit = limit
        self.count = 0
        self.expired = False

    def left(self):
        return self.deadline - time.monotonic()

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.limit is not None and self.count >= self.limit:
            raise HeadTooLarge()
        left = self.left()
        if left <= 0:
            self.expired = True
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise
        self.count += n
        return n


class DeadlineSocket:
    """What http.client uses of an upstream connection's socket, under one total deadline.
    Its close() leaves the socket open: http.client closes the connection once the answer's
    headers say it will close, and reads the answer after; the caller closes the socket."""

    def __init__(self, sock, deadline):
        self.sock = sock
        self.deadline = deadline

    def sendall(self, data):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.sock.settimeout(left)  # sendall's timeout is the whole call's (Python >= 3.5)
        self.sock.sendall(data)

    def makefile(self, mode):
        reader = DeadlineReader(self.sock)
        reader.deadline = self.deadline
        return io.BufferedReader(reader)

    def close(self):
        pass


class DeadlineConnection:
    """An HTTP(S) connection to P or D whose connect, send and every read end at `deadline`."""

    def __init__(self, host, port, deadline):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self.deadline = deadline
        self.raw = None  # the socket, closed by close_all()

    def connect(self):
        super().connect()
        self.raw = self.sock
        self.sock = DeadlineSocket(self.sock, self.deadline)

    def close_all(self):
        self.close()
        if self.raw is not None:
            self.raw.close()


class Upstream(DeadlineConnection, http.client.HTTPConnection):
    pass


class UpstreamTLS(DeadlineConnection, http.client.HTTPSConnection):
    pass


class Budget:
    """Bytes the proxy's bodies take at once (--max-buffered), taken before they are read or
    made: a request's length before it is read, then parsed_bytes(), and each answer's chunks
    as they come."""

    def __init__(self, limit):
        self.limit = limit
        self.used = 0
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n):
        with self.lock:
            self.used -= n


class Refused(Exception):
    """An answer the proxy makes itself: (status, text)."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


def parsed_bytes(data):
    """An upper bound on the bytes a request body of `data` takes beyond itself, parsed and sent
    on (measured in docs/security.md): its strings once parsed and once encoded for P or D (as
    text, then as UTF-8 bytes), VALUE_BYTES for each value or key it can hold (each follows a
    [, , or :, or is the top one) and OBJECT_BYTES for each object ({)."""
    values = data.count(b",") + data.count(b":") + data.count(b"[") + 1
    return 2 * len(data) + VALUE_BYTES * values + OBJECT_BYTES * data.count(b"{")


def too_deep(value, limit):
    """Whether a parsed JSON value nests deeper than `limit`, found without recursion."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


class Server(http.server.ThreadingHTTPServer):
    """A threading HTTP server of at most `max_clients` handler threads: the connection
    beyond them is answered 503 by the accepting thread at once, without a thread."""

    block_on_close = False  # server_close() does not wait for clients' deadlines

    def __init__(self, address, handler, proxy):
        self.proxy = proxy
        self.slots = threading.BoundedSemaphore(proxy.max_clients)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.proxy.warn_once("clients", "%d clients at once (--max-clients): the next are "
                                 "answered 503" % self.proxy.max_clients)
            text = b"the proxy serves %d clients already (--max-clients): try again\n" % (
                self.proxy.max_clients)
            try:
                request.setblocking(False)  # a new socket's empty buffer takes this whole
                request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (
                                 len(text), text))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Proxy:
    def __init__(self, prefill, decode, timeout_s=TIMEOUT_S, max_body=MAX_BODY,
                 max_buffered=MAX_BUFFERED, max_clients=MAX_CLIENTS,
                 client_timeout_s=CLIENT_TIMEOUT_S, max_depth=MAX_DEPTH):
        if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
            raise ValueError("max_depth: %d is not within 1..%d" % (max_depth, MAX_DEPTH_LIMIT))
        if max_body > max_buffered:
            raise ValueError("max_body: %d is more than max_buffered %d" % (max_body,
                                                                           max_buffered))
        self.prefill = itertools.cycle(prefill)
        self.decode = itertools.cycle(decode)
        self.lock = threading.Lock()  # the cycles and the warnings, between handler threads
        self.timeout_s = timeout_s
        self.max_body = max_body
        self.budget = Budget(max_buffered)
        self.max_clients = max_clients
        self.client_timeout_s = client_timeout_s
        self.max_depth = max_depth
        self.warned = set()  # what was said once

    def warn_once(self, key, text):
        with self.lock:
            if key in self.warned:
                return
            self.warned.add(key)
        print("kvx proxy: %s (said once)" % text, file=sys.stderr, flush=True)

    def post(self, role, url, body, deadline, held):
        """(status, headers, bytes) of a JSON POST that ends by `deadline`; HTTP errors are
        answers too. What cannot be reached, is cut short or answers too much is a 502, and
        what is not done by the deadline a 504, each naming the server. `held` counts the
        answer's bytes taken from the budget."""
        parts = urllib.parse.urlsplit(url)
        data = json.dumps(body, ensure_ascii=False).encode()  # as long as what came (UTF-8)
        tls = parts.scheme == "https"
        connection = (UpstreamTLS if tls else Upstream)(
            parts.hostname, parts.port or (443 if tls else 80), deadline)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        response = None
        try:
            connection.request("POST", target, data, {
                "Content-Type": "application/json", "Connection": "close"})
            response = connection.getresponse()
            answer = bytearray()
            while True:
                chunk = response.read(1 << 16)
                if not chunk:
                    break
                if len(answer) + len(chunk) > self.max_body:
                    raise Refused(502, "%s server %s answered more than %d bytes "
                                  "(--max-body)" % (role, url, self.max_body))
                if not self.budget.take(len(chunk)):
                    raise self.full()
                held[0] += len(chunk)
                answer += chunk
            if response.length:  # http.client returns what came, however short
                raise http.client.IncompleteRead(bytes(answer), response.length)
            return response.status, response.headers, answer
        except TimeoutError:
            raise Refused(504, "%s server %s did not answer within the request's %g s "
                          "(--timeout)" % (role, url, self.timeout_s))
        except (OSError, http.client.HTTPException) as e:  # the client hears which server
            if response is None:  # refused, unreachable, closed before answering
                raise Refused(502, "cannot reach %s: %s" % (url, str(e) or repr(e)))
            raise Refused(502, "%s server %s broke off its answer: %r" % (role, url, e))
        finally:
            connection.close_all()

    def full(self):
        self.warn_once("buffered", "bodies take %d bytes (--max-buffered): more are answered "
                       "503" % self.budget.limit)
        return Refused(503, "the proxy's bodies take %d bytes already (--max-buffered): try "
                       "again" % self.budget.limit)

    def forward(self, path, body, held=None):
        """(status, content type, bytes) of one request through P then D, both done within
        timeout_s of its start. `held` ([bytes]) counts the answers' bytes taken from the
        budget, for the caller to give back once the answer is sent (None: given back here)."""
        if held is None:
            held = [0]
            try:
                return self.forward(path, body, held)
            finally:
                self.budget.give(held[0])
        deadline = time.monotonic() + self.timeout_s
        with self.lock:
            p_url, d_url = next(self.prefill), next(self.decode)
        p_body = dict(body, kv_transfer_params={"do_remote_decode": True}, max_tokens=1,
                      stream=False)
        p_body.pop("max_completion_tokens", None)
        p_body.pop("stream_options", None)
        try:
            status, headers, data = self.post("prefill", p_url + path, p_body, deadline, held)
            if status != 200:
                return status, headers.get("Content-Type", "application/json"), data
            try:
                answer = json.loads(data)
            except (ValueError, RecursionError):
                return 502, "text/plain", b"prefill server answered no JSON"
            params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            if not params:
                # P hands nothing over for this prompt (one token, or a kind the connector
                # keeps local), or P runs without the connector: D computes the request itself
                self.warn_once("params", "%s answered without kv_transfer_params: D computes "
                               "such requests itself (is P started with "
                               "--kv-transfer-config?)" % p_url)
                # and without the client's own kv_transfer_params: D loads only what P handed
                body = {k: v for k, v in body.items() if k != "kv_transfer_params"}
            else:
                body = dict(body, kv_transfer_params=params)
            status, headers, data = self.post("decode", d_url + path, body, deadline, held)
        except Refused as e:
            return e.status, "text/plain", e.text.encode()
        return status, headers.get("Content-Type", "application/json"), data

    def handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                self.rfile.close()  # read through the deadline instead
                self.reader = DeadlineReader(self.connection)
                self.rfile = io.BufferedReader(self.reader)
                self.linger = False  # the client may still be sending what was not read

            def handle_one_request(self):
                """One request, received whole within client_timeout_s of waiting for it
                (headers within MAX_HEAD bytes); a client too slow hears 408, one that sent
                nothing is closed."""
                self.answered = False
                self.requestline, self.command = "", ""  # an answer before they are read
                self.request_version = "HTTP/1.1"
                self.reader.arm(proxy.client_timeout_s, MAX_HEAD)
                try:
                    super().handle_one_request()  # closes the connection at a timeout
                except HeadTooLarge:
                    self.refuse(Refused(431, "request line and headers are larger than %d "
                                        "bytes" % MAX_HEAD))
                if self.reader.expired and self.reader.count and not self.answered:
                    self.close_connection = True
                    self.answer(408, "text/plain", b"request not received whole within %g s "
                                b"(--client-timeout)" % proxy.client_timeout_s)

            def body_length(self):
                """The announced body length, or a Refused naming what is wrong with it."""
                if "Transfer-Encoding" in self.headers:
                    raise Refused(411, "Transfer-Encoding: %s is not accepted: send the body "
                                  "with a Content-Length" % self.headers["Transfer-Encoding"])
                lengths = self.headers.get_all("Content-Length") or []
                if not lengths:
                    raise Refused(411, "a POST needs a Content-Length")
                if len(lengths) > 1:
                    raise Refused(400, "Content-Length: given %d times" % len(lengths))
                text = lengths[0].strip()
                if not (text.isascii() and text.isdigit()):
                    raise Refused(400, "Content-Length: %r is not a byte count" % text)
                length = int(text)
                if length > proxy.max_body:
                    raise Refused(413, "body of %d bytes is larger than the proxy's limit of "
                                  "%d bytes (--max-body)" % (length, proxy.max_body))
                return length

            def handle_expect_100(self):
                if self.command == "POST":
                    try:
                        self.body_length()  # refused before the client sends it
                    except Refused as e:
                        self.refuse(e)
                        return False
                return super().handle_expect_100()

            def refuse(self, e):
                """Answer a request whose body was not read, and close: the rest of what the
                client sends is read away (until the deadline) so that it hears the answer."""
                self.close_connection = True
                self.linger = True
                self.answer(e.status, "text/plain", e.text.encode())

            def do_POST(self):
                held = [0]
                try:
                    self.serve_post(held)
                finally:
                    proxy.budget.give(held[0])

            def serve_post(self, held):
                try:
                    if self.path not in PATHS:
                        raise Refused(404, "not found: %s" % self.path)
                    length = self.body_length()
                    if not proxy.budget.take(length):
                        raise proxy.full()
                except Refused as e:
                    return self.refuse(e)
                held[0] += length
                self.reader.limit = None  # the body is bounded by its length
                data = self.rfile.read(length)  # a timeout ends in handle_one_request: 408
                if len(data) < length:
                    self.close_connection = True
                    return  # the client left
                parsed = parsed_bytes(data)
                if length + parsed > proxy.budget.limit:
                    return self.answer(413, "text/plain", b"body of %d bytes would take %d "
                                       b"bytes parsed, more than the proxy's %d (--max-buffered)"
                                       % (length, length + parsed, proxy.budget.limit))
                if not proxy.budget.take(parsed):
                    e = proxy.full()
                    return self.answer(e.status, "text/plain", e.text.encode())
                held[0] += parsed
                try:
                    body = json.loads(data)
                except RecursionError:
                    return self.answer(400, "text/plain", b"bad JSON body: nested deeper than "
                                       b"the parser allows; the limit is %d levels "
                                       b"(--max-depth)" % proxy.max_depth)
                except ValueError as e:
                    return self.answer(400, "text/plain", b"bad JSON body: %s" %
                                       str(e).encode())
                del data
                if not isinstance(body, dict):
                    return self.answer(400, "text/plain", b"bad JSON body: not an object")
                if too_deep(body, proxy.max_depth):
                    return self.answer(400, "text/plain", b"bad JSON body: nested deeper than "
                                       b"%d levels (--max-depth)" % proxy.max_depth)
                try:
                    answer = proxy.forward(self.path, body, held)
                except Exception as e:  # a bug of the proxy's is answered too, never dropped
                    print("kvx proxy: %s %s failed: %r" % (self.command, self.path, e),
                          file=sys.stderr, flush=True)
                    answer = 500, "text/plain", b"proxy error: %s" % repr(e).encode()
                self.answer(*answer)

            def do_GET(self):
                if "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
                    self.close_connection = True  # a body that is never read
                    self.linger = True
                if self.path == "/health":
                    return self.answer(200, "text/plain", b"ok")
                self.answer(404, "text/plain", b"not found")

            def answer(self, status, content_type, data):
                """Send one answer within client_timeout_s (a client that does not read it
                is closed)."""
                self.answered = True
                deadline = time.monotonic() + proxy.client_timeout_s
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    if self.close_connection:
                        self.send_header("Connection", "close")
                    self.connection.settimeout(proxy.client_timeout_s)
                    self.end_headers()
                    self.connection.settimeout(max(deadline - time.monotonic(), 0.001))
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, TimeoutError):
                    self.close_connection = True  # the client left, or does not read

            def finish(self):
                if self.linger:
                    self.read_away()
                super().finish()

            def read_away(self):
                """After an answer to a request whose body was not read: half-close, and read
                what the client still sends until it closes or its deadline passes; closing
                with unread data would reset the connection and might lose the answer."""
                try:
                    self.connection.shutdown(socket.SHUT_WR)
                    sink = bytearray(1 << 16)
                    while True:
                        left = self.reader.left()
                        if left <= 0:
                            return
                        self.connection.settimeout(left)
                        if not self.connection.recv_into(sink):
                            return
                except OSError:
                    return

            def log_message(self, format, *args):
                return  # one line per request would drown the servers' own logs

        return Handler

    def serve(self, host, port):
        """A threading HTTP server bound now; serve_forever() it (or in a thread)."""
        return Server((host, port), self.handler(), self)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m kvx.vllm.proxy", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--prefill", action="append", required=True, help="P's base URL")
    parser.add_argument("--decode", action="append", required=True, help="D's base URL")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds a request may take at P and D together (504 beyond)")
    parser.add_argument("--client-timeout", type=float, default=CLIENT_TIMEOUT_S,
                        help="seconds to receive one request whole, or an idle connection's "
                        "next, and to send an answer (408 beyond)")
    parser.add_argument("--max-body", type=int, default=MAX_BODY,
                        help="bytes of one body: a client's request (413 beyond) or a "
                        "server's answer (502 beyond)")
    parser.add_argument("--max-buffered", type=int, default=MAX_BUFFERED,
                        help="bytes of bodies held at once, all requests together (503 beyond)")
    parser.add_argument("--max-clients", type=int, default=MAX_CLIENTS,
                        help="connections served at once (503 beyond)")
    parser.add_argument("--max-depth", type=int, default=MAX_DEPTH,
                        help="nesting of a request's JSON, at most %d (400 beyond)" %
                        MAX_DEPTH_LIMIT)
    args = parser.parse_args(argv)
    for name in ("timeout", "client_timeout", "max_body", "max_buffered", "max_clients"):
        if getattr(args, name) <= 0:
            parser.error("--%s: %s is not positive" % (name.replace("_", "-"),
                                                       getattr(args, name)))
    if not 1 <= args.max_depth <= MAX_DEPTH_LIMIT:
        parser.error("--max-depth: %d is not within 1..%d" % (args.max_depth, MAX_DEPTH_LIMIT))
    if args.max_body > args.max_buffered:
        parser.error("--max-body: %d is more than --max-buffered %d" % (args.max_body,
                                                                         args.max_buffered))
    server = Proxy(args.prefill, args.decode, args.timeout, max_body=args.max_body,
                   max_buffered=args.max_buffered, max_clients=args.max_clients,
                   client_timeout_s=args.client_timeout, max_depth=args.max_depth).serve(
                       args.host, args.port)
    print("kvx proxy on http://%s:%d: prefill %s, decode %s" % (
        args.host, server.server_address[1], ", ".join(args.prefill), ", ".join(args.decode)),
        file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
