#!/usr/bin/env python3
"""Whose CPU a register into 100 live sessions takes: the server's and the
load generator's user and kernel time during `toolgate-bench --phases
register`'s one-at-a-time part (read from /proc every 50 ms, in ticks of
10 ms, over the 0.6 and 1.2 s after the bench announces 100 characters).

    python3 benches/register_cpu_split.py     # from the project's root, after cargo build --release

Needs Python 3 and Linux's /proc.
"""
import subprocess, time, os, sys
bench = subprocess.Popen(["./target/release/toolgate-bench", "--phases", "register"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
import threading
marks = []
def read_err():
    for line in bench.stderr:
        marks.append((time.time(), line.strip()))
threading.Thread(target=read_err, daemon=True).start()
def ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]), int(f[12]))
    except Exception:
        return None
server = None
samples = []
while bench.poll() is None:
    if server is None:
        out = subprocess.run(["pgrep", "-f", "toolgate serve"], capture_output=True, text=True).stdout.split()
        server = int(out[0]) if out else None
    samples.append((time.time(), ticks(bench.pid), ticks(server) if server else None))
    time.sleep(0.05)
start = next(t for t, m in marks if "100 characters" in m)
# the sequential parts: from the mark until 1.2 s later
def at(t):
    return min(samples, key=lambda s: abs(s[0] - t))
for window in (0.6, 1.2):
    a, b = at(start + 0.1), at(start + 0.1 + window)
    print(f"window {window}s: bench user {b[1][0]-a[1][0]} sys {b[1][1]-a[1][1]}, server user {b[2][0]-a[2][0]} sys {b[2][1]-a[2][1]} ticks, wall {b[0]-a[0]:.2f}s")
print(bench.stdout.read())
