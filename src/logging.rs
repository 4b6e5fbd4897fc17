//! Log output that request-supplied text cannot forge: every line the process
//! logs (its own and its dependencies') goes through [`SanitizingWriter`], which
//! escapes control characters, so a newline in a tool name cannot start a line
//! of the caller's choosing and escape or NUL bytes never reach an operator's
//! terminal. Structured fields (`?value`) already escape what they carry; this
//! is the backstop for everything else.

use std::io::{self, Write};

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

/// A `MakeWriter` of sanitised standard error.
#[derive(Clone, Copy)]
pub struct SanitizedStderr {
    pub keep_escape: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SanitizedStderr {
    type Writer = SanitizingWriter<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        SanitizingWriter::new(io::stderr(), self.keep_escape)
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
}
