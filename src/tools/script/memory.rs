//! The engine's heap, counted and capped.
//!
//! QuickJS's own memory limit works, but when it is hit the engine often cannot
//! even allocate the "out of memory" error and throws `null` instead, which looks
//! exactly like a script's `throw null`. Enforcing the cap here lets the sandbox
//! report a memory-limit hit as such.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rquickjs::allocator::{Allocator, RustAllocator};

/// Bookkeeping bytes charged per allocation on top of its usable size, so that many
/// tiny allocations cannot slip past the cap.
const OVERHEAD: usize = 16;

/// Delegates to Rust's global allocator and refuses any allocation that would take
/// the total past `limit`, recording that it did.
pub struct CappedAllocator {
    used: usize,
    limit: usize,
    hit: Arc<AtomicBool>,
}

impl CappedAllocator {
    /// A cap of `limit` bytes; `hit` becomes true the first time a request is refused.
    pub fn new(limit: usize, hit: Arc<AtomicBool>) -> Self {
        Self {
            used: 0,
            limit,
            hit,
        }
    }

    fn admit(&mut self, extra: usize) -> bool {
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
