//! The daemon's global allocator: mimalloc (2.x), entered by its plain `mi_malloc` for layouts
//! whose alignment a mimalloc block always has.
//!
//! The `mimalloc` crate's `MiMalloc` sends every allocation through `mi_malloc_aligned`, whose
//! checks cost about a third more instructions than `mi_malloc` for the small blocks of the hot
//! path. Every
//! mimalloc block is aligned to the machine word (block sizes are multiples of it and pages
//! start aligned), so a layout aligned to at most a word takes the plain path; larger
//! alignments (`u128`, cache-padded types) still go through `mi_malloc_aligned`.
//!
//! With `libmimalloc-sys`'s `override` feature, mimalloc is also the process's `malloc`: the C
//! libraries linked in (librdkafka, aws-lc) and glibc's own allocations use it (docs/decisions.md).

// `libmimalloc-sys`'s `override` replaces glibc's `malloc` by ELF symbol interposition, which
// needs glibc linked dynamically; in a static or musl build it would clash with the C library's
// own allocator or mix the two allocators' blocks.
#[cfg(any(target_env = "musl", target_feature = "crt-static"))]
compile_error!(
    "the `mimalloc` feature replaces the C allocator and needs a dynamically linked glibc: \
     build static or musl targets with `--no-default-features` and the features wanted, without \
     `mimalloc`"
);

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block has.
const WORD: usize = std::mem::size_of::<usize>();

pub struct Mimalloc;

unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            mi::mi_malloc(layout.size()) as *mut u8
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            mi::mi_zalloc(layout.size()) as *mut u8
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD {
            mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to a few pages' worth of small blocks, at every alignment from 1 to 4096:
    /// the pointer has the layout's alignment, the memory is usable, zeroed when asked, and a
    /// reallocation keeps the contents and the alignment.
    #[test]
    fn every_layout_gets_its_alignment() {
        let a = Mimalloc;
        let mut held = Vec::new();
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in (1..=600).chain([1000, 1024, 4096, 8192, 70_000]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xAB, size);
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size} align {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    let r = a.realloc(p, layout, size * 3);
                    assert_eq!(r as usize % align, 0, "realloc: size {size} align {align}");
                    assert!((0..size).all(|i| *r.add(i) == 0xAB));
                    a.dealloc(z, layout);
                    // Some are kept, so later blocks come from partly used pages.
                    if size % 7 == 0 {
                        held.push((r, Layout::from_size_align(size * 3, align).unwrap()));
                    } else {
                        a.dealloc(r, Layout::from_size_align(size * 3, align).unwrap());
                    }
                }
            }
        }
        for (p, l) in held {
            unsafe { a.dealloc(p, l) };
        }
    }

    /// With `override`, C code's `malloc`, `calloc` and `realloc` (librdkafka's, aws-lc's) are
    /// mimalloc's, and so are glibc's own allocations (`strdup` here), which C code frees with
    /// the same `free`: a block from glibc's allocator reaching mimalloc's `free` would corrupt
    /// the heap.
    #[test]
    fn the_c_libraries_allocate_from_mimalloc_too() {
        extern "C" {
            fn malloc(size: usize) -> *mut c_void;
            fn calloc(n: usize, size: usize) -> *mut c_void;
            fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
            fn free(p: *mut c_void);
            fn strdup(s: *const std::ffi::c_char) -> *mut std::ffi::c_char;
            fn mi_is_in_heap_region(p: *const c_void) -> bool;
        }
        unsafe {
            let m = malloc(100);
            let c = calloc(4, 600);
            let r = realloc(malloc(10), 70_000);
            let d = strdup(c"glibc allocates this".as_ptr()) as *mut c_void;
            for (what, p) in [("malloc", m), ("calloc", c), ("realloc", r), ("strdup", d)] {
                assert!(!p.is_null(), "{what}");
                assert!(mi_is_in_heap_region(p), "{what} did not come from mimalloc");
                free(p);
            }
        }
    }
}
