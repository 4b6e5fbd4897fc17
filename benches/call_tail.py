#!/usr/bin/env python3
"""Where the slow answers of one-at-a-time tool calls come from: the server's
own time per request beside its write-ahead-log checkpoints.

`toolgate-bench`'s `remote_call_p99_vs_p50_c1` (target <= 2) has stayed near 3
(BENCHMARKS.md, issue 20). This starts the server with debug lines for every
request (`latency_ms`, the handler's own time) and every checkpoint pass
(`elapsed_ms`, and whether journal writes were held for it), sends CALLS
builtin calls (the bench's `roll_dice`) one at a time, then reads the log:
the server-side p50 and p99, and for the slowest 1 % whether each overlapped
a checkpoint pass or a held catch-up.

    python3 benches/call_tail.py target/release/toolgate [CALLS]

Needs Python 3 only.
"""
import os
import re
import signal
import sys
import tempfile
from datetime import datetime

from callgrind_common import json_request, launch

CALL = {"name": "roll_dice", "arguments": {"sides": 20, "count": 2}}
LINE = re.compile(r"^(\S+Z)\s+\w+\s+(.*)$")


def seconds(stamp):
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def read_log(path):
    """(requests, checkpoints): each an (end, duration, detail) triple in seconds."""
    requests, checkpoints = [], []
    with open(path) as log:
        for line in log:
            match = LINE.match(line)
            if not match:
                continue
            end, rest = seconds(match.group(1)), match.group(2)
            if "finished processing request" in rest and "tool-calls" in rest:
                latency = float(re.search(r"latency_ms=([\d.]+)", rest).group(1)) / 1000
                requests.append((end, latency, ""))
            elif "write-ahead log checkpointed" in rest:
                elapsed = float(re.search(r"elapsed_ms=(\d+)", rest).group(1)) / 1000
                kind = re.search(r"kind=\"?([\w-]+)", rest).group(1)
                frames = re.search(r"log_frames=(-?\d+)", rest).group(1)
                checkpoints.append((end, elapsed, f"{kind} {frames} frames"))
    return requests, checkpoints


def overlapping(request, checkpoints):
    end, duration, _ = request
    start = end - duration
    # A pass under 1 ms logs elapsed_ms=0: give it 1 ms, the log's resolution.
    return [c for c in checkpoints
            if c[0] - max(c[1], 0.001) <= end and c[0] >= start]


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    binary = args[0]
    calls = int(args[1]) if len(args) > 1 else 3000
    data = tempfile.mkdtemp(prefix="toolgate-call-tail-")
    os.environ["RUST_LOG"] = ("info,toolgate::api::request_trace=debug,"
                              "toolgate::store::checkpointer=debug")
    server, conn = launch([binary], data, data)
    try:
        session = json_request(conn, "POST", "/sessions", {"character": "Lanlan"})["data"]["id"]
        for _ in range(calls):
            json_request(conn, "POST", f"/sessions/{session}/tool-calls", CALL)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    requests, checkpoints = read_log(os.path.join(data, "log"))
    times = sorted(r[1] for r in requests)
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    print(f"server-side latency of {len(times)} calls: p50 {p50 * 1000:.3f} ms, "
          f"p99 {p99 * 1000:.3f} ms ({p99 / p50:.2f}x p50)")
    print(f"checkpoint passes: {len(checkpoints)}, held catch-ups: "
          f"{sum('catch-up' in c[2] for c in checkpoints)}")
    slow = [r for r in requests if r[1] >= p99]
    beside = [r for r in slow if overlapping(r, checkpoints)]
    print(f"the {len(slow)} calls at or over p99: {len(beside)} overlapped a checkpoint pass")
    for request in sorted(slow, key=lambda r: -r[1]):
        passes = ", ".join(f"{c[2]} ({c[1] * 1000:.0f} ms)" for c in overlapping(request, checkpoints))
        print(f"  {request[1] * 1000:.3f} ms  {passes or '-'}")


if __name__ == "__main__":
    main()
