#!/usr/bin/env python3
"""Where a one-at-a-time remote call's time goes, by segment, from the kernel's
own timestamps of the system calls on both sides (`perf record -a` on the
syscall tracepoints), for toolgate and for the bench's bare forwarder (the
floor) in the same run.

    python3 benches/call_segments.py target/release/toolgate-bench target/release/toolgate [SAMPLES]

It runs `toolgate-bench --phases remote,floor --samples SAMPLES` (default
3,000) under perf and follows each call of the unloaded, interleaved part
through the processes' sockets:

    client sends → server reads → server sends to the callback → callback reads
    → callback answers → server reads the answer → server answers → client reads

and prints the median (and p90) of each step, in microseconds. The server's own
two steps ("before the callback", "after the callback") are its work plus the
wake-ups inside it; the hops are the loopback and the wake-up of the thread on
the other side. A direct callback round trip has only the client's and the
callback's steps.

For builds that append the journal's records with `pwrite64` (before
0ba9da5), toolgate's two steps are also split at those appends.

It also prints, for each server's threads during those calls, how long a
wake-up took to run (the scheduler's `sched_waking` to the thread's
`sched_switch` in) and how often the thread was woken on the waker's own CPU.
On a VM a wake-up on the other vCPU, if that one is halted, costs an
interrupt to it first (BENCHMARKS.md, issue 20, thirty-seventh look). Needs
perf and root (system-wide tracepoints). `SEGMENTS_KEEP=FILE` keeps the
`perf script` text.
"""
import bisect
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

EVENTS = [
    "syscalls:sys_enter_recvfrom", "syscalls:sys_exit_recvfrom",
    # Sockets only: `write` is the log file's and tokio's eventfd wake-ups.
    "syscalls:sys_enter_writev", "syscalls:sys_enter_sendto",
    # The journal's log appends (toolgate's only `pwrite64`s on the call path)
    # in builds before 0ba9da5; later builds copy them into a mapping of the
    # log, which no system call marks, so their "of which" steps do not print.
    "syscalls:sys_enter_pwrite64",
    "sched:sched_process_exec",
    "sched:sched_waking", "sched:sched_switch",
]
LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<ts>[\d.]+):\s+"
                  r"(?P<sys>\w+):(?P<ev>\w+):\s*(?P<rest>.*)$")


@dataclass
class Trace:
    """What the analysis needs of the `perf script` text."""

    # Per process: a time-ordered list of (ts_us, kind, fd), kind 'recv' (a
    # read that returned data), 'send' or 'append'.
    by_pid: dict = field(default_factory=dict)
    comms: dict = field(default_factory=dict)  # pid -> the file it ran
    threads: dict = field(default_factory=dict)  # pid -> its tids
    # (ts_us, woken tid, waker's cpu, cpu it is woken on, ts_us it ran)
    wakings: list = field(default_factory=list)


def parse(script_text):
    trace = Trace()
    by_pid, comms = trace.by_pid, trace.comms
    entering = {}  # tid -> fd of the recvfrom it is in
    waking = {}  # tid -> its last waking, until it runs
    for line in script_text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        pid, tid, ts = int(m["pid"]), int(m["tid"]), float(m["ts"]) * 1e6
        ev, rest = m["ev"], m["rest"]
        trace.threads.setdefault(pid, set()).add(tid)
        if ev == "sched_waking":
            woken = re.search(r" pid=(\d+) .*target_cpu=(\d+)", rest)
            waking[int(woken[1])] = (ts, int(woken[1]), int(m["cpu"]), int(woken[2]))
        elif ev == "sched_switch":
            next_tid = int(re.search(r"next_pid=(\d+)", rest)[1])
            if next_tid in waking:
                trace.wakings.append((*waking.pop(next_tid), ts))
        elif ev == "sched_process_exec":
            # Thread names are the runtime's; the process is what it ran.
            comms[pid] = os.path.basename(re.search(r"filename=(\S+)", rest)[1])
        elif ev == "sys_enter_recvfrom":
            entering[tid] = int(re.search(r"fd: (0x[0-9a-f]+)", rest)[1], 16)
        elif ev == "sys_exit_recvfrom":
            fd = entering.pop(tid, None)
            ret = int(re.search(r"0x([0-9a-f]+)", rest)[1], 16)
            if fd is not None and 0 < ret < 1 << 62:
                by_pid.setdefault(pid, []).append((ts, "recv", fd))
        elif ev == "sys_enter_pwrite64":
            # The request path's appends, not the journal thread's or the
            # checkpointer's writes of the database.
            if m["comm"].startswith("tokio"):
                by_pid.setdefault(pid, []).append((ts, "append", -1))
        else:
            fd = int(re.search(r"fd: (0x[0-9a-f]+)", rest)[1], 16)
            if fd > 2:
                by_pid.setdefault(pid, []).append((ts, "send", fd))
    return trace


