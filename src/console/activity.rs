//! The activity page's figures: per provider, calls per minute and the p50 /
//! p99 latency per minute over the last hour, and the SVG charts drawing them.

use std::collections::BTreeMap;

use maud::{Markup, html};

/// Minutes the page covers.
pub const MINUTES: usize = 60;
const MINUTE_MS: i64 = 60_000;

/// One call: its provider, when it started and how long it took.
#[derive(Debug, Clone)]
pub struct Sample {
    pub provider_id: String,
    pub started_at: i64,
    pub duration_ms: i64,
}

/// One provider's hour.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderActivity {
    pub provider_id: String,
    pub calls: [u32; MINUTES],
    pub p50: [Option<i64>; MINUTES],
    pub p99: [Option<i64>; MINUTES],
    pub total: u32,
    pub hour_p50: Option<i64>,
    pub hour_p99: Option<i64>,
}

/// The nearest-rank percentile of sorted durations.
fn percentile(sorted: &[i64], pct: usize) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (sorted.len() * pct).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// Groups `samples` of the hour ending at `now_ms` by provider and minute.
pub fn summarise(samples: &[Sample], now_ms: i64) -> Vec<ProviderActivity> {
    let start = now_ms - MINUTES as i64 * MINUTE_MS;
    let mut by_provider: BTreeMap<&str, Vec<Vec<i64>>> = BTreeMap::new();
    for sample in samples
        .iter()
        .filter(|s| s.started_at >= start && s.started_at < now_ms)
    {
        let minute = ((sample.started_at - start) / MINUTE_MS) as usize;
        by_provider
            .entry(&sample.provider_id)
            .or_insert_with(|| vec![Vec::new(); MINUTES])[minute.min(MINUTES - 1)]
        .push(sample.duration_ms);
    }
    by_provider
        .into_iter()
        .map(|(provider_id, mut minutes)| {
            let mut all: Vec<i64> = minutes.iter().flatten().copied().collect();
            all.sort_unstable();
            let mut activity = ProviderActivity {
                provider_id: provider_id.to_owned(),
                calls: [0; MINUTES],
                p50: [None; MINUTES],
                p99: [None; MINUTES],
                total: all.len() as u32,
                hour_p50: percentile(&all, 50),
                hour_p99: percentile(&all, 99),
            };
            for (i, durations) in minutes.iter_mut().enumerate() {
                durations.sort_unstable();
                activity.calls[i] = durations.len() as u32;
                activity.p50[i] = percentile(durations, 50);
                activity.p99[i] = percentile(durations, 99);
            }
            activity
        })
        .collect()
}

const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 80.0;

fn line(values: &[Option<i64>; MINUTES], max: i64) -> String {
    let step = WIDTH / MINUTES as f64;
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .map(|(i, v)| {
            let x = i as f64 * step + step / 2.0;
            let y = HEIGHT - (v as f64 / max as f64) * (HEIGHT - 4.0);
            format!("{x:.1},{y:.1}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Calls per minute as bars.
pub fn calls_chart(activity: &ProviderActivity) -> Markup {
    let max = activity.calls.iter().copied().max().unwrap_or(0).max(1);
    let step = WIDTH / MINUTES as f64;
    html! {
        svg.chart width=(WIDTH) height=(HEIGHT + 14.0) viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 14.0) } role="img" aria-label={ "calls per minute of " (activity.provider_id) } {
            @for (i, calls) in activity.calls.iter().enumerate() {
                @let h = f64::from(*calls) / f64::from(max) * (HEIGHT - 4.0);
                rect.bar x=(format!("{:.1}", i as f64 * step)) y=(format!("{:.1}", HEIGHT - h)) width=(format!("{:.1}", step - 1.0)) height=(format!("{h:.1}")) {}
            }
            text x="2" y=(HEIGHT + 12.0) { "-60 min" }
            text x=(WIDTH - 60.0) y=(HEIGHT + 12.0) { "max " (max) "/min" }
        }
    }
}

/// p50 and p99 latency per minute as two lines.
pub fn latency_chart(activity: &ProviderActivity) -> Markup {
    let max = activity
        .p99
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    html! {
        svg.chart width=(WIDTH) height=(HEIGHT + 14.0) viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 14.0) } role="img" aria-label={ "latency of " (activity.provider_id) } {
            polyline.p99 points=(line(&activity.p99, max)) {}
            polyline.p50 points=(line(&activity.p50, max)) {}
            text x="2" y=(HEIGHT + 12.0) { "p50 (green) / p99 (red)" }
            text x=(WIDTH - 70.0) y=(HEIGHT + 12.0) { "max " (max) " ms" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_per_provider_and_minute_with_percentiles() {
        let now = 10 * 60 * MINUTE_MS;
        let mut samples: Vec<Sample> = (1..=100)
            .map(|d| Sample {
                provider_id: "builtin".into(),
                started_at: now - 30_000,
                duration_ms: d,
            })
            .collect();
        samples.push(Sample {
            provider_id: "remote:x".into(),
            started_at: now - 59 * MINUTE_MS - 1,
            duration_ms: 7,
        });
        samples.push(Sample {
            provider_id: "remote:x".into(),
            started_at: now - 61 * MINUTE_MS,
            duration_ms: 7,
        });
        let hour = summarise(&samples, now);
        assert_eq!(hour.len(), 2);
        assert_eq!(hour[0].provider_id, "builtin");
        assert_eq!(hour[0].calls[MINUTES - 1], 100);
        assert_eq!(hour[0].p50[MINUTES - 1], Some(50));
        assert_eq!(hour[0].p99[MINUTES - 1], Some(99));
        assert_eq!(hour[1].total, 1, "the call before the hour is left out");
        assert_eq!(hour[1].calls[0], 1);
    }
}
