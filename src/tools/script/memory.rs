//! The engine's heap, counted and capped.
//!
//! QuickJS's own memory limit works, but when it is hit the engine often cannot
//! even allocate the "out of memory" error and throws `null` instead, which looks
//! exactly like a script's `throw null`. Enforcing the cap here lets the sandbox
//! report a memory-limit hit as such.
//!
//! The heap also enforces the script's deadline. QuickJS polls its interrupt
//! handler every 10,000 bytecode operations, and a native operation on a
//! large BigInt (turning a million-bit one into a string takes 2.5 s) counts
//! as one: a loop of them ran minutes past a one-second limit, holding a
//! sandbox slot every account shares. Such operations allocate before they
//! work, so once the deadline has passed every allocation is refused: the
//! operation under way finishes, the next one fails at once, and the
//! interrupt comes round soon after.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rquickjs::allocator::{Allocator, RustAllocator};

/// Bookkeeping bytes charged per allocation on top of its usable size, so that many
/// tiny allocations cannot slip past the cap.
const OVERHEAD: usize = 16;

/// How many small allocations pass between two readings of the clock (a
/// reading costs about as much as an allocation).
const CLOCK_EVERY: u32 = 64;
/// Allocations from this size on read the clock every time: the natives that
/// run long without polling the interrupt work on buffers this large.
const LARGE_ALLOCATION: usize = 16 * 1024;

/// When the script's time is up: its deadline, and the flag the interrupt
/// handler and the heap both raise once it has passed.
pub struct Deadline {
    pub at: Instant,
    pub expired: Arc<AtomicBool>,
}

/// Delegates to Rust's global allocator and refuses any allocation that would take
/// the total past `limit`, recording that it did, and any allocation at all
/// once the deadline has passed.
pub struct CappedAllocator {
    used: usize,
    limit: usize,
    hit: Arc<AtomicBool>,
    deadline: Deadline,
    since_clock: u32,
}

impl CappedAllocator {
    /// A cap of `limit` bytes; `hit` becomes true the first time a request is
    /// refused for its size, `deadline.expired` the first time one is refused
    /// for the time.
    pub fn new(limit: usize, hit: Arc<AtomicBool>, deadline: Deadline) -> Self {
        Self {
            used: 0,
            limit,
            hit,
            deadline,
            since_clock: 0,
        }
    }

    /// Whether the deadline has passed, reading the clock for large requests
    /// and every [`CLOCK_EVERY`] small ones.
    fn too_late(&mut self, size: usize) -> bool {
        if self.deadline.expired.load(Ordering::Relaxed) {
            return true;
        }
        self.since_clock += 1;
        if size < LARGE_ALLOCATION && self.since_clock < CLOCK_EVERY {
            return false;
        }
        self.since_clock = 0;
        if Instant::now() >= self.deadline.at {
            self.deadline.expired.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    fn admit(&mut self, extra: usize) -> bool {
        if self.too_late(extra) {
            return false;
        }
        match self.used.checked_add(extra) {
            Some(total) if total <= self.limit => true,
            _ => {
                self.hit.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    fn charge(size: usize) -> usize {
        size.saturating_add(OVERHEAD)
    }
}

// SAFETY: every pointer handed out comes from `RustAllocator` and is returned to it
// unchanged; sizes are read back through `RustAllocator::usable_size`, so the
// contract of `Allocator` is exactly `RustAllocator`'s. Nothing here can panic
// (panicking across the C boundary would abort the server).
unsafe impl Allocator for CappedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.admit(Self::charge(size)) {
            return ptr::null_mut();
        }
        let block = RustAllocator.alloc(size);
        if !block.is_null() {
            // SAFETY: `block` was just returned by `RustAllocator`.
            self.used += Self::charge(unsafe { RustAllocator::usable_size(block) });
        }
        block
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let Some(total) = count.checked_mul(size) else {
            self.hit.store(true, Ordering::Relaxed);
            return ptr::null_mut();
        };
        if total == 0 || !self.admit(Self::charge(total)) {
            return ptr::null_mut();
        }
        let block = RustAllocator.calloc(count, size);
        if !block.is_null() {
            // SAFETY: `block` was just returned by `RustAllocator`.
            self.used += Self::charge(unsafe { RustAllocator::usable_size(block) });
        }
        block
    }

    unsafe fn dealloc(&mut self, block: *mut u8) {
        // SAFETY: the caller guarantees `block` came from this allocator.
        let size = unsafe { RustAllocator::usable_size(block) };
        self.used = self.used.saturating_sub(Self::charge(size));
        // SAFETY: as above.
        unsafe { RustAllocator.dealloc(block) }
    }

    unsafe fn realloc(&mut self, block: *mut u8, new_size: usize) -> *mut u8 {
        if block.is_null() {
            return self.alloc(new_size);
        }
        // SAFETY: the caller guarantees `block` came from this allocator.
        let old = Self::charge(unsafe { RustAllocator::usable_size(block) });
        let new = Self::charge(new_size);
        if new > old && !self.admit(new - old) {
            return ptr::null_mut();
        }
        // SAFETY: as above.
        let moved = unsafe { RustAllocator.realloc(block, new_size) };
        if !moved.is_null() {
            // SAFETY: `moved` was just returned by `RustAllocator`.
            let now = Self::charge(unsafe { RustAllocator::usable_size(moved) });
            self.used = self.used.saturating_sub(old).saturating_add(now);
        }
        moved
    }

    unsafe fn usable_size(block: *mut u8) -> usize {
        // SAFETY: the caller guarantees `block` came from this allocator.
        unsafe { RustAllocator::usable_size(block) }
    }
}
