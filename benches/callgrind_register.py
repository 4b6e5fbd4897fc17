#!/usr/bin/env python3
"""Instructions per register fan-out of a toolgate binary, under callgrind.

`toolgate-bench`'s register figure (one `POST /api/tools/register` with
`role: null` into N characters, each with a live model session) moves with
this VM's noise as much as with the code, so changes to the fan-out are
decided by counting instructions (BENCHMARKS.md, issue 20). The server runs
under `valgrind --tool=callgrind` twice on a fresh data directory with N
characters (`Lanlan` and `Bench001`...), one session each whose event stream is
held open and drained, and answers FEW and then MANY register + unregister
pairs into every role; the difference of the two totals over MANY - FEW is one
pair (two fan-outs), start-up and the sessions' opening excluded. Every answer
is checked: each register reaches all N roles, each unregister removes.

    python3 benches/callgrind_register.py target/release/toolgate [N FEW MANY]

With `--top N` it also prints the N functions whose inclusive count grew most
per pair. Needs valgrind (callgrind_annotate) and Python 3.
"""
import http.client
import sys
import tempfile
import threading

from callgrind_common import TOKEN, json_request, main_sized, start_server, stop


def drain(port, session, ready):
    """Holds `GET /sessions/{id}/events` open, sets `ready` at its first
    event, then reads until the server closes it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("GET", f"/sessions/{session}/events",
                 headers={"authorization": f"Bearer {TOKEN}"})
    answer = conn.getresponse()
    if answer.status != 200:
        print(f"events of {session}: HTTP {answer.status}", file=sys.stderr)
        return
    while True:
        line = answer.fp.readline()
        if not line:
            return
        if line.startswith(b"event: ready"):
            ready.release()


def run(binary, characters, pairs, out):
    data = tempfile.mkdtemp(prefix="toolgate-callgrind-register-")
    server, conn = start_server(binary, data, out, data)
    port = conn.port

    def request(method, path, body):
        return json_request(conn, method, path, body)

    ready = threading.Semaphore(0)
    for n in range(characters):
        name = "Lanlan" if n == 0 else f"Bench{n:03}"
        if n:
            request("POST", "/characters", {"name": name})
        session = request("POST", "/sessions", {"character": name, "title": "bench"})["data"]["id"]
        threading.Thread(target=drain, args=(port, session, ready), daemon=True).start()
    for _ in range(characters):
        if not ready.acquire(timeout=600):
            sys.exit("an event stream did not become ready")
    for i in range(pairs):
        name = f"bench_reg_{i}"
        answer = request("POST", "/api/tools/register", {
            "name": name, "description": "bench tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "callback_url": "http://127.0.0.1:9/cb", "role": None, "source": "plugin:bench"})
        if len(answer.get("affected_roles", [])) != characters or answer.get("failed_roles"):
            sys.exit(f"register reached {len(answer.get('affected_roles', []))} of {characters}: {answer}")
        if request("POST", "/api/tools/unregister", {"name": name, "role": None}).get("removed") is not True:
            sys.exit(f"unregister of {name} did not remove it")
    return stop(server, out)


if __name__ == "__main__":
    main_sized(__doc__, "instructions_per_register_unregister_pair", run)
