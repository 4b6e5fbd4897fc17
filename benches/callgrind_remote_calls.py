#!/usr/bin/env python3
"""Instructions per remote tool call of a toolgate binary, under callgrind.

Instruction counts do not move with the machine's load the way times do, so a
change of a few percent in the call path's CPU work can be decided on a noisy
2-core VM (BENCHMARKS.md, issue 20). The server runs under
`valgrind --tool=callgrind` twice on a fresh data directory, answering FEW and
then MANY sequential `POST /sessions/{id}/tool-calls` to a remote tool whose
callback (a Python HTTP server) answers at once; the difference of the two
totals over MANY - FEW calls is the cost of one call, start-up excluded.

    python3 benches/callgrind_remote_calls.py target/release/toolgate [FEW MANY]
    python3 benches/callgrind_remote_calls.py --builtin target/release/toolgate [FEW MANY]

With `--builtin` every call is the bench's builtin call instead
(`roll_dice`, sides 20, count 2: the `builtin` phase's), and the figure is
`instructions_per_builtin_call`.

With `--top N` it also prints the N functions whose inclusive count grew most
per call. Needs valgrind (callgrind_annotate) and Python 3.
"""
import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from callgrind_common import json_request, measure, start_server, stop, take_top

ANSWER = b'{"output":{"ok":true,"forecast":"sunny"}}'


class Callback(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args):
        pass


REMOTE_CALL = {"name": "bench_weather", "arguments": {"location": "Shanghai", "days": 3}}
BUILTIN_CALL = {"name": "roll_dice", "arguments": {"sides": 20, "count": 2}}


def run(binary, calls, out, callback_port, call):
    data = tempfile.mkdtemp(prefix="toolgate-callgrind-")
    server, conn = start_server(binary, data, out, data)

    def request(method, path, body):
        return json_request(conn, method, path, body)

    session = request("POST", "/sessions", {"character": "Lanlan"})["data"]["id"]
    request("POST", "/api/tools/register", {
        "name": "bench_weather", "description": "Weather forecast",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "minLength": 1},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["location"]},
        "callback_url": f"http://127.0.0.1:{callback_port}/cb", "role": "Lanlan",
        "source": "plugin:bench", "timeout_seconds": 60})
    for _ in range(calls):
        answer = request("POST", f"/sessions/{session}/tool-calls", call)
        if '"success"' not in json.dumps(answer):
            sys.exit(f"a call did not succeed: {answer}")
    return stop(server, out)


def main():
    args = sys.argv[1:]
    top = take_top(args)
    builtin = "--builtin" in args
    if builtin:
        args.remove("--builtin")
    if not args:
        sys.exit(__doc__)
    binary = args[0]
    few, many = (int(args[1]), int(args[2])) if len(args) >= 3 else (20, 220)
    # Threaded: a keep-alive connection held by one toolgate connection must
    # not keep another (a second pooled connection) waiting.
    callback = ThreadingHTTPServer(("127.0.0.1", 0), Callback)
    threading.Thread(target=callback.serve_forever, daemon=True).start()
    figure, call = (("instructions_per_builtin_call", BUILTIN_CALL) if builtin
                    else ("instructions_per_remote_call", REMOTE_CALL))
    measure(figure, few, many,
            lambda n, out: run(binary, n, out, callback.server_port, call), top)


if __name__ == "__main__":
    main()
