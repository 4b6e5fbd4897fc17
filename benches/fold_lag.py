#!/usr/bin/env python3
"""Whether the journal's fold keeps up under sustained load: how many of the
log's records are still waiting to be folded into the table when a long
burst of builtin calls ends.

A fold that falls behind grows the log's pending records in memory (up to
its bound, past which writes commit to the table one by one) and makes the
first journal read after the burst fold them all first. The records waiting
at the end of a burst should stay a few milliseconds' worth however long
the burst lasts. A build whose background folds yielded the CPU at every
record fell four seconds behind in 10 s of four client processes
(BENCHMARKS.md, issue 20, sixteenth pass). This starts the server, has
PROCESSES client processes send `roll_dice` calls one at a time each for
SECONDS, then reads `/metrics` (`toolgate_journal_batch_rows_sum`: records
folded so far) beside the calls made (two records each), and times the
first journal read after the burst.

    python3 benches/fold_lag.py target/release/toolgate [SECONDS PROCESSES]

Needs Python 3 only.
"""
import http.client
import multiprocessing
import re
import signal
import sys
import tempfile
import time

from callgrind_common import json_request, launch, raw_request

CALL = {"name": "roll_dice", "arguments": {"sides": 20, "count": 2}}


def calls_for(args):
    """One client process: calls for `seconds`; how many it made."""
    port, session, seconds = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    end, made = time.time() + seconds, 0
    while time.time() < end:
        json_request(conn, "POST", f"/sessions/{session}/tool-calls", CALL)
        made += 1
    return made


def folded_records(conn):
    text = raw_request(conn, "GET", "/metrics").decode()
    match = re.search(r"^toolgate_journal_batch_rows_sum ([\d.e+]+)$", text, re.M)
    if match is None:
        sys.exit("/metrics has no toolgate_journal_batch_rows_sum")
    return int(float(match.group(1)))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    binary = args[0]
    seconds = float(args[1]) if len(args) > 1 else 10.0
    processes = int(args[2]) if len(args) > 2 else 4
    data = tempfile.mkdtemp(prefix="toolgate-fold-lag-")
    server, conn = launch([binary], data, data)
    try:
        session = json_request(conn, "POST", "/sessions", {"character": "Lanlan"})["data"]["id"]
        port = conn.port
        with multiprocessing.Pool(processes) as pool:
            made = sum(pool.map(calls_for, [(port, session, seconds)] * processes))
        folded = folded_records(conn)
        started = time.time()
        raw_request(conn, "GET", f"/tool-executions?session_id={session}&limit=1")
        first_read = time.time() - started
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    waiting = 2 * made - folded
    print(f"calls {made} ({made / seconds:.0f}/s), records {2 * made}, folded by the burst's end "
          f"{folded}, waiting {waiting} ({waiting / (2 * made / seconds) * 1000:.0f} ms of appends); "
          f"first journal read after it {first_read * 1000:.1f} ms")


if __name__ == "__main__":
    main()