def next_event(events, start, kind, after, fd=None, not_fd=None):
    """Index of the first event of `kind` at or after index `start` and time
    `after` (optionally on `fd`, or not on `not_fd`)."""
    for i in range(start, min(len(events), start + 64)):
        ts, k, f = events[i]
        if ts < after or k != kind:
            continue
        if fd is not None and f != fd:
            continue
        if not_fd is not None and f == not_fd:
            continue
        return i
    return None


def server_cycles(events):
    """(t_read_request, t_send_callback, t_read_answer, t_answer, t_opened_row,
    t_outcome_row) per call of a forwarding server, from its own events; the
    rows' times are None where the server appends none (the floor)."""
    cycles, after = [], 0
    for a, (t0, kind, client_fd) in enumerate(events):
        # A call's own answer read is not the start of another.
        if kind != "recv" or a < after:
            continue
        b = next_event(events, a + 1, "send", t0, not_fd=client_fd)
        answered = next_event(events, a + 1, "send", t0, fd=client_fd)
        # Not a forward (a register, a session) when answered first.
        if b is None or (answered is not None and answered < b):
            continue
        t1, _, cb_fd = events[b]
        c = next_event(events, b + 1, "recv", t1, fd=cb_fd)
        d = None if c is None else next_event(events, c + 1, "send", events[c][0], fd=client_fd)
        if d is None:
            continue
        t2, t3 = events[c][0], events[d][0]
        # One call in flight only: the loaded part's calls overlap.
        if all(f in (client_fd, cb_fd, -1) for _, _, f in events[a:d + 1]):
            appends = [t for t, k, _ in events[a:d + 1] if k == "append"]
            opened = next((t for t in appends if t0 < t < t1), None)
            finished = next((t for t in appends if t2 < t < t3), None)
            cycles.append((t0, t1, t2, t3, opened, finished))
        after = d + 1
    return cycles


def last_before(events, kind, ts):
    best = None
    for t, k, _ in events:
        if t >= ts:
            break
        if k == kind:
            best = t
    return best


def first_after(events, kind, ts):
    for t, k, _ in events:
        if t > ts and k == kind:
            return t
    return None


