//! Issue 20's acceptance: `toolgate-bench` prints each of the issue's figures
//! as a line of its own (`name value`). The bench runs here for real, on short
//! phases and a small journal, against the toolgate binary this build made;
//! no figure's size is asserted (performance is measured, never tested).

mod common;

use std::collections::HashMap;
use std::process::Command;

/// The lines issue 20 asks `toolgate-bench` to print.
const ISSUE_20_LINES: [&str; 9] = [
    "remote_overhead_ratio_c1",
    "remote_overhead_ratio_c16",
    "builtin_vs_direct_ratio",
    "journal_worst_vs_best_ratio",
    "register_100chars_vs_direct_ratio",
    "remote_call_p99_vs_p50_c1",
    "remote_c16_vs_c1_throughput",
    "list_1000_tools_p50_ms",
    "model_sessions_2k_rss_mb",
];

/// The floor's lines: the same ratios through a bare hyper server (the
/// journal's: the bare server's answer of toolgate's worst page over
/// toolgate's best), the least the matching toolgate ratios can be on the
/// machine of the run.
const FLOOR_LINES: [&str; 6] = [
    "floor_remote_overhead_ratio_c1",
    "floor_remote_call_p99_vs_p50_c1",
    "floor_remote_overhead_ratio_c16",
    "floor_remote_c16_vs_c1_throughput",
    "floor_register_100_vs_direct_ratio",
    "floor_journal_worst_vs_best_ratio",
];

/// Every `name value` line of the bench's standard output, by name.
fn figures(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            let (name, value) = (parts.next()?, parts.next()?);
            parts
                .next()
                .is_none()
                .then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
}

#[test]
fn the_bench_prints_every_issue_20_figure_on_a_line_of_its_own() {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_toolgate-bench"));
    bench.args([
        "--quick",
        "--server",
        env!("CARGO_BIN_EXE_toolgate"),
        "--phases",
        // `generation` and (on PostgreSQL) `instances` start a second
        // server on the same database.
        "register,remote,builtin,tools_list,sessions_rss,journal,floor,generation,instances",
        "--rows",
        "3000",
        "--samples",
        "40",
        "--duration",
        "0.3",
        "--concurrency",
        "4",
    ]);
    // The suite's PostgreSQL pass runs the bench there too.
    if let Some(server) = common::database::postgres_server() {
        bench.args(["--postgres", &server]);
    }
    let output = bench.output().expect("toolgate-bench starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "toolgate-bench failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let figures = figures(&stdout);
    for name in ISSUE_20_LINES.into_iter().chain(FLOOR_LINES) {
        let value = figures
            .get(name)
            .unwrap_or_else(|| panic!("no line {name:?} in the bench's output:\n{stdout}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|err| panic!("{name} {value:?} is not a number ({err})"));
        assert!(
            value.is_finite() && value > 0.0,
            "{name} {value} is not a positive figure"
        );
    }
}
