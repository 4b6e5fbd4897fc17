#!/usr/bin/env python3
"""The server's CPU time per builtin call when the session's character has
many remote tools registered: what a call costs beyond its own tool's entry.

Before `Catalog::for_call` (BENCHMARKS.md, issue 20, thirteenth pass) every
call built an entry, and for a remote tool a handler, for every tool of the
character. The server runs on a fresh data directory; TOOLS remote tools are
registered for `Lanlan` (their callbacks are never called), then after 200
warm-up calls CALLS sequential `roll_dice` calls are timed, with the server's
user and system time read from /proc.

    python3 benches/many_tools_call.py target/release/toolgate [TOOLS [CALLS]]

Needs Python 3 and Linux's /proc.
"""
import sys, os, json, time, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callgrind_common import launch, process_cpu_seconds, TOKEN
d = tempfile.mkdtemp()
server, conn = launch([sys.argv[1]], os.path.join(d, "data"), d)
H = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
def req(method, path, body=None):
    conn.request(method, path, json.dumps(body) if body is not None else None, H)
    r = conn.getresponse(); return json.loads(r.read() or b"null")
TOOLS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
for i in range(TOOLS):
    req("POST", "/api/tools/register", {"name": f"t{i:04}", "callback_url": "http://127.0.0.1:9/cb", "role": "Lanlan"})
sess = req("POST", "/sessions", {"character": "Lanlan"})
sid = sess["data"]["id"]
call = {"name": "roll_dice", "arguments": {"sides": 20, "count": 2}}
for _ in range(200): req("POST", f"/sessions/{sid}/tool-calls", call)
def cpu():
    return sum(process_cpu_seconds(server.pid))
n = CALLS; c0 = cpu(); t0 = time.time()
for _ in range(n): req("POST", f"/sessions/{sid}/tool-calls", call)
print(f"{sys.argv[1]} tools={TOOLS} server_cpu_ms_per_call={(cpu()-c0)/n*1000:.3f} wall_ms_per_call={(time.time()-t0)/n*1000:.3f}")
server.terminate()
