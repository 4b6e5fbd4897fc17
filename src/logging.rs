//! Log output that request-supplied text cannot forge: every line the process
//! logs (its own and its dependencies') goes through [`SanitizingWriter`], which
//! escapes control characters, so a newline in a tool name cannot start a line
//! of the caller's choosing and escape or NUL bytes never reach an operator's
//! terminal. Structured fields (`?value`) already escape what they carry; this
//! is the backstop for everything else.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, WorkerGuard};

/// Writes to `inner`, escaping control characters in each write except the
/// line end that closes it. The formatter writes one event per write, so a
/// newline inside an event is escaped and the one that ends it is kept.
pub struct SanitizingWriter<W> {
    inner: W,
    /// Keep ESC: the formatter's own colour codes on a terminal.
    keep_escape: bool,
}

impl<W: Write> SanitizingWriter<W> {
    pub fn new(inner: W, keep_escape: bool) -> Self {
        Self { inner, keep_escape }
    }
}

/// `bytes` with every control character but a final newline (and tabs, and
/// ESC when `keep_escape`) written as an escape.
pub fn sanitize(bytes: &[u8], keep_escape: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let last = bytes.len().saturating_sub(1);
    for (index, &byte) in bytes.iter().enumerate() {
        match byte {
            b'\n' if index == last => out.push(byte),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.push(byte),
            0x1b if keep_escape => out.push(byte),
            0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{byte:02x}").as_bytes()),
            _ => out.push(byte),
        }
    }
    out
}

impl<W: Write> Write for SanitizingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write_all(&sanitize(buf, self.keep_escape))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// How many log lines standard error may fall behind before new ones are
/// dropped (each about 200-300 bytes, so tens of megabytes at most).
pub const BUFFERED_LOG_LINES: usize = tracing_appender::non_blocking::DEFAULT_BUFFERED_LINES_LIMIT;

/// Sanitised standard error, written by a thread of its own: the thread that
/// logs only queues the line. A sink that stops reading (a stuck collector, a
/// paused terminal, a full pipe) then holds lines in memory, up to
/// [`BUFFERED_LOG_LINES`], instead of holding the async worker that logged
/// them and with it every request on that worker. Lines past that bound are
/// dropped and counted ([`DroppedLines`]), never waited for.
///
/// The formatter writes each event whole, and the thread writes each queued
/// event with one write, so the sanitiser still sees one event per write.
pub fn stderr_off_thread(keep_escape: bool) -> (NonBlocking, LogOutput) {
    off_thread(
        SanitizingWriter::new(io::stderr(), keep_escape),
        BUFFERED_LOG_LINES,
    )
}

/// `sink` written by the log thread, with `queued` lines at most waiting.
fn off_thread(sink: impl Write + Send + 'static, queued: usize) -> (NonBlocking, LogOutput) {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(queued)
        .thread_name("toolgate-log")
        .finish(sink);
    let dropped = DroppedLines {
        counter: writer.error_counter(),
        reported: Arc::default(),
    };
    (
        writer,
        LogOutput {
            dropped,
            _flush_on_drop: guard,
        },
    )
}

/// The log thread's queue: dropping it writes what is queued (at exit).
pub struct LogOutput {
    pub dropped: DroppedLines,
    _flush_on_drop: WorkerGuard,
}

/// The lines the log thread dropped, and how many of them a warning has
/// already told of (shared by the periodic check and the one at exit).
#[derive(Clone)]
pub struct DroppedLines {
    counter: ErrorCounter,
    reported: Arc<AtomicUsize>,
}

impl DroppedLines {
    /// Warns when lines were dropped since the last warning; how many.
    /// While the sink is stuck the warning is dropped too, and counted: the
    /// first one that gets through tells of them all.
    pub fn warn_if_newly_dropped(&self) -> usize {
        let total = self.counter.dropped_lines();
        let newly = total.saturating_sub(self.reported.fetch_max(total, Ordering::Relaxed));
        if newly > 0 {
            tracing::warn!(
                dropped = newly,
                total,
                "log lines were dropped: the log output was not being read"
            );
        }
        newly
    }

    /// Checks every `every`, for as long as the server runs.
    pub async fn warn_every(self, every: std::time::Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.warn_if_newly_dropped();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interior_line_breaks_and_controls_are_escaped() {
        let line = b"tool=\"a\nlevel=ERROR forged\" \x1b[31mred\x00 ok\n";
        let clean = sanitize(line, false);
        assert_eq!(clean.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(clean.last(), Some(&b'\n'));
        assert!(!clean.contains(&0x1b) && !clean.contains(&0));
        assert_eq!(
            String::from_utf8(clean).unwrap(),
            "tool=\"a\\nlevel=ERROR forged\" \\x1b[31mred\\x00 ok\n"
        );
        assert!(sanitize(b"\x1b[1mbold\x1b[0m\n", true).contains(&0x1b));
        assert_eq!(
            sanitize("中文\tok\n".as_bytes(), false),
            "中文\tok\n".as_bytes()
        );
    }

    /// A sink that takes nothing until `open` is sent.
    struct Stuck(std::sync::mpsc::Receiver<()>, Option<()>);

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.1.is_none() {
                self.1 = self.0.recv().ok();
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_past_the_queue_are_dropped_and_counted_never_waited_for() {
        let (open, opened) = std::sync::mpsc::channel();
        let (writer, output) = off_thread(Stuck(opened, None), 2);
        let mut line = writer.clone();
        for _ in 0..10 {
            line.write_all(b"a line\n").unwrap();
        }
        // The thread holds one line in the stuck write and two are queued.
        let dropped = output.dropped.warn_if_newly_dropped();
        assert!((7..=8).contains(&dropped), "{dropped} dropped");
        assert_eq!(
            output.dropped.clone().warn_if_newly_dropped(),
            0,
            "told of once, by any copy"
        );
        open.send(()).unwrap();
    }
}
