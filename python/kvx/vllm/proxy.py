"""A small P/D proxy for vLLM's OpenAI servers (docs/vllm.md), standard library only.

    python -m kvx.vllm.proxy --prefill http://P:8100 --decode http://D:8200 [--port 8000]

Each POST to /v1/completions or /v1/chat/completions goes to P first with
kv_transfer_params {"do_remote_decode": true} and max_tokens 1; P's answer carries the
kv_transfer_params that name its held blocks, and the original request goes to D with them,
verbatim (without, when P handed nothing over: D computes the prompt). D's answer is the
client's. Several prefill or decode servers are taken in turn.
Streaming (stream: true) is passed to D as asked; P is always asked without it. Errors of
either server reach the client with their status and body."""

import argparse
import http.server
import itertools
import json
import sys
import threading
import urllib.error
import urllib.request

PATHS = ("/v1/completions", "/v1/chat/completions")


def post(url, body, timeout_s):
    """(status, headers, bytes) of a JSON POST; HTTP errors are answers too, and a server
    that cannot be reached is a 502 naming it."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except OSError as e:  # refused, unreachable, timed out: the client hears which server
        reason = getattr(e, "reason", e)
        return 502, {"Content-Type": "text/plain"}, ("cannot reach %s: %s" % (url, reason)).encode()


class Proxy:
    def __init__(self, prefill, decode, timeout_s=600):
        self.prefill = itertools.cycle(prefill)
        self.decode = itertools.cycle(decode)
        self.lock = threading.Lock()  # the cycles, between handler threads
        self.timeout_s = timeout_s
        self.warned = False  # said once that P handed a request nothing

    def forward(self, path, body):
        """(status, content type, bytes) of one request through P then D."""
        with self.lock:
            p_url, d_url = next(self.prefill), next(self.decode)
        p_body = dict(body, kv_transfer_params={"do_remote_decode": True}, max_tokens=1,
                      stream=False)
        p_body.pop("max_completion_tokens", None)
        p_body.pop("stream_options", None)
        status, headers, data = post(p_url + path, p_body, self.timeout_s)
        if status != 200:
            return status, headers.get("Content-Type", "application/json"), data
        try:
            params = json.loads(data).get("kv_transfer_params")
        except ValueError:
            return 502, "text/plain", b"prefill server answered no JSON"
        if not params:
            # P hands nothing over for this prompt (one token, or a kind the connector keeps
            # local), or P runs without the connector: D computes the request itself
            if not self.warned:
                self.warned = True
                print("kvx proxy: %s answered without kv_transfer_params: D computes such "
                      "requests itself (is P started with --kv-transfer-config?)" % p_url,
                      file=sys.stderr, flush=True)
            # and without the client's own kv_transfer_params: D loads only what P handed over
            body = {k: v for k, v in body.items() if k != "kv_transfer_params"}
            status, headers, data = post(d_url + path, body, self.timeout_s)
        else:
            status, headers, data = post(d_url + path, dict(body, kv_transfer_params=params),
                                         self.timeout_s)
        return status, headers.get("Content-Type", "application/json"), data

    def handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                if self.path not in PATHS:
                    return self.answer(404, "text/plain", b"not found: %s" % self.path.encode())
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(length))
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    return self.answer(400, "text/plain", b"bad JSON body: %s" % str(e).encode())
                self.answer(*proxy.forward(self.path, body))

            def do_GET(self):
                if self.path == "/health":
                    return self.answer(200, "text/plain", b"ok")
                self.answer(404, "text/plain", b"not found")

            def answer(self, status, content_type, data):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client left before its answer

            def log_message(self, format, *args):
                return  # one line per request would drown the servers' own logs

        return Handler

    def serve(self, host, port):
        """A threading HTTP server bound now; serve_forever() it (or in a thread)."""
        return http.server.ThreadingHTTPServer((host, port), self.handler())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvx.vllm.proxy", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--prefill", action="append", required=True, help="P's base URL")
    parser.add_argument("--decode", action="append", required=True, help="D's base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per server call")
    args = parser.parse_args(argv)
    server = Proxy(args.prefill, args.decode, args.timeout).serve(args.host, args.port)
    print("kvx proxy on http://%s:%d: prefill %s, decode %s" % (
        args.host, server.server_address[1], ", ".join(args.prefill), ", ".join(args.decode)),
        file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