def segments(server, bench):
    """Each call's (client send, client read) times and its steps in µs, the
    bench's client and callback around it."""
    times = [e[0] for e in bench]
    out = []
    for t0, t1, t2, t3, opened, finished in server_cycles(server):
        if t3 - t0 > 5000:  # not a one-at-a-time call
            continue
        lo = bisect.bisect_left(times, t0 - 5000)
        window = bench[lo:bisect.bisect_right(times, t3 + 5000)]
        c_send = last_before(window, "send", t0)
        b_recv = first_after(window, "recv", t1)
        b_send = first_after(window, "send", b_recv) if b_recv else None
        c_recv = first_after(window, "recv", t3)
        if None in (c_send, b_recv, b_send, c_recv) or not (t1 < b_recv < b_send < t2):
            continue
        row = {
            "client → server reads": t0 - c_send,
            "server, before the callback": t1 - t0,
            "→ callback reads": b_recv - t1,
            "callback answers": b_send - b_recv,
            "→ server reads the answer": t2 - b_send,
            "server, after the callback": t3 - t2,
            "→ client reads": c_recv - t3,
            "whole call": c_recv - c_send,
        }
        if opened and finished:
            row["  of which: request → opened row"] = opened - t0
            row["  of which: opened row → callback"] = t1 - opened
            row["  of which: answer → outcome row"] = finished - t2
            row["  of which: outcome row → answer"] = t3 - finished
        out.append(((c_send, c_recv), row))
    return out


def p50_p90(values):
    values = sorted(values)
    return values[len(values) // 2], values[int(len(values) * 0.9)]


def wake_ups(trace, pid, windows):
    """The server's threads' wake-ups within its one-at-a-time calls (their
    (start, end) `windows`): how many, p50 and p90 µs from waking to running,
    and the share woken on the waker's CPU."""
    tids = trace.threads.get(pid, set())
    windows = sorted(windows)
    starts = [w[0] for w in windows]
    delays, same = [], 0
    for ts, tid, waker_cpu, cpu, ran in trace.wakings:
        if tid not in tids:
            continue
        at = bisect.bisect_right(starts, ts) - 1
        if at < 0 or ts > windows[at][1]:
            continue
        delays.append(ran - ts)
        same += waker_cpu == cpu
    if not delays:
        return None
    return len(delays), *p50_p90(delays), same / len(delays)


def report(name, rows, wakes=None):
    print(f"\n{name}: {len(rows)} calls (µs, p50 / p90)")
    if not rows:
        return
    for key in max(rows, key=len):
        p50, p90 = p50_p90(r[key] for r in rows if key in r)
        print(f"  {key:32s} {p50:8.1f} {p90:8.1f}")
    if wakes:
        count, p50, p90, same = wakes
        print(f"  its threads' wake-ups: {count}, waking to running {p50:.1f} / {p90:.1f} µs, "
              f"{same:.0%} on the waker's CPU")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bench, server = sys.argv[1], sys.argv[2]
    samples = sys.argv[3] if len(sys.argv) > 3 else "3000"
    with tempfile.TemporaryDirectory(prefix="toolgate-segments-") as tmp:
        data = os.path.join(tmp, "perf.data")
        events = sum((["-e", e] for e in EVENTS), [])
        subprocess.run(["perf", "record", "-q", "-a", "-o", data, *events, "--",
                        bench, "--server", server, "--phases", "remote,floor",
                        "--samples", samples, "--duration", "1"],
                       check=True, stdout=sys.stderr)
        text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"], check=True,
                              capture_output=True, text=True).stdout
    if os.environ.get("SEGMENTS_KEEP"):
        with open(os.environ["SEGMENTS_KEEP"], "w") as kept:
            kept.write(text)
    trace = parse(text)
    by_pid, comms = trace.by_pid, trace.comms
    benches = [p for p, c in comms.items() if c.startswith("toolgate-bench")]
    toolgate = [p for p, c in comms.items() if c == "toolgate" and p in by_pid]
    if not benches or not toolgate:
        sys.exit(f"no toolgate or toolgate-bench process in the trace: {set(comms.values())}")
    main_bench = min(benches)  # the floor is its child, started later
    floors = [p for p in benches if p != main_bench and p in by_pid]
    servers = [("toolgate", toolgate[0])] + [("floor (bare forwarder)", f) for f in floors]
    for name, pid in servers:
        calls = segments(by_pid[pid], by_pid[main_bench])
        windows = [window for window, _ in calls]
        report(name, [row for _, row in calls], wake_ups(trace, pid, windows))


if __name__ == "__main__":
    main()
