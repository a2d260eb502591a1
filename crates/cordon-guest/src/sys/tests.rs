use super::BumpArena;
use std::alloc::{GlobalAlloc, Layout};

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

fn in_arena<const N: usize>(a: &BumpArena<N>, p: *mut u8) -> bool {
    a.offset_of(p).is_some()
}

#[test]
fn the_latest_allocation_is_reused_and_comes_back_zeroed_when_asked() {
    let a = Box::new(BumpArena::<4096>::new());
    // SAFETY: (test) layouts are non-zero; every pointer is freed once with its layout.
    unsafe {
        let p = a.alloc(layout(128, 8));
        assert!(in_arena(&a, p));
        std::ptr::write_bytes(p, 0xff, 128);
        a.dealloc(p, layout(128, 8));
        let z = a.alloc_zeroed(layout(128, 8));
        assert_eq!(z, p, "a freed latest allocation is handed out again");
        assert!(std::slice::from_raw_parts(z, 128).iter().all(|b| *b == 0));
        // Fresh memory past everything handed out is zero without being written.
        let fresh = a.alloc_zeroed(layout(256, 16));
        assert!(
            std::slice::from_raw_parts(fresh, 256)
                .iter()
                .all(|b| *b == 0)
        );
        a.dealloc(fresh, layout(256, 16));
        a.dealloc(z, layout(128, 8));
    }
}

#[test]
fn every_claim_is_aligned_as_malloc_aligns_even_for_bytes() {
    let a = Box::new(BumpArena::<4096>::new());
    // SAFETY: (test) as above.
    unsafe {
        let ptrs: Vec<*mut u8> = (1..6).map(|n| a.alloc(layout(n, 1))).collect();
        for p in &ptrs {
            assert!(in_arena(&a, *p));
            assert_eq!(*p as usize % super::MIN_ALIGN, 0, "{p:?}");
        }
        for (n, p) in ptrs.into_iter().enumerate().rev() {
            a.dealloc(p, layout(n + 1, 1));
        }
    }
}

#[test]
fn realloc_grows_in_place_or_copies_and_keeps_the_contents() {
    let a = Box::new(BumpArena::<4096>::new());
    // SAFETY: (test) as above; realloc gets the layout the pointer was allocated with.
    unsafe {
        let p = a.alloc(layout(16, 8));
        std::ptr::copy_nonoverlapping(b"0123456789abcdef".as_ptr(), p, 16);
        let grown = a.realloc(p, layout(16, 8), 64);
        assert_eq!(grown, p, "the latest allocation grows in place");
        let q = a.alloc(layout(8, 8));
        let moved = a.realloc(grown, layout(64, 8), 128);
        assert_ne!(
            moved, grown,
            "an allocation that is not the latest is copied"
        );
        assert_eq!(std::slice::from_raw_parts(moved, 16), b"0123456789abcdef");
        // Grown in place, freed, claimed again zeroed: the grown bytes are cleared too.
        std::ptr::write_bytes(moved, 0xee, 128);
        a.dealloc(moved, layout(128, 8));
        let z = a.alloc_zeroed(layout(128, 8));
        assert!(std::slice::from_raw_parts(z, 128).iter().all(|b| *b == 0));
        a.dealloc(z, layout(128, 8));
        a.dealloc(q, layout(8, 8));
    }
}

#[test]
fn large_requests_and_a_full_arena_go_to_the_system_allocator() {
    let a = Box::new(BumpArena::<4096>::new());
    // SAFETY: (test) as above.
    unsafe {
        let big = a.alloc(layout(1024, 8));
        assert!(
            !big.is_null() && !in_arena(&a, big),
            "over N/8 is the system's"
        );
        std::ptr::write_bytes(big, 1, 1024);
        a.dealloc(big, layout(1024, 8));
        let mut held = Vec::new();
        loop {
            let p = a.alloc(layout(256, 64));
            assert!(!p.is_null());
            assert_eq!(p as usize % 64, 0, "alignment is honoured");
            held.push(p);
            if !in_arena(&a, p) {
                break;
            }
            assert!(
                held.len() <= 16,
                "a 4 KiB arena holds at most 16 blocks of 256"
            );
        }
        for p in held {
            a.dealloc(p, layout(256, 64));
        }
    }
}

#[test]
fn threads_never_get_overlapping_memory() {
    let a = std::sync::Arc::new(BumpArena::<{ 64 << 10 }>::new());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..400usize {
                    let size = 8 + (i * 7 + t as usize) % 120;
                    // SAFETY: (test) non-zero layout; freed below with the same one.
                    let p = unsafe { a.alloc(layout(size, 8)) };
                    // SAFETY: (test) `p` is valid for `size` bytes.
                    unsafe { std::ptr::write_bytes(p, t + 1, size) };
                    held.push((p as usize, size));
                }
                for &(p, size) in &held {
                    // SAFETY: (test) still allocated, `size` bytes long.
                    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
                    assert!(
                        bytes.iter().all(|b| *b == t + 1),
                        "another thread wrote here"
                    );
                }
                for (p, size) in held {
                    // SAFETY: (test) allocated above with this layout.
                    unsafe { a.dealloc(p as *mut u8, layout(size, 8)) };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
