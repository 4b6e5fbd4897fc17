#!/usr/bin/env python3
"""Instructions per definition write into N live sessions, under callgrind.

A write of one of an account's tool definitions changes the catalog of every
session of the account, and each live model session (an open event stream)
is told its new tools under the catalog mutation lock. The server runs under
`valgrind --tool=callgrind` twice on a fresh data directory with N sessions
of the admin account, each event stream held open and drained, one script
definition, and FEW and then MANY toggles of it (off, then on again); the
difference of the two totals over MANY - FEW is one pair of toggles (two
fan-outs), start-up and the sessions' opening excluded. Every answer is
checked.

    python3 benches/callgrind_definition_write.py target/release/toolgate [N FEW MANY]

With `--top N` it also prints the N functions whose inclusive count grew most
per pair. Needs valgrind (callgrind_annotate) and Python 3.
"""
import os
import sys
import tempfile
import threading

from callgrind_common import json_request, main_sized, start_server, stop
from callgrind_register import drain


def run(binary, sessions, pairs, out):
    data = tempfile.mkdtemp(prefix="toolgate-callgrind-definition-")
    os.environ["ENABLE_UNSAFE_SCRIPT_HANDLER"] = "true"
    server, conn = start_server(binary, data, out, data)
    port = conn.port

    def request(method, path, body):
        return json_request(conn, method, path, body)

    ready = threading.Semaphore(0)
    for _ in range(sessions):
        session = request("POST", "/sessions", {"character": "Lanlan", "title": "bench"})["data"]["id"]
        threading.Thread(target=drain, args=(port, session, ready), daemon=True).start()
    for _ in range(sessions):
        if not ready.acquire(timeout=600):
            sys.exit("an event stream did not become ready")
    created = request("POST", "/tools/definitions", {
        "name": "lookup_npc", "description": "find an NPC",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        "side_effect_level": "none", "source": "custom", "handler_type": "script",
        "handler": {"script": "return { found: true };"}})
    definition = created["data"]["id"]
    for _ in range(pairs):
        for enabled in (False, True):
            answer = request("PATCH", f"/tools/definitions/{definition}/toggle", {"enabled": enabled})
            if answer["data"]["enabled"] is not enabled:
                sys.exit(f"the toggle did not take: {answer}")
    return stop(server, out)


if __name__ == "__main__":
    main_sized(__doc__, "instructions_per_definition_toggle_pair", run)
