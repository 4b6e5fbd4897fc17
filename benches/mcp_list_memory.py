#!/usr/bin/env python3
"""Peak memory of concurrent MCP `tools/list` answers over large schemas.

Registers 256 remote tools whose schemas are about 60 KB each (900
properties), opens eight MCP sessions on one chat session
(`/mcp/sessions/{id}`, streamable HTTP), lists once to warm up, resets the
server's peak resident size (`/proc/PID/clear_refs`), then sends the eight
`tools/list` at once and prints the answer's size, the peak's growth
(`VmHWM`) and the slowest list's time. Issue 20's probe I found each listing
copied every schema (+1 GB for eight lists of 20 MB).

    python3 benches/mcp_list_memory.py target/release/toolgate

Needs Python 3 only; the server runs on a temporary data directory.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TOOLS = 256
LISTS = 8


def main(binary):
    data_dir = tempfile.mkdtemp()
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base)
        key = open(os.path.join(data_dir, "admin-token")).read().strip()
        measure(server.pid, base, key)
    finally:
        server.terminate()
        server.wait()


def wait_for(base):
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/healthz")
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("the server did not start")


def measure(pid, base, key):
    def request(path, body, headers=None):
        merged = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        merged.update(headers or {})
        sent = urllib.request.Request(base + path, method="POST", headers=merged,
                                      data=json.dumps(body).encode())
        with urllib.request.urlopen(sent, timeout=600) as answer:
            return dict(answer.headers), answer.read()

    properties = {f"field_{i:04d}": {"type": "string", "description": "x" * 40}
                  for i in range(900)}
    for n in range(TOOLS):
        request("/api/tools/register", {
            "name": f"tool_{n}", "description": "d",
            "parameters": {"type": "object", "properties": properties},
            "callback_url": "http://127.0.0.1:9/x", "source": "plugin:probe"})
    _, body = request("/sessions", {"character": "Lanlan"})
    path = f"/mcp/sessions/{json.loads(body)['data']['id']}"
    accept = {"Accept": "application/json, text/event-stream"}

    def open_mcp():
        headers, _ = request(path, {
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                       "clientInfo": {"name": "probe", "version": "1"}}}, accept)
        session = {k.lower(): v for k, v in headers.items()}["mcp-session-id"]
        request(path, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {**accept, "mcp-session-id": session})
        return session

    sessions = [open_mcp() for _ in range(LISTS)]
    answers = []

    def list_tools(session):
        started = time.time()
        _, body = request(path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          {**accept, "mcp-session-id": session})
        answers.append((len(body), time.time() - started))

    list_tools(sessions[0])
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")
    before = peak_mb(pid)
    threads = [threading.Thread(target=list_tools, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"answer {answers[0][0] / 1e6:.1f} MB, {LISTS} lists at once: "
          f"peak +{peak_mb(pid) - before} MB, slowest {max(a[1] for a in answers[1:]):.2f} s")


def peak_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
