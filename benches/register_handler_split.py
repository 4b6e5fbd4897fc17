#!/usr/bin/env python3
"""How a register into 100 live sessions splits between toolgate's handler and
the rest: the handler's own time (the server's `latency_ms`) beside what the
client measures and the floor's bare fan-out of the same 100 events.

The client's `register_all_roles_100chars_p50_ms` came out as about the
floor's whole fan-out plus the handler (BENCHMARKS.md, issue 20, twenty-first
look), so `register_100chars_vs_direct_ratio` <= 10 needs a handler of at most
10 x the direct round trip minus the floor's fan-out; this prints that bound
for the run's own direct round trip.

    python3 benches/register_handler_split.py target/release/toolgate-bench [target/release/toolgate]

It runs `toolgate-bench --phases register,remote,floor` with request-level
debug lines and reads the server's log from the kept data directory. Needs
Python 3 only.
"""
import os
import re
import subprocess
import sys
import tempfile

from callgrind_common import bench_figures

# At its default --samples the bench times 300 registers one at a time, after
# as many registers of its back-to-back pairs (loadgen/main.rs, register_phase:
# `args.samples.min(300)` each).
SAMPLES = 300
REGISTERED = re.compile(r'remote tool registered .*affected=100\b')
FINISHED = re.compile(r'url\.path="/api/tools/register"\}.*finished processing request.*latency_ms=([\d.]+)')


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def handler_times(log_path):
    """The server's `latency_ms` of each 100-role register, in order. The
    one-at-a-time part never overlaps, so each register's answer line is the
    next register answer after its `remote tool registered` line."""
    times, waiting = [], False
    with open(log_path) as log:
        for line in log:
            if REGISTERED.search(line):
                waiting = True
            elif waiting:
                match = FINISHED.search(line)
                if match:
                    times.append(float(match.group(1)))
                    waiting = False
    return times


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    bench = sys.argv[1]
    keep = tempfile.mkdtemp(prefix="toolgate-register-split-")
    command = [bench, "--phases", "register,remote,floor", "--keep-dir", keep]
    if len(sys.argv) == 3:
        command += ["--server", sys.argv[2]]
    env = dict(os.environ, RUST_LOG="info,toolgate::api::request_trace=debug")
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"toolgate-bench failed ({run.returncode}):\n{run.stderr[-3000:]}")
    figures = bench_figures(run.stdout)
    times = handler_times(os.path.join(keep, "server.log"))
    if len(times) < 2 * SAMPLES:
        sys.exit(f"found {len(times)} one-at-a-time 100-role registers in {keep}/server.log, "
                 f"expected at least {2 * SAMPLES}")
    timed = times[SAMPLES:2 * SAMPLES]
    direct = float(figures["callback_direct_p50_ms"])
    fanout = float(figures["floor_fanout_100_p50_ms"])
    client = float(figures["register_all_roles_100chars_p50_ms"])
    print(f"register_handler_100chars_p50_ms {percentile(timed, 50):.3f}")
    print(f"register_handler_100chars_p99_ms {percentile(timed, 99):.3f}")
    print(f"register_all_roles_100chars_p50_ms {client:.3f}")
    print(f"floor_fanout_100_p50_ms {fanout:.3f}")
    print(f"callback_direct_p50_ms {direct:.3f}")
    print(f"client_minus_handler_p50_ms {client - percentile(timed, 50):.3f}")
    print(f"handler_bound_for_ratio_10_ms {10 * direct - fanout:.3f}")
    print(f"log {keep}/server.log")


if __name__ == "__main__":
    main()
