//! The journal's own append-only log on a SQLite file: what a call's
//! `opened` row and its outcome are written to first, each a copy into the
//! file's shared mapping, before the journal thread folds them into the
//! indexed table.
//!
//! Committing each of a call's two writes to the table ran SQLite's B-tree
//! code for the table and every index and wrote each changed page into the
//! write-ahead log: about half of a builtin call's instructions and most of
//! its system calls (BENCHMARKS.md, issue 20). A record appended here is in
//! the page cache when its caller is answered, as a WAL commit with
//! `synchronous = NORMAL` is, so it survives a crash of the process: start-up
//! folds every record the table does not have yet before it turns `opened`
//! rows `uncertain`.
//!
//! Which records the table has is kept in the table's own database
//! (`journal_log_position`: the log's generation and the offset folded up
//! to), written in the same transaction as the rows it covers, so a record is
//! folded exactly once whatever the moment of a crash. Each generation has
//! its own file: a long log is replaced, once all of it is folded, by the
//! next generation's file without writing to the database (appends must not
//! wait for the database's lock), and the database names the new generation
//! at the next fold. So start-up reads the database's generation from its
//! offset and then the next generation's file, if there is one.
//!
//! The file is reserved on disk ahead of the records (`posix_fallocate`,
//! doubling as it fills) and written through a shared mapping: a `pwrite`
//! per record was the largest single piece of a one-at-a-time call's own
//! time (the system call, ext4 dirtying the inode for its timestamp, a new
//! page-cache page as the file grew; BENCHMARKS.md, thirty-eighth look). A
//! copy into the mapping is in the same page cache, so it survives a crash
//! of the process as the `pwrite` did. Reserving the blocks first means a
//! full disk fails the reservation, which the caller handles, instead of a
//! write into the mapping (which would kill the process with `SIGBUS`). The
//! reserved tail reads as zeroes, which end the log as a torn record does.
//!
//! The file's layout: a header (8 bytes of magic, the generation as a
//! little-endian i64), then records, each its payload's length (u32), the
//! payload's CRC-32 and the payload. A payload is the write's kind and its
//! statement's parameters. A record cut short or whose checksum does not
//! match ends the log (a write torn by a crash of the machine; nothing after
//! it was acknowledged before it).

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use memmap2::{MmapMut, MmapOptions, RemapOptions};

use super::journal::Param;

const MAGIC: &[u8; 8] = b"TGJLOG01";
/// The header's length: where the first record starts.
pub(super) const HEADER_BYTES: u64 = 16;
/// A record's length and checksum, before its payload.
const FRAME_BYTES: usize = 8;
/// The bytes a new file reserves and maps: room for a few thousand calls
/// before the first doubling, little disk for a server that makes none.
const INITIAL_CAPACITY: usize = 1 << 20;
/// The longest payload read back: a record claiming more is corrupt (a call's
/// result is bounded by the providers' output limits, far below this).
const MAX_PAYLOAD_BYTES: usize = 256 << 20;

/// What a record asks of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LoggedKind {
    /// A new row without admission conditions (`PLAIN_INSERT`).
    Insert = 1,
    /// An opened row's outcome (`FINISH_SQL`).
    Finish = 2,
}

/// One record read back: its kind and parameters, borrowed from the bytes.
#[derive(Debug)]
pub(super) struct LoggedWrite<'a> {
    pub kind: LoggedKind,
    pub params: Vec<Param<'a>>,
}

/// Records appended and not yet taken for folding, as the file has them.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// The records, framed.
    pub bytes: Vec<u8>,
    /// How many records `bytes` holds.
    pub count: usize,
    /// The file offset just past the last of them.
    pub end: u64,
    /// The log's generation.
    pub generation: i64,
}

/// The log file while the server runs.
#[derive(Debug)]
pub(super) struct JournalLog {
    file: File,
    /// The whole reserved file, shared: records are copied into it.
    map: MmapMut,
    /// The path without its generation ([`path_of`]).
    base: PathBuf,
    generation: i64,
    /// The previous generation's file, to delete once the database names
    /// this one.
    retired: Option<PathBuf>,
    /// Where the next record goes.
    end: u64,
    pending: Vec<u8>,
    pending_count: usize,
}

