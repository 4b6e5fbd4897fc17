//! A SQLite VFS over the default one that writes a transaction's log frames
//! in one system call instead of two per page.
//!
//! SQLite appends each page of a commit to the write-ahead log as two writes,
//! the 24-byte frame header and the page. A tool call's two journal commits
//! change about 14 pages (the row's table page and a page of each index), so
//! a call cost about 42 `pwrite`s, the largest share of its kernel time
//! (BENCHMARKS.md, issue 20, eighth pass). Only the journal thread's
//! connection opens the database through this VFS; every other connection,
//! and every file but the log, goes straight to the default VFS.
//!
//! What is held back, and why that keeps the log's promises:
//! - Only frames that do not end a transaction are gathered, header and page,
//!   while they follow each other in the file. The header of a commit frame
//!   (the only one whose "database size" field is not zero) first writes out
//!   what is gathered, then goes to the file itself, as does its page. So by
//!   the time a commit frame is in the file every frame before it is, and
//!   SQLite publishes a commit to other connections (the wal-index header)
//!   only after its commit frame is written: no reader, checkpoint or
//!   recovery after a crash can see a committed frame that is not in the file.
//! - Any other access to the log (a read, a sync, its size, a truncation, a
//!   file control, closing it) and any write that does not continue the
//!   gathered run writes the run out first, so SQLite never sees the file
//!   without its own writes.
//! - A failed write of the run is reported by the call that caused it (for a
//!   commit, the commit fails as it would have), and the run is dropped: SQLite
//!   rolls the transaction back and writes those frames again.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's registered name.
pub(super) const NAME: &CStr = c"toolgate-wal";

/// A log frame's header: page number, database size after a commit (zero
/// for a frame that ends no transaction), salts, checksums.
const FRAME_HEADER_BYTES: usize = 24;
/// A run longer than this is written out before it grows (a large
/// transaction's frames).
const RUN_LIMIT_BYTES: usize = 1 << 20;
/// The largest write passed to the default VFS: the unix VFS masks a write's
/// size to 17 bits (SQLite itself never writes more than a page), so a
/// longer one would come back short and fail as "disk full".
const WRITE_CHUNK_BYTES: usize = 64 << 10;

/// The VFS's name after registering it once per process.
pub(super) fn registered() -> rusqlite::Result<&'static CStr> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| unsafe { register() });
    if rc == ffi::SQLITE_OK {
        Ok(NAME)
    } else {
        Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None))
    }
}

/// Offset of the default VFS's file object inside ours.
const INNER_OFFSET: usize = std::mem::size_of::<LogFile>().next_multiple_of(16);

/// # Safety
/// Called once (a `OnceLock`): the VFS object is leaked and lives as long as
/// the process, as SQLite requires of a registered VFS.
unsafe fn register() -> c_int {
    unsafe {
        let inner = ffi::sqlite3_vfs_find(ptr::null());
        if inner.is_null() {
            return ffi::SQLITE_ERROR;
        }
        let Ok(inner_size) = usize::try_from((*inner).szOsFile) else {
            return ffi::SQLITE_ERROR;
        };
        let Ok(size) = c_int::try_from(INNER_OFFSET + inner_size) else {
            return ffi::SQLITE_ERROR;
        };
        let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: size,
            mxPathname: (*inner).mxPathname,
            pNext: ptr::null_mut(),
            zName: NAME.as_ptr(),
            pAppData: inner.cast(),
            xOpen: Some(open),
            xDelete: Some(delete),
            xAccess: Some(access),
            xFullPathname: Some(full_pathname),
            // Extensions are never loaded through this VFS.
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(randomness),
            xSleep: Some(sleep),
            xCurrentTime: Some(current_time),
            xGetLastError: Some(get_last_error),
            xCurrentTimeInt64: Some(current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        ffi::sqlite3_vfs_register(vfs, 0)
    }
}

/// The default VFS this one passes everything to.
unsafe fn inner_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    unsafe { (*vfs).pAppData.cast() }
}

