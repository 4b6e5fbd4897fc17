//! Time per call of the trivial script through the sandbox (fresh runtime and
//! context, limits, JSON in and out). Run with `cargo bench --bench script_call`.

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use toolgate::tools::script::{ScriptLimits, run_blocking};

fn trivial_script(c: &mut Criterion) {
    let limits = ScriptLimits::default();
    let args = json!({"name": "Aria"});
    let script = "return { found: true, info: args.name };";
    c.bench_function("script_call/trivial", |b| {
        b.iter(|| {
            let out = run_blocking(std::hint::black_box(script), &args, &limits)
                .expect("trivial script succeeds");
            std::hint::black_box(out)
        })
    });
}

criterion_group!(benches, trivial_script);
criterion_main!(benches);
