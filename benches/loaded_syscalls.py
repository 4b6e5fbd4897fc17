#!/usr/bin/env python3
"""System calls toolgate makes per loaded remote call, by kind.

`toolgate-bench --phases remote` drives 16 remote calls at a time; once the
server is busy (more than 0.9 of a core over half a second), `perf stat`
counts the server's system calls by kind for WINDOW seconds. Each count is
divided by the calls made in that window, estimated from the bench's
`remote_call_per_s` (measured over the loaded phase the window lies in). It
prints the process's figure for each kind (`per_call KIND N`), then the
threads that made at least one in 200 calls, by thread name (`per_call_thread KIND NAME N`: the
runtime's workers, the journal thread, the checkpointer).

    python3 benches/loaded_syscalls.py target/release/toolgate-bench [target/release/toolgate]

Needs perf with the `syscalls` tracepoints (root, or perf_event_paranoid
allowing it) and Linux's /proc. It fails loudly when perf is missing or
refuses.
"""
import shutil
import subprocess
import sys
import tempfile
import time

from callgrind_common import LOADED_SERVER_CORES, bench_figures, child_server, process_cpu_seconds

WINDOW = 3
DURATION = 8
KINDS = ("writev", "write", "recvfrom", "read", "pwrite64", "pread64", "epoll_wait", "futex",
         "fsync", "fdatasync", "sched_yield", "madvise", "mmap", "munmap")


def wait_until_loaded(server, deadline, step=0.5):
    before = sum(process_cpu_seconds(server))
    while time.time() < deadline:
        time.sleep(step)
        after = sum(process_cpu_seconds(server))
        if after - before > LOADED_SERVER_CORES * step:
            return
        before = after
    sys.exit("the server never became busy: no loaded window to count")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    if shutil.which("perf") is None:
        sys.exit("perf is not installed: nothing to count with")
    command = [sys.argv[1], "--phases", "remote", "--duration", str(DURATION)]
    if len(sys.argv) == 3:
        command += ["--server", sys.argv[2]]
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    server = None
    while server is None and bench.poll() is None:
        server = child_server(bench.pid)
        time.sleep(0.1)
    if server is None:
        sys.exit(f"toolgate-bench ended before its server was found ({bench.returncode})")
    wait_until_loaded(server, time.time() + 60)
    events = [f"syscalls:sys_enter_{kind}" for kind in KINDS] + ["raw_syscalls:sys_enter", "context-switches"]
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        perf = subprocess.run(
            ["perf", "stat", "--per-thread", "-x", ",", "-o", out.name,
             *sum((["-e", e] for e in events), []), "-p", str(server), "--", "sleep", str(WINDOW)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if perf.returncode != 0:
            sys.exit(f"perf stat failed: {perf.stderr.strip()}")
        counts, by_thread = {}, {}
        for line in out.read().splitlines():
            # With --per-thread: "NAME-TID,COUNT,UNIT,EVENT,..."; a thread
            # that ended or began outside the window says "<not counted>".
            fields = line.split(",")
            if len(fields) < 4 or not fields[1].strip().isdigit():
                continue
            name, event, count = fields[0].rsplit("-", 1)[0], fields[3], int(fields[1])
            counts[event] = counts.get(event, 0) + count
            by_thread[(event, name)] = by_thread.get((event, name), 0) + count
    output = bench.communicate()[0]
    if bench.returncode != 0:
        sys.exit(f"toolgate-bench failed ({bench.returncode})")
    figures = bench_figures(output)
    calls = float(figures["remote_call_per_s"]) * WINDOW
    missing = [event for event in events if event not in counts]
    if missing:
        sys.exit(f"perf counted nothing for {', '.join(missing)}")
    print(f"remote_call_per_s {figures['remote_call_per_s']}")
    kind = {event: event.removeprefix("syscalls:sys_enter_").replace(":", "_") for event in events}
    for event in events:
        print(f"per_call {kind[event]} {counts[event] / calls:.2f}")
    for (event, thread), count in sorted(by_thread.items(), key=lambda item: events.index(item[0][0])):
        # Threads with a stray call or two in the window are left out.
        if count / calls >= 0.005 and event.startswith("syscalls:"):
            print(f"per_call_thread {kind[event]} {thread} {count / calls:.2f}")


if __name__ == "__main__":
    main()
