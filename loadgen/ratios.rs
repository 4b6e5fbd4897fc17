//! Every figure printed is also kept, so that the run can end with the ratios
//! issue 20's targets are stated in, each from figures of this one run.

use std::sync::Mutex;

static FIGURES: Mutex<Vec<(String, f64)>> = Mutex::new(Vec::new());

/// Keeps a printed figure (the last value of a name wins).
pub fn record(name: &str, value: f64) {
    FIGURES
        .lock()
        .expect("figures lock")
        .push((name.to_owned(), value));
}

fn recorded(name: &str) -> Option<f64> {
    FIGURES
        .lock()
        .expect("figures lock")
        .iter()
        .rev()
        .find(|(recorded, _)| recorded == name)
        .map(|(_, value)| *value)
}

/// `(ratio, numerator, denominator)`: each ratio line and the figures it
/// divides.
const RATIOS: &[(&str, &str, &str)] = &[
    (
        "remote_overhead_ratio_c1",
        "remote_call_overhead_p50_ms",
        "callback_direct_p50_ms",
    ),
    (
        "remote_overhead_ratio_c16",
        "remote_call_loaded_overhead_p50_ms",
        "callback_direct_loaded_p50_ms",
    ),
    (
        "builtin_vs_direct_ratio",
        "builtin_call_per_s",
        "callback_direct_loaded_per_s",
    ),
    (
        "journal_worst_vs_best_ratio",
        "journal_query_worst_p99_ms",
        "journal_query_best_p99_ms",
    ),
    (
        "floor_journal_worst_vs_best_ratio",
        "floor_journal_worst_p99_ms",
        "journal_query_best_p99_ms",
    ),
    (
        "register_100chars_vs_direct_ratio",
        "register_all_roles_100chars_p50_ms",
        "callback_direct_p50_ms",
    ),
    (
        "remote_call_p99_vs_p50_c1",
        "remote_call_unloaded_p99_ms",
        "remote_call_unloaded_p50_ms",
    ),
    (
        "remote_c16_vs_c1_throughput",
        "remote_call_per_s",
        "remote_call_unloaded_per_s",
    ),
    (
        "list_1000_tools_vs_direct_ratio",
        "list_1000_tools_p50_ms",
        "callback_direct_p50_ms",
    ),
];

/// Prints each ratio whose two figures this run measured.
pub fn print_ratios() {
    for (ratio, numerator, denominator) in RATIOS {
        if let (Some(top), Some(bottom)) = (recorded(numerator), recorded(denominator))
            && bottom > 0.0
        {
            println!("{ratio} {:.3}", top / bottom);
        }
    }
}
