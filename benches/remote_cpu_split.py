#!/usr/bin/env python3
"""Whose CPU a loaded remote call takes: toolgate's, or the load generator's
(its client and its in-process callback server), while `toolgate-bench
--phases remote` drives 16 calls at a time and then the direct round trip
alone.

`remote_c16_vs_c1_throughput` is limited by the CPU a call costs when both
cores are busy; this tells how much of it is toolgate's. It reads each
process's user and system time from /proc every 250 ms and prints, for the
loaded remote window and the loaded direct window that follows it, the cores
each process used (toolgate's also as user and system time) and the CPU
microseconds per call. For the remote window it also prints toolgate's CPU
microseconds per call by thread name (`remote_c16_thread_us_per_call NAME
US`): the runtime's workers, the journal thread (its folds) and the rest.

    python3 benches/remote_cpu_split.py target/release/toolgate-bench [target/release/toolgate]

Needs Python 3 and Linux's /proc.
"""
import subprocess
import sys
import time

from callgrind_common import (
    LOADED_SERVER_CORES,
    bench_figures,
    child_server,
    process_cpu_seconds,
    thread_cpu_seconds,
)

DURATION = 5


def window(samples, busy):
    """The longest run of samples in which `busy(bench_cores, server_cores)`
    holds, as ((seconds, bench CPU, server user CPU, server system CPU),
    index of its first sample, index of its last)."""
    best, run, first = ((0.0, 0.0, 0.0, 0.0), 0, 0), None, 0
    for index, (before, after) in enumerate(zip(samples, samples[1:])):
        step = tuple(b - a for a, b in zip(before, after))
        dt = step[0]
        if busy(step[1] / dt, (step[2] + step[3]) / dt):
            if run is None:
                run, first = step, index
            else:
                run = tuple(r + d for r, d in zip(run, step))
            best = max(best, (run, first, index + 1))
        else:
            run = None
    return best


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    command = [sys.argv[1], "--phases", "remote", "--duration", str(DURATION)]
    if len(sys.argv) == 3:
        command += ["--server", sys.argv[2]]
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    server, samples, threads, start = None, [], [], time.time()
    while bench.poll() is None:
        server = server or child_server(bench.pid)
        if server:
            try:
                bench_cpu, server_cpu = process_cpu_seconds(bench.pid), process_cpu_seconds(server)
                server_threads = thread_cpu_seconds(server)
            except OSError:  # the server has ended: the bench is finishing
                break
            samples.append((time.time() - start, sum(bench_cpu), *server_cpu))
            threads.append(server_threads)
        time.sleep(0.25)
    # The loop may end on the server's exit, before the bench's own: wait
    # for the bench, so that its exit status is known.
    out = bench.communicate()[0]
    if bench.returncode != 0:
        sys.exit(f"toolgate-bench failed ({bench.returncode})")
    figures = bench_figures(out)
    remote_rate = float(figures["remote_call_per_s"])
    direct_rate = float(figures["callback_direct_loaded_per_s"])
    # Loaded remote calls keep toolgate on more than one core (one call at a
    # time, before them, keeps it on less); the direct window leaves it idle.
    remote, remote_first, remote_last = window(samples, lambda bench, server: server > LOADED_SERVER_CORES)
    direct, _, _ = window(samples, lambda bench, server: server < 0.05 and bench > 1.0)
    if remote[0] < DURATION / 2 or direct[0] < DURATION / 2:
        sys.exit(f"the loaded windows were not found in the samples ({remote[0]:.1f} s, {direct[0]:.1f} s)")
    for name, (seconds, bench_cpu, server_user, server_system), rate in (
        ("remote_c16", remote, remote_rate),
        ("direct_c16", direct, direct_rate),
    ):
        server_cpu = server_user + server_system
        print(f"{name}_per_s {rate:.0f}")
        print(f"{name}_bench_cores {bench_cpu / seconds:.2f}")
        print(f"{name}_server_cores {server_cpu / seconds:.2f}")
        print(f"{name}_server_user_cores {server_user / seconds:.2f}")
        print(f"{name}_server_system_cores {server_system / seconds:.2f}")
        print(f"{name}_bench_us_per_call {1e6 * bench_cpu / seconds / rate:.1f}")
        print(f"{name}_server_us_per_call {1e6 * server_cpu / seconds / rate:.1f}")
    before, after = threads[remote_first], threads[remote_last]
    for name in sorted(after, key=lambda name: before.get(name, 0.0) - after[name]):
        spent = after[name] - before.get(name, 0.0)
        if spent > 0:
            print(f"remote_c16_thread_us_per_call {name} {1e6 * spent / remote[0] / remote_rate:.1f}")


if __name__ == "__main__":
    main()
