"""What the bench scripts beside this file share: a free port, a server
start under callgrind, a profile's total and its per-function counts, the
`--top N` report of what grew between two runs, a process's CPU time, and
finding and reading a `toolgate-bench` run's server and figures."""
import http.client
import os
import re
import subprocess
import sys
import time

TOKEN = "tg_bench_admin_token_0123456789abcdef"


# A server using more than this many cores is under the bench's loaded
# phase (one call at a time keeps it below; remote_cpu_split, loaded_syscalls).
LOADED_SERVER_CORES = 0.9


def _stat_cpu(text):
    """(user, system) seconds from a /proc `stat` line."""
    # The command name may hold spaces and parentheses: fields follow its last ")".
    fields = text.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def process_cpu_seconds(pid):
    """`pid`'s (user, system) CPU time so far, in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        return _stat_cpu(stat.read())


def thread_cpu_seconds(pid):
    """`pid`'s CPU time so far (user + system, in seconds) by thread name:
    threads of one name (a runtime's workers) are summed. A thread that has
    ended is not counted, so a group's figure is only meaningful over a
    window in which its threads lived throughout."""
    groups = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                text = stat.read()
        except OSError:  # a thread that just ended
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        groups[name] = groups.get(name, 0.0) + sum(_stat_cpu(text))
    return groups


def child_server(bench_pid):
    """The toolgate server `toolgate-bench` started: its child process, listed
    under whichever of its threads spawned it; None before it has one."""
    pids = []
    try:
        for task in os.listdir(f"/proc/{bench_pid}/task"):
            with open(f"/proc/{bench_pid}/task/{task}/children") as children:
                pids += [int(pid) for pid in children.read().split()]
    except OSError:
        return None
    return pids[0] if pids else None


def bench_figures(stdout):
    """`toolgate-bench`'s `name value` lines as a dict of strings."""
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def free_port():
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(binary, data, out, log_dir, timeout=120):
    """The toolgate binary under callgrind on `data`; returns the process and
    a connection to it once it listens."""
    return launch(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary],
                  data, log_dir, timeout)


def launch(command, data, log_dir, timeout=120):
    """`command` (the toolgate binary, maybe behind a wrapper) serving on
    `data` with the bench's admin token, its log in `log_dir`/log; returns the
    process and a connection to it once it listens."""
    port = free_port()
    env = dict(os.environ, TOOLGATE_ADMIN_TOKEN=TOKEN)
    for name in ("TOOLGATE_DATABASE_URL", "TOOLGATE_CONFIG", "TOOLGATE_LISTEN", "TOOLGATE_DATA_DIR"):
        env.pop(name, None)
    server = subprocess.Popen(
        command + ["serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(log_dir, "log"), "w"))
    deadline = time.time() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.connect()
            return server, conn
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                sys.exit(f"toolgate did not start; see {log_dir}/log")
            time.sleep(0.2)


def total(out):
    with open(out) as profile:
        for line in profile:
            if line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {out}")


def functions(out):
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                          capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)", line)
        if match and "PROGRAM TOTALS" not in line:
            counts[match.group(2)] = counts.get(match.group(2), 0) + int(match.group(1).replace(",", ""))
    return counts


def take_top(args):
    """`--top N` taken out of `args`; 0 when absent."""
    if "--top" not in args:
        return 0
    at = args.index("--top")
    top = int(args[at + 1])
    del args[at:at + 2]
    return top


def print_top(outs, units, top):
    """The `top` functions whose inclusive count grew most per unit of work
    between the two profiles."""
    before, after = functions(outs[0]), functions(outs[1])
    grown = sorted(((after.get(k, 0) - before.get(k, 0)) / units, k) for k in after)
    for per_unit, name in reversed(grown[-top:]):
        print(f"{per_unit:12.0f} {name[:160]}")


def raw_request(conn, method, path, body=None):
    """A request with the bench's token (and `body` as JSON, if any); the
    answer's bytes. Exits on any status >= 300."""
    import json
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    answer = conn.getresponse()
    text = answer.read()
    if answer.status >= 300:
        sys.exit(f"{method} {path}: HTTP {answer.status}: {text[:300]!r}")
    return text


def json_request(conn, method, path, body):
    """A JSON request with the bench's token; its answer parsed. Exits on any
    status >= 300."""
    import json
    return json.loads(raw_request(conn, method, path, body))


def stop(server, out, timeout=600):
    """Stops the server (SIGTERM, as an operator would) and returns its
    profile's total."""
    import signal
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=timeout)
    return total(out)


def measure(figure, few, many, run, top):
    """Runs `run(n, out)` for FEW and then MANY units of work, each with its
    own profile file, and prints `figure`: the instructions per unit (the
    difference of the totals over MANY - FEW), then `--top` if asked."""
    import tempfile
    work = tempfile.mkdtemp(prefix="toolgate-callgrind-out-")
    outs = [os.path.join(work, f"callgrind.{n}.out") for n in (few, many)]
    totals = [run(n, out) for n, out in zip((few, many), outs)]
    print(f"{figure} {(totals[1] - totals[0]) / (many - few):.0f}")
    print(f"profiles {outs[0]} {outs[1]}", file=sys.stderr)
    if top:
        print_top(outs, many - few, top)


def main_sized(doc, figure, run, defaults=(100, 4, 24)):
    """The main of a bench whose command line is `BINARY [N FEW MANY]
    [--top K]`: measures `figure` over `run(binary, n, units, out)` for FEW
    and MANY units of work, each on N of whatever it sets up (sessions,
    characters)."""
    args = sys.argv[1:]
    top = take_top(args)
    if not args:
        sys.exit(doc)
    binary = args[0]
    size, few, many = (int(a) for a in args[1:4]) if len(args) >= 4 else defaults
    measure(figure, few, many, lambda units, out: run(binary, size, units, out), top)
