//! Cache hints for hot paths: where the data an event needs next lies in memory that is likely
//! cold, asking for it a step ahead overlaps the wait with other work.

/// Asks the CPU to bring the cache line holding `at` into its first-level cache. A hint: it
/// reads nothing into the program, cannot fault whatever the address, and does nothing where
/// it is not supported (only x86_64 has it here).
#[inline]
pub fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64's baseline, and a prefetch only hints: it reads nothing
    // into the program and does not fault, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// [`prefetch`] for every 64-byte line the first `limit` bytes of `bytes` touch, from the
/// first byte's line to the last one's (`bytes` need not be aligned).
#[inline]
pub fn prefetch_bytes(bytes: &[u8], limit: usize) {
    let (start, len) = (bytes.as_ptr(), bytes.len().min(limit) as isize);
    let mut at = -((start as usize % 64) as isize);
    while at < len {
        prefetch(start.wrapping_offset(at));
        at += 64;
    }
}
