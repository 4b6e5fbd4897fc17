//! A live model session's events as a `text/event-stream` body: each event
//! framed once, into one buffer of its exact length.
//!
//! axum's `Sse` builds an event field by field in a buffer that grows three
//! times, scans the data for line breaks line by line, and resets its
//! keep-alive timer at every event: about 2,000 instructions an event, and a
//! registration into 100 live sessions sends 100 of them (BENCHMARKS.md,
//! issue 20). Event bodies here are JSON, which has no line break outside its
//! strings and escapes those inside them, so an event is one `data:` line;
//! a body with a break anyway is split into `data:` lines as the format
//! requires, never written raw (a raw break would end the event early and
//! let the rest of the body pass for fields of its own).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::{Interval, MissedTickBehavior};

use crate::model_sessions::ModelSessionEvent;

/// The comment sent when the keep-alive interval comes round.
const KEEP_ALIVE_COMMENT: &[u8] = b":\n\n";

/// `events` as SSE frames, with a comment every `keep_alive` so that idle
/// connections (and proxies) do not time out; ends when `events` ends.
pub struct EventFrames<S> {
    events: S,
    keep_alive: Interval,
}

impl<S> EventFrames<S> {
    pub fn new(events: S, keep_alive: Duration) -> Self {
        // The comment goes out every interval whether or not events did: a
        // comment too many costs three bytes, a timer reset per event more.
        let mut keep_alive =
            tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        keep_alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self { events, keep_alive }
    }
}

impl<S> Stream for EventFrames<S>
where
    S: Stream<Item = ModelSessionEvent> + Unpin,
{
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.events.poll_next_unpin(cx) {
            Poll::Ready(Some(event)) => {
                return Poll::Ready(Some(Ok(frame(event.kind, event.data.as_str()))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        match self.keep_alive.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE_COMMENT)))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One event: `event: {kind}`, then `data: {line}` for each line of `data`.
pub fn frame(kind: &'static str, data: &str) -> Bytes {
    debug_assert!(
        memchr::memchr2(b'\n', b'\r', kind.as_bytes()).is_none(),
        "event kinds are single words"
    );
    if memchr::memchr2(b'\n', b'\r', data.as_bytes()).is_some() {
        return frame_lines(kind, data);
    }
    let mut frame = Vec::with_capacity(EVENT.len() + kind.len() + DATA.len() + data.len() + 2);
    frame.extend_from_slice(EVENT);
    frame.extend_from_slice(kind.as_bytes());
    frame.extend_from_slice(DATA);
    frame.extend_from_slice(data.as_bytes());
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

const EVENT: &[u8] = b"event: ";
const DATA: &[u8] = b"\ndata: ";

/// The rare frame of data with line breaks: each line (ended by CRLF, LF or
/// CR, as the SSE format reads them) a `data:` field of its own.
fn frame_lines(kind: &str, data: &str) -> Bytes {
    let mut frame = format!("event: {kind}");
    let normalized = data.replace("\r\n", "\n");
    for line in normalized.split(['\n', '\r']) {
        frame.push_str("\ndata: ");
        frame.push_str(line);
    }
    frame.push_str("\n\n");
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an SSE reader makes of one frame: its event name and data, the
    /// data lines joined by LF (the format's own parsing rules).
    fn parse(frame: &[u8]) -> (String, String) {
        let text = std::str::from_utf8(frame).unwrap();
        let block = text
            .strip_suffix("\n\n")
            .expect("a frame ends with a blank line");
        let mut kind = String::new();
        let mut data = Vec::new();
        for line in block.split('\n') {
            assert!(!line.contains('\r'), "a raw CR in {text:?}");
            if let Some(value) = line.strip_prefix("event: ") {
                kind = value.to_owned();
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push(value);
            } else {
                panic!("a line that is no field: {line:?} in {text:?}");
            }
        }
        (kind, data.join("\n"))
    }

    #[test]
    fn json_is_one_data_line() {
        let data = r#"{"role":"Lanlan","tools":["a","b\nc"]}"#;
        let frame = frame("catalog_changed", data);
        assert_eq!(
            &frame[..],
            format!("event: catalog_changed\ndata: {data}\n\n").as_bytes()
        );
        assert_eq!(parse(&frame), ("catalog_changed".into(), data.into()));
    }

    #[test]
    fn line_breaks_in_data_never_end_the_event() {
        for (data, lines) in [
            ("a\nb", "a\nb"),
            ("a\r\nb", "a\nb"),
            ("a\rb", "a\nb"),
            ("a\n\nevent: forged\ndata: x", "a\n\nevent: forged\ndata: x"),
            ("\n", "\n"),
            ("a\r\n\r\nb\r", "a\n\nb\n"),
        ] {
            let frame = frame("ready", data);
            assert_eq!(parse(&frame), ("ready".into(), lines.into()), "{data:?}");
        }
    }

    fn event(kind: &'static str) -> ModelSessionEvent {
        ModelSessionEvent::new(kind, &serde_json::json!({"kind": kind}))
    }

    #[tokio::test(start_paused = true)]
    async fn a_comment_comes_round_while_idle_and_the_body_ends_with_its_events() {
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let mut frames = EventFrames::new(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
            Duration::from_secs(15),
        );
        sender.send(event("ready")).await.unwrap();
        let first = frames.next().await.unwrap().unwrap();
        assert_eq!(parse(&first).0, "ready");
        // The clock is paused: it advances only while every task waits, so
        // the interval is the only thing that can end these waits.
        let early = tokio::time::timeout(Duration::from_secs(14), frames.next()).await;
        assert!(early.is_err(), "nothing before the interval: {early:?}");
        let comment = frames.next().await.unwrap().unwrap();
        assert_eq!(&comment[..], KEEP_ALIVE_COMMENT);
        sender.send(event("catalog_changed")).await.unwrap();
        let changed = frames.next().await.unwrap().unwrap();
        assert_eq!(parse(&changed).0, "catalog_changed");
        drop(sender);
        assert!(
            frames.next().await.is_none(),
            "the body ends with the events"
        );
    }
}
