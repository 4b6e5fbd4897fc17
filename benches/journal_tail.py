#!/usr/bin/env python3
"""Where a journal query's slow answers come from: per-request times beside
what the kernel and the server's process did during each request.

`toolgate-bench`'s `session_status` variant (a random session, `status=error`)
has a p50 near 0.5 ms but a p99 of 2-6 ms on the 2-core VM (BENCHMARKS.md,
issue 20). This starts the server on a data directory kept by
`toolgate-bench --phases journal --keep-dir DIR` and sends the bench's first
variants in its order, one request at a time, reading before and after each
request the server's page faults and context switches (`/proc/PID/stat`,
`/proc/PID/status`), the machine's CPU time by kind (`/proc/stat`: iowait,
steal) and its memory events (`/proc/vmstat`). It prints the slowest answers
with those differences, and how the slow ones differ from the rest.

    python3 benches/journal_tail.py target/release/toolgate DIR [SAMPLES]

Needs Python 3 only.
"""
import os
import random
import sqlite3
import sys
import tempfile
import time

import signal

from callgrind_common import TOKEN, launch

VMSTAT = ("pgmajfault", "pgfault", "pgpgin", "pgpgout", "nr_dirty", "nr_writeback")
CPU_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def vmstat():
    values = {}
    with open("/proc/vmstat") as stat:
        for line in stat:
            name, value = line.split()
            if name in VMSTAT:
                values[name] = int(value)
    return values


def cpu():
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:1 + len(CPU_KINDS)]
    return dict(zip(CPU_KINDS, map(int, fields)))


def process(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    values = {"minflt": int(fields[7]), "majflt": int(fields[9]),
              "utime": int(fields[11]), "stime": int(fields[12])}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                values["vcsw"] = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                values["ivcsw"] = int(line.split()[1])
    return values


def snapshot(pid):
    return {**vmstat(), **{f"cpu_{k}": v for k, v in cpu().items()}, **process(pid)}


def delta(before, after):
    return {name: after[name] - before[name] for name in after
            if name not in ("nr_dirty", "nr_writeback")} | {
        "nr_dirty": after["nr_dirty"], "nr_writeback": after["nr_writeback"]}


def sessions_of(database):
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    rows = db.execute("SELECT DISTINCT session_id FROM tool_execution_record").fetchall()
    db.close()
    return [row[0] for row in rows]


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    binary, data = args[0], args[1]
    samples = int(args[2]) if len(args) > 2 else 500
    database = os.path.join(data, "data", "toolgate.db")
    sessions = sessions_of(database)
    log_dir = tempfile.mkdtemp(prefix="toolgate-journal-tail-")
    print(f"server log: {log_dir}/log")
    server, conn = launch([binary], os.path.join(data, "data"), log_dir)
    headers = {"authorization": f"Bearer {TOKEN}"}
    rng = random.Random(11)
    try:
        for label, make in (("session", lambda: f"session_id={rng.choice(sessions)}"),
                            ("session_status",
                             lambda: f"session_id={rng.choice(sessions)}&status=error")):
            results = []
            for _ in range(samples):
                path = f"/tool-executions?{make()}"
                before = snapshot(server.pid)
                started = time.perf_counter()
                conn.request("GET", path, headers=headers)
                answer = conn.getresponse()
                answer.read()
                elapsed = (time.perf_counter() - started) * 1000
                after = snapshot(server.pid)
                if answer.status != 200:
                    sys.exit(f"{path}: HTTP {answer.status}")
                results.append((elapsed, delta(before, after), path))
            report(label, results)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


def report(label, results):
    times = sorted(r[0] for r in results)
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    print(f"{label}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, max {times[-1]:.3f} ms")
    slow = sorted(results, key=lambda r: -r[0])[:8]
    for elapsed, change, path in slow:
        shown = {k: v for k, v in change.items() if v}
        index = results.index((elapsed, change, path))
        print(f"  #{index} {elapsed:.3f} ms {shown}")
    fast = [r[1] for r in results if r[0] <= p50]
    means = {k: sum(c[k] for c in fast) / len(fast) for k in fast[0]}
    print(f"  mean of the answers at or under p50: "
          f"{ {k: round(v, 2) for k, v in means.items() if v} }")


if __name__ == "__main__":
    main()
