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

With `--top N` it also prints the N functions whose inclusive count grew most
per call. Needs valgrind (callgrind_annotate) and Python 3.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

TOKEN = "tg_bench_admin_token_0123456789abcdef"
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


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(binary, calls, out, callback_port):
    port = free_port()
    data = tempfile.mkdtemp(prefix="toolgate-callgrind-")
    env = dict(os.environ, TOOLGATE_ADMIN_TOKEN=TOKEN)
    for name in ("TOOLGATE_DATABASE_URL", "TOOLGATE_CONFIG", "TOOLGATE_LISTEN", "TOOLGATE_DATA_DIR"):
        env.pop(name, None)
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "serve",
         "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(data, "log"), "w"))
    deadline = time.time() + 120
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.connect()
            break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                sys.exit(f"toolgate did not start; see {data}/log")
            time.sleep(0.2)

    def request(method, path, body):
        conn.request(method, path, body=json.dumps(body),
                     headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 300:
            sys.exit(f"{method} {path}: HTTP {answer.status}: {text[:300]!r}")
        return json.loads(text)

    session = request("POST", "/sessions", {"character": "Lanlan"})["data"]["id"]
    request("POST", "/api/tools/register", {
        "name": "bench_weather", "description": "Weather forecast",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "minLength": 1},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["location"]},
        "callback_url": f"http://127.0.0.1:{callback_port}/cb", "role": "Lanlan",
        "source": "plugin:bench", "timeout_seconds": 60})
    for _ in range(calls):
        answer = request("POST", f"/sessions/{session}/tool-calls",
                         {"name": "bench_weather", "arguments": {"location": "Shanghai", "days": 3}})
        if '"success"' not in json.dumps(answer):
            sys.exit(f"a call did not succeed: {answer}")
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=300)
    with open(out) as profile:
        for line in profile:
            if line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {out}")


def functions(out):
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                          capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)", line)
        if match and "PROGRAM TOTALS" not in line:
            counts[match.group(2)] = counts.get(match.group(2), 0) + int(match.group(1).replace(",", ""))
    return counts


def main():
    args = sys.argv[1:]
    top = 0
    if "--top" in args:
        at = args.index("--top")
        top = int(args[at + 1])
        del args[at:at + 2]
    if not args:
        sys.exit(__doc__)
    binary = args[0]
    few, many = (int(args[1]), int(args[2])) if len(args) >= 3 else (20, 220)
    callback = HTTPServer(("127.0.0.1", 0), Callback)
    threading.Thread(target=callback.serve_forever, daemon=True).start()
    work = tempfile.mkdtemp(prefix="toolgate-callgrind-out-")
    outs = [os.path.join(work, f"callgrind.{n}.out") for n in (few, many)]
    totals = [run(binary, n, out, callback.server_port) for n, out in zip((few, many), outs)]
    print(f"instructions_per_remote_call {(totals[1] - totals[0]) / (many - few):.0f}")
    print(f"profiles {outs[0]} {outs[1]}", file=sys.stderr)
    if top:
        before, after = functions(outs[0]), functions(outs[1])
        grown = sorted(((after.get(k, 0) - before.get(k, 0)) / (many - few), k) for k in after)
        for per_call, name in reversed(grown[-top:]):
            print(f"{per_call:10.0f} {name[:160]}")


if __name__ == "__main__":
    main()
