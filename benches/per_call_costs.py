#!/usr/bin/env python3
"""What one tool call costs a toolgate binary in the kernel's terms: CPU time,
context switches and migrations per call (`perf stat`), or system calls per
call by name (`strace -c`), and the write-ahead log's size at the end.

Counts of system calls and context switches move far less with a noisy VM's
load than latencies do (BENCHMARKS.md, issue 20, eighth pass). The server runs
on a fresh data directory; after 300 warm-up calls the tool watches it over
CALLS sequential `POST /sessions/{id}/tool-calls` (default 3,000).

    python3 benches/per_call_costs.py target/release/toolgate [CALLS]
    python3 benches/per_call_costs.py --strace target/release/toolgate [CALLS]
    python3 benches/per_call_costs.py --remote target/release/toolgate [CALLS]

Calls are the bench's builtin call (`roll_dice`) unless `--remote`, which
registers a remote tool whose callback (a Python HTTP server in this process,
answering in one write) answers at once. Needs perf, or strace for `--strace`.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from callgrind_common import TOKEN, launch

HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
ANSWER = b'{"output":{"ok":true}}'


class Callback(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        # One write: a header write and a body write would meet Nagle's
        # algorithm and the delayed ACK (40 ms a call).
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))

    def log_message(self, *args):
        pass


def main():
    args = sys.argv[1:]
    use_strace = "--strace" in args
    remote = "--remote" in args
    args = [a for a in args if a not in ("--strace", "--remote")]
    if not args:
        sys.exit(__doc__)
    binary, calls = args[0], int(args[1]) if len(args) > 1 else 3000
    data = tempfile.mkdtemp(prefix="toolgate-per-call-")
    server, conn = launch([binary], data, data, timeout=60)

    def request(method, path, body):
        conn.request(method, path, body=body, headers=HEADERS)
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 300:
            sys.exit(f"{method} {path}: HTTP {answer.status}: {text[:300]!r}")
        return text

    session = json.loads(request("POST", "/sessions", json.dumps({"character": "Lanlan"})))["data"]["id"]
    call = {"name": "roll_dice", "arguments": {"sides": 20, "count": 2}}
    if remote:
        callback = ThreadingHTTPServer(("127.0.0.1", 0), Callback)
        threading.Thread(target=callback.serve_forever, daemon=True).start()
        request("POST", "/api/tools/register", json.dumps({
            "name": "bench_weather", "description": "Weather forecast",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
            "callback_url": f"http://127.0.0.1:{callback.server_port}/cb", "role": "Lanlan",
            "source": "plugin:bench", "timeout_seconds": 60}))
        call = {"name": "bench_weather", "arguments": {"location": "Shanghai"}}
    body, path = json.dumps(call), f"/sessions/{session}/tool-calls"
    for _ in range(300):
        request("POST", path, body)
    out = os.path.join(data, "watch.txt")
    watch = (["strace", "-c", "-f", "-o", out] if use_strace else
             ["perf", "stat", "-e", "task-clock,context-switches,cpu-migrations", "-o", out])
    watcher = subprocess.Popen(watch + ["-p", str(server.pid)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    latencies, started = [], time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        request("POST", path, body)
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - started
    watcher.send_signal(signal.SIGINT)
    watcher.wait()
    latencies.sort()
    print(f"client_p50_ms {latencies[calls // 2] * 1e3:.3f}")
    print(f"client_mean_ms {wall / calls * 1e3:.3f}")
    with open(out) as report:
        for line in report:
            parts = line.split()
            if use_strace and len(parts) >= 5 and parts[-1] not in ("total", "syscall") and parts[3].isdigit():
                print(f"syscalls_{parts[-1]}_per_call {int(parts[3]) / calls:.2f}")
            elif use_strace and parts[-1:] == ["total"]:
                print(f"syscalls_per_call {int(parts[3]) / calls:.1f}")
            elif not use_strace and len(parts) >= 2 and parts[1] in ("msec", "context-switches", "cpu-migrations"):
                name = "task_clock_ms" if parts[1] == "msec" else parts[1].replace("-", "_")
                print(f"{name}_per_call {float(parts[0].replace(',', '')) / calls:.4f}")
    for log in glob.glob(os.path.join(data, "*.db-wal")):
        print(f"wal_bytes {os.path.getsize(log)}")
    print(f"server log: {data}/log", file=sys.stderr)
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)


if __name__ == "__main__":
    main()