/// The log's base path beside the database file.
pub(super) fn path_beside(database: &Path) -> PathBuf {
    let mut name = database.file_name().unwrap_or_default().to_os_string();
    name.push(".calls-log");
    database.with_file_name(name)
}

/// The file of generation `generation` of the log at `base`.
pub(super) fn path_of(base: &Path, generation: i64) -> PathBuf {
    let mut name = base.file_name().unwrap_or_default().to_os_string();
    name.push(format!("-{generation}"));
    base.with_file_name(name)
}

impl JournalLog {
    /// Starts a new, empty log of `generation` at `base`, replacing any file
    /// of that generation (whose records the database must already have).
    pub(super) fn create(base: &Path, generation: i64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path_of(base, generation))?;
        let mut map = map_reserved(&file, INITIAL_CAPACITY)?;
        map[..HEADER_BYTES as usize].copy_from_slice(&header(generation));
        Ok(Self {
            file,
            map,
            base: base.to_owned(),
            generation,
            retired: None,
            end: HEADER_BYTES,
            pending: Vec::new(),
            pending_count: 0,
        })
    }

    /// Appends one record to the file; once this returns it survives a crash
    /// of the process. A failed write leaves the log as it was.
    pub(super) fn append(&mut self, kind: LoggedKind, params: &[Param<'_>]) -> io::Result<()> {
        let start = self.pending.len();
        encode(&mut self.pending, kind, params)?;
        let at = self.end as usize;
        let record_end = at + (self.pending.len() - start);
        if let Err(err) = self.make_room(record_end) {
            self.pending.truncate(start);
            return Err(err);
        }
        self.map[at..record_end].copy_from_slice(&self.pending[start..]);
        self.end = record_end as u64;
        self.pending_count += 1;
        Ok(())
    }

    /// Reserves and maps the file up to at least `needed` bytes, doubling.
    fn make_room(&mut self, needed: usize) -> io::Result<()> {
        if needed <= self.map.len() {
            return Ok(());
        }
        let capacity = needed.next_power_of_two().max(self.map.len() * 2);
        reserve(&self.file, self.map.len(), capacity)?;
        // SAFETY: as in `map_reserved`: the file is this server's own and
        // now reserved up to `capacity`; the mapping may move, and nothing
        // borrows it across this call (`&mut self`).
        unsafe { self.map.remap(capacity, RemapOptions::new().may_move(true)) }
    }

    /// The bytes the file has reserved and mapped.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.map.len()
    }

    /// Takes every record appended so far, for the caller to fold.
    pub(super) fn take(&mut self) -> Pending {
        Pending {
            bytes: std::mem::take(&mut self.pending),
            count: std::mem::take(&mut self.pending_count),
            end: self.end,
            generation: self.generation,
        }
    }

    /// Puts records taken by [`take`](Self::take) back in front of those
    /// appended since (their fold failed; they are tried again).
    pub(super) fn put_back(&mut self, mut taken: Pending) {
        taken.bytes.extend_from_slice(&self.pending);
        self.pending = taken.bytes;
        self.pending_count += taken.count;
    }

    /// How far the file has grown.
    pub(super) fn len(&self) -> u64 {
        self.end
    }

    /// The bytes of the records waiting to be taken.
    pub(super) fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// No record waits to be taken.
    pub(super) fn is_empty(&self) -> bool {
        self.pending_count == 0
    }

    /// The log's generation.
    #[cfg(test)]
    pub(super) fn generation(&self) -> i64 {
        self.generation
    }

    /// Goes on in the next generation's file: every record of this one must
    /// be folded. Its file is kept until [`retired`](Self::retired) hands it
    /// over, after the database names the new generation.
    pub(super) fn restart(&mut self) -> io::Result<()> {
        let previous = path_of(&self.base, self.generation);
        let next = Self::create(&self.base, self.generation + 1)?;
        *self = Self {
            retired: Some(previous),
            ..next
        };
        Ok(())
    }

    /// The previous generation's file, once `folded_generation` (the
    /// generation the database now names) is this one's.
    pub(super) fn retired(&mut self, folded_generation: i64) -> Option<PathBuf> {
        if folded_generation == self.generation {
            self.retired.take()
        } else {
            None
        }
    }
}

