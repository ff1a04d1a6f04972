//! An event's short attributes are held inline (`sluice_core::Str`): making an event whose id,
//! source, type and subject fit in 24 bytes allocates nothing for them (docs/decisions.md,
//! "Event attributes are compact strings"). Counted with an allocator that counts this
//! thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice_core::{Event, Str};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the count is a
// thread-local `Cell` with a constant initializer and no destructor, so reading it never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = std::hint::black_box(f());
    (out, ALLOCATIONS.with(Cell::get) - before)
}

#[test]
fn short_attributes_allocate_nothing() {
    let (e, n) =
        allocations(|| Event::new("orders-12-34567890", "orders", "kafka").with_subject("orders"));
    assert_eq!(n, 0, "{e:?}");
    // The extension list is the one allocation; its short name and value are inline.
    let (e, n) = allocations(|| {
        let mut e = e;
        e.set_extension("partitionkey", "k17");
        e
    });
    assert_eq!(n, 1, "{e:?}");
    let (copy, n) = allocations(|| e.clone());
    assert_eq!(n, 1, "only the extension list is copied: {copy:?}");
}

#[test]
fn text_joined_from_pieces_is_inline_up_to_24_bytes() {
    // How the Kafka source makes `<topic>-<partition>-<offset>`.
    let (id, n) = allocations(|| {
        ["orders", "-", "12", "-", "34567890"]
            .into_iter()
            .collect::<Str>()
    });
    assert_eq!((id.as_str(), n), ("orders-12-34567890", 0));
    let (id, n) = allocations(|| {
        ["a-twelve-chr", "-", "12", "-", "12345678"]
            .into_iter()
            .collect::<Str>()
    });
    assert_eq!((id.len(), n), (24, 0));
    let (id, n) = allocations(|| {
        ["a-thirteen-ch", "-", "12", "-", "12345678"]
            .into_iter()
            .collect::<Str>()
    });
    assert_eq!((id.as_str(), n), ("a-thirteen-ch-12-12345678", 1));
}
