//! The process's allocator: mimalloc, called as C's `malloc` is wherever a
//! plain block already has the alignment asked for.
//!
//! The `mimalloc` crate sends every allocation to `mi_malloc_aligned`,
//! whose slow path (taken whenever a page's free list runs empty)
//! over-allocates for size classes that are not a power of two. [`MiMalloc`]
//! calls `mi_malloc`, `mi_zalloc` and `mi_realloc` where their blocks are
//! aligned enough, and the aligned functions elsewhere: measured cheaper,
//! see docs/performance.md, "The allocator".

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

/// The alignment `mi_malloc` guarantees a block whose size is a multiple of
/// it: C's `malloc` must return memory aligned for any fundamental type
/// that fits (`alignof(max_align_t)`, 16 on the 64-bit targets divvy builds
/// for; mimalloc's `MI_MAX_ALIGN_SIZE`), the rule Rust's own `System`
/// allocator relies on (`align <= MIN_ALIGN && align <= size`). In
/// mimalloc 3 itself: the size classes above 8 bytes are multiples of 16,
/// and their pages' blocks start 16-aligned.
const PLAIN_ALIGN: usize = 16;

/// Whether a plain `mi_malloc` block of `size` bytes has alignment `align`:
/// `align` at most [`PLAIN_ALIGN`] and `size` a multiple of it (as every
/// Rust type's size is of its alignment), so the block's size class is too.
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && size.is_multiple_of(align)
}

/// mimalloc as Rust's global allocator (`#[global_allocator]` in the
/// `divvy` binary and the in-process benchmarks).
pub struct MiMalloc;

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free`
// takes blocks of the plain and the aligned functions alike); a block has
// the layout's alignment because either [`plain`] holds (see
// [`PLAIN_ALIGN`]) or mimalloc's aligned function was asked for it.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's functions take any size and alignment (a
        // power of two, as a `Layout`'s is) and return null when they fail.
        unsafe {
            if plain(layout.size(), layout.align()) {
                libmimalloc_sys::mi_malloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if plain(layout.size(), layout.align()) {
                libmimalloc_sys::mi_zalloc(layout.size()).cast()
            } else {
                libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new
        // block keeps its alignment as `alloc`'s would.
        unsafe {
            if plain(new_size, layout.align()) {
                libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align())
                    .cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment from 1 to 4096, every size to 1 KiB and sizes around
    /// each KiB to 64 KiB: each block has its alignment, and survives a
    /// write of its whole size, a grow and a shrink.
    #[test]
    fn blocks_have_the_alignment_asked_for() {
        let a = MiMalloc;
        let mut sizes: Vec<usize> = (1..=1024).collect();
        sizes.extend((1..=64).flat_map(|k| [k * 1024 - 8, k * 1024, k * 1024 + 16]));
        for shift in 0..=12 {
            let align = 1usize << shift;
            for &size in &sizes {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: non-zero sizes; every block is freed with its layout.
                unsafe {
                    for zeroed in [false, true] {
                        let p = if zeroed {
                            a.alloc_zeroed(layout)
                        } else {
                            a.alloc(layout)
                        };
                        assert!(!p.is_null(), "size {size} align {align}");
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        if zeroed {
                            assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                        }
                        p.write_bytes(0xa5, size);
                        let bigger = size * 2 + align;
                        let q = a.realloc(p, layout, bigger);
                        assert_eq!(q as usize % align, 0, "grown to {bigger}, align {align}");
                        assert_eq!(*q.add(size - 1), 0xa5);
                        let smaller = (size / 2).max(1);
                        let grown = Layout::from_size_align(bigger, align).expect("layout");
                        let r = a.realloc(q, grown, smaller);
                        assert_eq!(r as usize % align, 0, "shrunk to {smaller}, align {align}");
                        assert_eq!(*r, 0xa5);
                        a.dealloc(r, Layout::from_size_align(smaller, align).expect("layout"));
                    }
                }
            }
        }
    }

    #[test]
    fn plain_only_where_the_size_class_keeps_the_alignment() {
        assert!(plain(48, 16));
        assert!(plain(24, 8));
        assert!(plain(5, 1));
        assert!(!plain(24, 16), "24 is not a multiple of 16");
        assert!(!plain(64, 32));
        assert!(!plain(128, 128));
    }
}