/// Reserves the file's blocks up to `capacity` bytes (growing it to that
/// length) and maps all of it, shared.
fn map_reserved(file: &File, capacity: usize) -> io::Result<MmapMut> {
    reserve(file, 0, capacity)?;
    // SAFETY: the mapping is of the server's own log file beside its
    // database, which nothing else writes or truncates while the server
    // runs (as with the database itself); its blocks are reserved, so a
    // write into it never needs the disk to find room.
    unsafe { MmapOptions::new().len(capacity).map_mut(file) }
}

/// Allocates the file's blocks from `reserved` (what is already) up to
/// `capacity` bytes.
fn reserve(file: &File, reserved: usize, capacity: usize) -> io::Result<()> {
    let offset = |bytes: usize| {
        libc::off_t::try_from(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "journal log too long"))
    };
    let len = offset(capacity - reserved)?;
    nix::fcntl::posix_fallocate(file, offset(reserved)?, len).map_err(io::Error::from)
}

/// The file's first bytes: the magic and the generation.
fn header(generation: i64) -> [u8; HEADER_BYTES as usize] {
    let mut header = [0u8; HEADER_BYTES as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..].copy_from_slice(&generation.to_le_bytes());
    header
}

/// The records of generation `generation` of the log at `base` past
/// `folded_to`, as framed bytes for [`records`]; none if the file is missing
/// or its header names another generation.
pub(super) fn unfolded(base: &Path, generation: i64, folded_to: u64) -> io::Result<Vec<u8>> {
    let mut bytes = match std::fs::read(path_of(base, generation)) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    if !bytes.starts_with(&header(generation)) {
        return Ok(Vec::new());
    }
    // In place: the file is its whole reservation (megabytes), not a copy's
    // worth of records.
    let start = usize::try_from(folded_to.max(HEADER_BYTES))
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    bytes.drain(..start);
    Ok(bytes)
}

/// Appends one framed record to `out`.
fn encode(out: &mut Vec<u8>, kind: LoggedKind, params: &[Param<'_>]) -> io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_BYTES]);
    out.push(kind as u8);
    out.extend_from_slice(&(params.len() as u16).to_le_bytes());
    for param in params {
        match param {
            Param::Int(None) => out.push(0),
            Param::Text(None) => out.push(1),
            Param::Int(Some(value)) => {
                out.push(2);
                out.extend_from_slice(&value.to_le_bytes());
            }
            Param::Text(Some(text)) => {
                out.push(3);
                out.extend_from_slice(&(text.len() as u32).to_le_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
    let payload_len = out.len() - start - FRAME_BYTES;
    if payload_len > MAX_PAYLOAD_BYTES {
        out.truncate(start);
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a journal record of {payload_len} bytes is over the log's limit"),
        ));
    }
    let checksum = crc32fast::hash(&out[start + FRAME_BYTES..]);
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4..start + FRAME_BYTES].copy_from_slice(&checksum.to_le_bytes());
    Ok(())
}

/// The records in `bytes`, in order, up to the first that is cut short or
/// damaged; and how many bytes the whole ones take.
pub(super) fn records(bytes: &[u8]) -> (Vec<LoggedWrite<'_>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((record, len)) = bytes.get(at..).and_then(record) {
        out.push(record);
        at += len;
    }
    (out, at)
}

/// How many of the bytes after a log's whole records were written and could
/// not be read (a torn or damaged record): the reserved tail past the last
/// written byte is zeroes, never written, and not counted.
pub(super) fn torn_len(after_records: &[u8]) -> usize {
    after_records
        .iter()
        .rposition(|byte| *byte != 0)
        .map_or(0, |last| last + 1)
}

/// The record at the start of `bytes` and its framed length.
fn record(bytes: &[u8]) -> Option<(LoggedWrite<'_>, usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let checksum = u32::from_le_bytes(bytes.get(4..FRAME_BYTES)?.try_into().ok()?);
    if len > MAX_PAYLOAD_BYTES {
        return None;
    }
    let payload = bytes.get(FRAME_BYTES..FRAME_BYTES + len)?;
    if crc32fast::hash(payload) != checksum {
        return None;
    }
    Some((decode(payload)?, FRAME_BYTES + len))
}

fn decode(payload: &[u8]) -> Option<LoggedWrite<'_>> {
    let mut reader = Reader { bytes: payload };
    let kind = match reader.take(1)?[0] {
        1 => LoggedKind::Insert,
        2 => LoggedKind::Finish,
        _ => return None,
    };
    let count = u16::from_le_bytes(reader.take(2)?.try_into().ok()?);
    let mut params = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        params.push(match reader.take(1)?[0] {
            0 => Param::Int(None),
            1 => Param::Text(None),
            2 => Param::Int(Some(i64::from_le_bytes(reader.take(8)?.try_into().ok()?))),
            3 => {
                let len = u32::from_le_bytes(reader.take(4)?.try_into().ok()?) as usize;
                let text = std::str::from_utf8(reader.take(len)?).ok()?;
                Param::Text(Some(Cow::Borrowed(text)))
            }
            _ => return None,
        });
    }
    reader
        .bytes
        .is_empty()
        .then_some(LoggedWrite { kind, params })
}

