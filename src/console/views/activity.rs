//! The activity page: per provider, calls per minute and p50 / p99 latency
//! over the last hour, drawn as SVG on the server.

use maud::html;

use super::{Nav, layout, or_dash};
use crate::console::activity::{ProviderActivity, calls_chart, latency_chart};

fn ms(value: Option<i64>) -> String {
    or_dash(value.map(|v| format!("{v} ms")).as_deref()).to_owned()
}

/// The activity page.
pub fn activity_page(nav: &Nav, providers: &[ProviderActivity]) -> String {
    layout(
        "Activity",
        Some(nav),
        html! {
            p.hint { "This account's tool calls over the last hour, per provider, by minute." }
            @for provider in providers {
                section.activity data-provider=(provider.provider_id) {
                    h2 { code { (provider.provider_id) } }
                    p { (provider.total) " calls · p50 " (ms(provider.hour_p50)) " · p99 " (ms(provider.hour_p99)) }
                    (calls_chart(provider)) " " (latency_chart(provider))
                }
            }
            @if providers.is_empty() { p { "No calls in the last hour." } }
        },
    )
}
