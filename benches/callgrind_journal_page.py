#!/usr/bin/env python3
"""Instructions per journal page of a toolgate binary, under callgrind.

The journal's worst query in `toolgate-bench` (a 200-row `offset=1000` page of
the largest session) costs a few milliseconds; on a noisy 2-core VM its time
moves more with the machine than with the code, so changes are decided by
counting instructions instead (BENCHMARKS.md, issue 20). The server runs under
`valgrind --tool=callgrind` twice on a copy of a database seeded by
`toolgate-bench --phases journal --keep-dir DIR`, answering FEW and then MANY
identical `GET /tool-executions?QUERY`; the difference of the two totals over
MANY - FEW is one page, start-up excluded. Every answer is checked: HTTP 200,
and the same number of rows (not none) on every page.

    python3 benches/callgrind_journal_page.py target/release/toolgate DIR [QUERY] [FEW MANY]

QUERY defaults to the bench's worst page,
`session_id=HEAVY&sort_by=created_at&limit=200&offset=1000`, where HEAVY (the
session with most rows) is found in the database. With `--top N` it also
prints the N functions whose inclusive count grew most per page. Needs
valgrind (callgrind_annotate) and Python 3.
"""
import json
import os
import shutil
import sqlite3
import sys
import tempfile

from callgrind_common import TOKEN, measure, start_server, stop, take_top

DEFAULT_QUERY = "session_id={heavy}&sort_by=created_at&limit=200&offset=1000"


def heavy_session(database):
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT session_id FROM tool_execution_record GROUP BY session_id "
            "ORDER BY COUNT(*) DESC LIMIT 1").fetchone()
    if row is None:
        sys.exit(f"{database} has no journal rows")
    return row[0]


def run(binary, seeded, query, pages, out):
    work = tempfile.mkdtemp(prefix="toolgate-callgrind-journal-")
    data = os.path.join(work, "data")
    # A copy: the server's start-up writes (recovery, migrations) must not
    # make the second run differ from the first.
    shutil.copytree(seeded, data)
    server, conn = start_server(binary, data, out, work, timeout=180)
    sizes = set()
    for _ in range(pages):
        conn.request("GET", f"/tool-executions?{query}",
                     headers={"authorization": f"Bearer {TOKEN}"})
        answer = conn.getresponse()
        text = answer.read()
        if answer.status != 200:
            sys.exit(f"GET /tool-executions?{query}: HTTP {answer.status}: {text[:300]!r}")
        sizes.add(len(json.loads(text)["data"]))
    if sizes == {0} or len(sizes) != 1:
        sys.exit(f"the pages had {sorted(sizes)} rows: pick a query that matches rows")
    result = stop(server, out)
    shutil.rmtree(work, ignore_errors=True)
    print(f"rows per page: {sizes.pop()}", file=sys.stderr)
    return result


def main():
    args = sys.argv[1:]
    top = take_top(args)
    if len(args) < 2:
        sys.exit(__doc__)
    binary, kept = args[0], args[1]
    seeded = os.path.join(kept, "data") if os.path.isdir(os.path.join(kept, "data")) else kept
    database = os.path.join(seeded, "toolgate.db")
    if not os.path.exists(database):
        sys.exit(f"no {database}: seed one with toolgate-bench --phases journal --keep-dir DIR")
    rest = args[2:]
    query = DEFAULT_QUERY
    if rest and not rest[0].isdigit():
        query = rest.pop(0)
    query = query.format(heavy=heavy_session(database))
    few, many = (int(rest[0]), int(rest[1])) if len(rest) >= 2 else (10, 60)
    measure("instructions_per_journal_page", few, many,
            lambda n, out: run(binary, seeded, query, n, out), top)


if __name__ == "__main__":
    main()