/// Reads a payload front to back.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < len {
            return None;
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Vec<Param<'static>> {
        vec![
            Param::Text(Some(Cow::Borrowed("exec_1"))),
            Param::Text(None),
            Param::Int(Some(-42)),
            Param::Int(None),
            Param::Text(Some(Cow::Owned("ünïcode \n {\"a\":1}".into()))),
        ]
    }

    fn texts(params: &[Param<'_>]) -> Vec<String> {
        params.iter().map(|param| format!("{param:?}")).collect()
    }

    #[test]
    fn records_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = JournalLog::create(&path, 7).unwrap();
        log.append(LoggedKind::Insert, &params()).unwrap();
        log.append(LoggedKind::Finish, &params()[..2]).unwrap();
        let pending = log.take();
        assert_eq!(pending.count, 2);
        assert_eq!(pending.end, log.len());
        assert!(log.is_empty());
        let on_disk = unfolded(&path, 7, 0).unwrap();
        let (records_on_disk, reserved_tail) = on_disk.split_at(pending.bytes.len());
        assert_eq!(
            records_on_disk, pending.bytes,
            "memory and file hold the same records"
        );
        assert_eq!(
            torn_len(reserved_tail),
            0,
            "the rest is the reserved zeroes"
        );
        let (read, len) = records(&on_disk);
        assert_eq!(len, pending.bytes.len());
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].kind, LoggedKind::Insert);
        assert_eq!(texts(&read[0].params), texts(&params()));
        assert_eq!(read[1].kind, LoggedKind::Finish);
        assert_eq!(texts(&read[1].params), texts(&params()[..2]));
    }

    #[test]
    fn reading_resumes_at_the_folded_offset_and_ignores_other_generations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = JournalLog::create(&path, 3).unwrap();
        log.append(LoggedKind::Insert, &params()).unwrap();
        let first_end = log.len();
        log.append(LoggedKind::Finish, &params()[..1]).unwrap();
        let rest = unfolded(&path, 3, first_end).unwrap();
        let (read, _) = records(&rest);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].kind, LoggedKind::Finish);
        assert!(unfolded(&path, 4, 0).unwrap().is_empty());
        // A file whose header names another generation, or is cut inside
        // the header, holds no records of this one.
        std::fs::copy(path_of(&path, 3), path_of(&path, 5)).unwrap();
        assert!(unfolded(&path, 5, 0).unwrap().is_empty());
        std::fs::write(path_of(&path, 6), &header(6)[..12]).unwrap();
        assert!(unfolded(&path, 6, 0).unwrap().is_empty());
        assert!(unfolded(&path, 3, u64::MAX).unwrap().is_empty());
        assert!(
            unfolded(&dir.path().join("missing"), 3, 0)
                .unwrap()
                .is_empty()
        );
        log.restart().unwrap();
        assert_eq!(log.generation(), 4);
        assert!(records(&unfolded(&path, 4, 0).unwrap()).0.is_empty());
        assert_eq!(log.len(), HEADER_BYTES);
        // The old file stays until the database names the new generation.
        assert!(log.retired(3).is_none());
        assert_eq!(log.retired(4), Some(path_of(&path, 3)));
        assert!(path_of(&path, 3).exists());
    }

    #[test]
    fn a_log_past_its_first_reservation_grows_reserved_and_reads_back() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = JournalLog::create(&path, 1).unwrap();
        let reserved = |log: &JournalLog| {
            let meta = std::fs::metadata(path_of(&path, 1)).unwrap();
            let capacity = log.capacity() as u64;
            // Blocks on disk, not a sparse length: a full disk fails the
            // reservation instead of a write into the mapping.
            assert!(meta.len() >= capacity && meta.blocks() * 512 >= capacity);
            capacity
        };
        assert_eq!(reserved(&log), INITIAL_CAPACITY as u64);
        let small = params();
        while log.len() < INITIAL_CAPACITY as u64 + 10_000 {
            log.append(LoggedKind::Insert, &small).unwrap();
        }
        let grown = reserved(&log);
        assert!(grown >= 2 * INITIAL_CAPACITY as u64);
        // One record longer than everything reserved so far.
        let long = "x".repeat(3 * INITIAL_CAPACITY);
        let big = [Param::Text(Some(Cow::Borrowed(long.as_str())))];
        log.append(LoggedKind::Finish, &big).unwrap();
        assert!(reserved(&log) >= log.len());
        log.append(LoggedKind::Insert, &small).unwrap();
        let pending = log.take();
        let on_disk = unfolded(&path, 1, 0).unwrap();
        assert_eq!(&on_disk[..pending.bytes.len()], &pending.bytes[..]);
        let (read, len) = records(&on_disk);
        assert_eq!((read.len(), len), (pending.count, pending.bytes.len()));
        assert_eq!(read[read.len() - 2].kind, LoggedKind::Finish);
        assert_eq!(texts(&read[read.len() - 2].params), texts(&big));
    }

    #[test]
    fn only_written_bytes_past_the_records_count_as_torn() {
        let mut bytes = Vec::new();
        encode(&mut bytes, LoggedKind::Insert, &params()).unwrap();
        let cut = bytes.len() - 3;
        bytes.truncate(cut);
        bytes.resize(cut + 4096, 0);
        let (read, len) = records(&bytes);
        assert_eq!((read.len(), len), (0, 0));
        assert_eq!(torn_len(&bytes[len..]), cut);
        assert_eq!(torn_len(&[0; 4096]), 0);
        assert_eq!(torn_len(&[]), 0);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_log() {
        let mut bytes = Vec::new();
        encode(&mut bytes, LoggedKind::Insert, &params()).unwrap();
        let whole = bytes.len();
        encode(&mut bytes, LoggedKind::Finish, &params()).unwrap();
        // Cut short: only the first counts.
        let (read, len) = records(&bytes[..bytes.len() - 3]);
        assert_eq!((read.len(), len), (1, whole));
        // A flipped byte in the second's payload: its checksum fails.
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        let (read, len) = records(&bytes);
        assert_eq!((read.len(), len), (1, whole));
        // Zeroes (a file extended but never written) read as nothing.
        assert!(records(&[0u8; 64]).0.is_empty());
    }

    #[test]
    fn damaged_bytes_never_panic_and_read_only_whole_records() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        let mut valid = Vec::new();
        for _ in 0..8 {
            encode(&mut valid, LoggedKind::Insert, &params()).unwrap();
        }
        for round in 0..5_000 {
            let mut bytes = if round % 2 == 0 {
                (0..rng.random_range(0..300))
                    .map(|_| rng.random())
                    .collect::<Vec<u8>>()
            } else {
                valid.clone()
            };
            for _ in 0..rng.random_range(1..4) {
                if !bytes.is_empty() {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] = rng.random();
                }
            }
            let cut = rng.random_range(0..=bytes.len());
            let (read, len) = records(&bytes[..cut]);
            assert!(len <= cut);
            // Whatever was read is a run of whole records from the start.
            let (again, again_len) = records(&bytes[..len]);
            assert_eq!((again.len(), again_len), (read.len(), len));
        }
    }

    #[test]
    fn records_put_back_come_before_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = JournalLog::create(&dir.path().join("log"), 1).unwrap();
        log.append(LoggedKind::Insert, &params()).unwrap();
        let taken = log.take();
        log.append(LoggedKind::Finish, &params()).unwrap();
        log.put_back(taken);
        let pending = log.take();
        assert_eq!(pending.count, 2);
        let (read, _) = records(&pending.bytes);
        let kinds: Vec<_> = read.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, [LoggedKind::Insert, LoggedKind::Finish]);
    }
}
