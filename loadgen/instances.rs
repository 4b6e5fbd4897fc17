//! `instances` (with `--postgres`): builtin calls/s through one instance, then
//! through two instances on the same database with the load split between
//! them, in one run on one machine (the client, both servers and PostgreSQL
//! share its cores, so this measures what a second instance costs or gains
//! when nothing else is added, not a second machine).

use std::path::Path;
use std::sync::Arc;

use anyhow::ensure;

use super::{Api, Server, contains, drive, figure, progress};

/// The builtin call every request makes.
const CALL: &[u8] = br#"{"name":"roll_dice","arguments":{"sides":20,"count":2}}"#;

pub(crate) async fn instances_phase(
    args: &super::Args,
    binary: &Path,
    work: &Path,
    first: &Api,
    session: &str,
) -> anyhow::Result<()> {
    progress("builtin calls through one instance, then two on one database");
    let path: Arc<str> = format!("/sessions/{session}/tool-calls").into();
    let one = drive(
        args.concurrency,
        args.limit(),
        roll_dice(vec![first.clone()], path.clone()),
    )
    .await;
    one.check("builtin calls, one instance")?;
    let mut second = Server::start_in(binary, work, "data-second", &[]).await?;
    let other = Api {
        client: first.client.clone(),
        base: second.base_url.clone(),
    };
    let two = drive(
        args.concurrency,
        args.limit(),
        roll_dice(vec![first.clone(), other], path),
    )
    .await;
    second.stop().await?;
    two.check("builtin calls, two instances")?;
    figure("instances_one_builtin_calls_per_s", one.per_second());
    figure("instances_two_builtin_calls_per_s", two.per_second());
    figure(
        "instances_two_vs_one_throughput",
        two.per_second() / one.per_second().max(f64::MIN_POSITIVE),
    );
    Ok(())
}

/// A `roll_dice` call on the session's `path`, through `apis` in turn (the
/// `builtin` phase's call too, with one).
pub(crate) fn roll_dice(
    apis: Vec<Api>,
    path: Arc<str>,
) -> impl Fn(u64) -> futures::future::BoxFuture<'static, anyhow::Result<()>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |i: u64| {
        let request = apis[i as usize % apis.len()].post(&path, CALL);
        Box::pin(async move {
            let response = request.send().await?;
            let status = response.status();
            let bytes = response.bytes().await?;
            ensure!(
                status.is_success() && contains(&bytes, br#""status":"success""#),
                "roll_dice: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            Ok(())
        })
    }
}