/// The log file: SQLite's file object, then the run gathered, then (at
/// [`INNER_OFFSET`]) the default VFS's own file object.
#[repr(C)]
struct LogFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Frames gathered, to be written at `run_at`.
    run: Vec<u8>,
    run_at: i64,
    /// The run ends with a frame header whose page comes next.
    awaiting_page: bool,
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    unsafe {
        let inner_vfs = inner_vfs(vfs);
        let Some(inner_open) = (*inner_vfs).xOpen else {
            return ffi::SQLITE_ERROR;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Ours is larger than the default VFS's file object, so that
            // object fits where ours would be and SQLite calls its methods.
            return inner_open(inner_vfs, name, file, flags, out_flags);
        }
        let log = file.cast::<LogFile>();
        (*log).base.pMethods = ptr::null();
        let inner = file
            .cast::<u8>()
            .add(INNER_OFFSET)
            .cast::<ffi::sqlite3_file>();
        let rc = inner_open(inner_vfs, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        ptr::write(
            log,
            LogFile {
                base: ffi::sqlite3_file {
                    pMethods: &LOG_METHODS,
                },
                inner,
                run: Vec::new(),
                run_at: 0,
                awaiting_page: false,
            },
        );
        ffi::SQLITE_OK
    }
}

/// The methods of the default VFS's file object inside ours.
unsafe fn inner_methods(log: &LogFile) -> &ffi::sqlite3_io_methods {
    unsafe { &*(*log.inner).pMethods }
}

/// Writes the gathered run out; its error, if any, is the caller's to return.
unsafe fn write_run(log: &mut LogFile) -> c_int {
    log.awaiting_page = false;
    if log.run.is_empty() {
        return ffi::SQLITE_OK;
    }
    let Some(write) = (unsafe { inner_methods(log) }).xWrite else {
        log.run.clear();
        return ffi::SQLITE_IOERR_WRITE;
    };
    let mut at = log.run_at;
    let mut rc = ffi::SQLITE_OK;
    for chunk in log.run.chunks(WRITE_CHUNK_BYTES) {
        // A chunk is at most 64 KiB: both conversions hold.
        let len = chunk.len() as c_int;
        rc = unsafe { write(log.inner, chunk.as_ptr().cast(), len, at) };
        if rc != ffi::SQLITE_OK {
            break;
        }
        at += chunk.len() as i64;
    }
    log.run.clear();
    rc
}

/// The log file behind SQLite's pointer.
///
/// # Safety
/// `file` was opened by [`open`] as a log file (only those get [`LOG_METHODS`]).
unsafe fn log_file<'a>(file: *mut ffi::sqlite3_file) -> &'a mut LogFile {
    unsafe { &mut *file.cast::<LogFile>() }
}

static LOG_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 1: SQLite maps shared memory and pages through the database
    // file, never through its log.
    iVersion: 1,
    xClose: Some(log_close),
    xRead: Some(log_read),
    xWrite: Some(log_write),
    xTruncate: Some(log_truncate),
    xSync: Some(log_sync),
    xFileSize: Some(log_file_size),
    xLock: Some(log_lock),
    xUnlock: Some(log_unlock),
    xCheckReservedLock: Some(log_check_reserved_lock),
    xFileControl: Some(log_file_control),
    xSectorSize: Some(log_sector_size),
    xDeviceCharacteristics: Some(log_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn log_close(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let log = log_file(file);
        let written = write_run(log);
        let closed = match inner_methods(log).xClose {
            Some(close) => close(log.inner),
            None => ffi::SQLITE_OK,
        };
        ptr::drop_in_place(&mut log.run);
        log.base.pMethods = ptr::null();
        if written != ffi::SQLITE_OK {
            written
        } else {
            closed
        }
    }
}

unsafe extern "C" fn log_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let log = log_file(file);
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
        let continues = log.run.is_empty()
            || i64::try_from(log.run.len()).is_ok_and(|run| log.run_at + run == offset);
        if continues && log.awaiting_page {
            log.run.extend_from_slice(bytes);
            log.awaiting_page = false;
            return ffi::SQLITE_OK;
        }
        let ends_no_transaction = len == FRAME_HEADER_BYTES && bytes[4..8] == [0; 4];
        if !(ends_no_transaction && continues && log.run.len() < RUN_LIMIT_BYTES) {
            let rc = write_run(log);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if ends_no_transaction {
            if log.run.is_empty() {
                log.run_at = offset;
            }
            log.run.extend_from_slice(bytes);
            log.awaiting_page = true;
            return ffi::SQLITE_OK;
        }
        match inner_methods(log).xWrite {
            Some(write) => write(log.inner, data, amount, offset),
            None => ffi::SQLITE_IOERR_WRITE,
        }
    }
}

