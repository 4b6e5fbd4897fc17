//! What the metrics add to one call: the counters and histograms a remote and
//! a builtin call record, and an HTTP request's, plus a scrape of a registry
//! that has seen 1,000 tool names. Run with `cargo bench --bench metrics`.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use toolgate::metrics::{ScrapeSnapshot, metrics, render};

fn per_call(c: &mut Criterion) {
    let m = metrics();
    let elapsed = Duration::from_micros(350);
    c.bench_function("metrics/remote_call", |b| {
        b.iter(|| {
            m.record_call(
                "remote",
                "success",
                std::hint::black_box("weather_lookup"),
                None,
                elapsed,
            );
            m.record_http("/sessions/{id}/tool-calls", "POST", 200, elapsed);
        })
    });
    c.bench_function("metrics/builtin_call", |b| {
        b.iter(|| {
            m.record_call("builtin", "success", "get_time", Some("get_time"), elapsed);
            m.record_http("/sessions/{id}/tool-calls", "POST", 200, elapsed);
        })
    });
    for i in 0..1000 {
        m.record_call("remote", "success", &format!("tool_{i}"), None, elapsed);
    }
    let snapshot = ScrapeSnapshot::default();
    c.bench_function("metrics/scrape_1000_names", |b| {
        b.iter(|| std::hint::black_box(render(&snapshot)))
    });
}

criterion_group!(benches, per_call);
criterion_main!(benches);