/// Defines a method that writes the run out and then passes the call on.
macro_rules! after_run {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            unsafe {
                let log = log_file(file);
                let rc = write_run(log);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                match inner_methods(log).$method {
                    Some(method) => method(log.inner, $($arg),*),
                    None => ffi::SQLITE_IOERR,
                }
            }
        }
    };
}

/// Defines a method that passes the call on untouched.
macro_rules! passed_on {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            unsafe {
                let log = log_file(file);
                match inner_methods(log).$method {
                    Some(method) => method(log.inner, $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

after_run!(log_read, xRead, (buffer: *mut c_void, amount: c_int, offset: ffi::sqlite3_int64));
after_run!(log_truncate, xTruncate, (size: ffi::sqlite3_int64));
after_run!(log_sync, xSync, (flags: c_int));
after_run!(log_file_size, xFileSize, (size: *mut ffi::sqlite3_int64));
after_run!(log_file_control, xFileControl, (op: c_int, argument: *mut c_void));
passed_on!(log_lock, xLock, (level: c_int), ffi::SQLITE_OK);
passed_on!(log_unlock, xUnlock, (level: c_int), ffi::SQLITE_OK);
passed_on!(log_check_reserved_lock, xCheckReservedLock, (out: *mut c_int), ffi::SQLITE_OK);
passed_on!(log_sector_size, xSectorSize, (), 4096);
passed_on!(log_device_characteristics, xDeviceCharacteristics, (), 0);

/// Defines a method of the VFS itself that passes the call on to the default
/// VFS, with its own object in place of ours.
macro_rules! vfs_passed_on {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> c_int {
            unsafe {
                let inner = inner_vfs(vfs);
                match (*inner).$method {
                    Some(method) => method(inner, $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

vfs_passed_on!(delete, xDelete, (name: *const c_char, sync_dir: c_int), ffi::SQLITE_IOERR_DELETE);
vfs_passed_on!(access, xAccess, (name: *const c_char, flags: c_int, out: *mut c_int), ffi::SQLITE_IOERR_ACCESS);
vfs_passed_on!(full_pathname, xFullPathname, (name: *const c_char, size: c_int, out: *mut c_char), ffi::SQLITE_CANTOPEN);
vfs_passed_on!(randomness, xRandomness, (size: c_int, out: *mut c_char), 0);
vfs_passed_on!(sleep, xSleep, (microseconds: c_int), 0);
vfs_passed_on!(current_time, xCurrentTime, (out: *mut f64), ffi::SQLITE_ERROR);
vfs_passed_on!(get_last_error, xGetLastError, (size: c_int, out: *mut c_char), 0);
vfs_passed_on!(current_time_int64, xCurrentTimeInt64, (out: *mut ffi::sqlite3_int64), ffi::SQLITE_ERROR);

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::path::{Path, PathBuf};

    fn open_through_vfs(path: &Path) -> Connection {
        let connection = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            registered().unwrap(),
        )
        .unwrap();
        connection
            .execute_batch(
                "PRAGMA page_size = 2048; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
                 PRAGMA wal_autocheckpoint = 0;",
            )
            .unwrap();
        connection
    }

    /// A new database in a temporary directory, opened through the VFS.
    fn fresh_database() -> (tempfile::TempDir, PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let writer = open_through_vfs(&path);
        (dir, path, writer)
    }

    fn scalar<T: rusqlite::types::FromSql>(connection: &Connection, sql: &str) -> T {
        connection.query_row(sql, [], |row| row.get(0)).unwrap()
    }

    fn count(connection: &Connection) -> i64 {
        scalar(connection, "SELECT count(*) FROM rows")
    }

    fn assert_intact(connection: &Connection) {
        assert_eq!(scalar::<String>(connection, "PRAGMA integrity_check"), "ok");
    }

    #[test]
    fn each_commit_is_visible_to_another_connection_at_once() {
        let (_dir, path, writer) = fresh_database();
        writer
            .execute_batch(
                "CREATE TABLE rows (id INTEGER PRIMARY KEY, a TEXT, b TEXT);
                 CREATE INDEX rows_a ON rows (a); CREATE INDEX rows_b ON rows (b);",
            )
            .unwrap();
        // The default VFS, as the store's readers and checkpointer.
        let reader = Connection::open(&path).unwrap();
        for id in 0..200 {
            writer
                .execute(
                    "INSERT INTO rows (id, a, b) VALUES (?1, ?2, ?3)",
                    rusqlite::params![id, format!("a{id:05}"), format!("b{:05}", 1000 - id)],
                )
                .unwrap();
            assert_eq!(count(&reader), id + 1);
        }
        assert_intact(&reader);
    }

    #[test]
    fn the_log_on_disk_recovers_every_commit_even_with_frames_rewritten_in_a_transaction() {
        let (dir, path, writer) = fresh_database();
        // A tiny cache makes a large transaction spill pages into the log
        // before its commit and write some of them again, the path on which
        // SQLite rewrites frames and their checksums in place.
        writer
            .execute_batch(
                "PRAGMA cache_size = 4;
                 CREATE TABLE rows (id INTEGER PRIMARY KEY, a TEXT, b TEXT);
                 CREATE INDEX rows_a ON rows (a);",
            )
            .unwrap();
        writer.execute_batch("BEGIN").unwrap();
        for id in 0..3_000 {
            writer
                .execute(
                    "INSERT INTO rows (id, a, b) VALUES (?1, ?2, ?3)",
                    rusqlite::params![id, format!("a{id:05}"), "x".repeat(100)],
                )
                .unwrap();
        }
        writer
            .execute("UPDATE rows SET b = 'rewritten' WHERE id < 500", [])
            .unwrap();
        writer.execute_batch("COMMIT").unwrap();
        for id in 3_000..3_050 {
            writer
                .execute("INSERT INTO rows (id, a, b) VALUES (?1, 'late', 'y')", [id])
                .unwrap();
        }
        // The files as a crash would leave them: the log is never
        // checkpointed, and the copy is opened without its shared memory,
        // so SQLite rebuilds its index from the log, checking each frame's
        // checksum.
        let copy = dir.path().join("copy.sqlite");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(
            dir.path().join("db.sqlite-wal"),
            dir.path().join("copy.sqlite-wal"),
        )
        .unwrap();
        let recovered = Connection::open(&copy).unwrap();
        assert_eq!(count(&recovered), 3_050);
        assert_eq!(
            scalar::<i64>(
                &recovered,
                "SELECT count(*) FROM rows WHERE b = 'rewritten'"
            ),
            500
        );
        assert_intact(&recovered);
        drop(writer);
    }

    #[test]
    fn a_commit_larger_than_one_write_reaches_the_log_whole() {
        let (_dir, path, writer) = fresh_database();
        writer
            .execute_batch("CREATE TABLE rows (id INTEGER PRIMARY KEY, a TEXT, b TEXT)")
            .unwrap();
        // About 150 overflow pages in one commit: a run of 300 KB, more than
        // the default VFS takes in one write.
        let big = "x".repeat(300_000);
        writer
            .execute("INSERT INTO rows (id, a, b) VALUES (1, 'big', ?1)", [&big])
            .unwrap();
        let reader = Connection::open(&path).unwrap();
        assert_eq!(
            scalar::<String>(&reader, "SELECT b FROM rows WHERE id = 1").len(),
            big.len()
        );
    }

    #[test]
    fn files_other_than_the_log_are_the_default_vfs_own() {
        let (dir, _path, writer) = fresh_database();
        writer
            .execute_batch("CREATE TABLE rows (id INTEGER PRIMARY KEY)")
            .unwrap();
        // The database file still maps shared memory (WAL mode works at all)
        // and a rollback journal, for a database not in WAL mode, works too.
        let other = dir.path().join("rollback.sqlite");
        let rollback = Connection::open_with_flags_and_vfs(
            &other,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            registered().unwrap(),
        )
        .unwrap();
        rollback
            .execute_batch(
                "CREATE TABLE t (x); BEGIN; INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); COMMIT;",
            )
            .unwrap();
        assert_eq!(scalar::<i64>(&rollback, "SELECT count(*) FROM t"), 2);
    }
}
