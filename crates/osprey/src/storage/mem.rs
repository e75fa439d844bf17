//! Fixed, zero-initialised buffers backing tables and arenas.
//!
//! Normally an anonymous mapping from [`crate::mmap::map_zeroed`] (lazily
//! committed, so an untouched part of the budget costs no RSS); a buffer
//! smaller than a page (a table's group bits) is zeroed heap memory instead,
//! which saves each process a mapping and a page fault. Under loom the
//! atomics are model objects that must be constructed, so the buffer is a heap
//! slice built with [`Zeroable::zero`]; the code using it is the same.
//!
//! Accessing a `ZeroedBuf` is signal-safe (`as_slice` is pointer arithmetic);
//! creating and dropping it is not.

use super::sync::{AtomicU64, AtomicUsize};

/// Types whose all-zero byte pattern is a valid value.
///
/// # Safety
/// Implementors must guarantee that zeroed memory is a valid `Self`.
pub(crate) unsafe trait Zeroable: Sized {
    /// The value equal to all-zero bytes (used where memory cannot be mapped).
    #[cfg(loom)]
    fn zero() -> Self;
}

// SAFETY: std atomics are plain integers in memory; loom atomics are built by `zero`.
unsafe impl Zeroable for AtomicU64 {
    #[cfg(loom)]
    fn zero() -> Self {
        AtomicU64::new(0)
    }
}
// SAFETY: an all-zero AtomicUsize is 0.
unsafe impl Zeroable for AtomicUsize {
    #[cfg(loom)]
    fn zero() -> Self {
        AtomicUsize::new(0)
    }
}

/// Buffers below this many bytes come from the heap.
#[cfg(not(loom))]
const SMALL: usize = 4096;

/// `len` zeroed `T`s, fixed for the life of the buffer.
pub(crate) struct ZeroedBuf<T: Zeroable> {
    ptr: *const T,
    len: usize,
    /// From the heap (`alloc_zeroed`), not mapped.
    #[cfg(not(loom))]
    heap: bool,
    #[cfg(loom)]
    _owned: Box<[T]>,
}

// SAFETY: the buffer is only handed out as `&[T]`; sharing is as safe as sharing `[T]`.
unsafe impl<T: Zeroable + Sync> Sync for ZeroedBuf<T> {}
// SAFETY: the buffer owns its memory; T is Send.
unsafe impl<T: Zeroable + Send> Send for ZeroedBuf<T> {}

impl<T: Zeroable> ZeroedBuf<T> {
    /// Not signal-safe (maps memory).
    #[cfg(not(loom))]
    pub(crate) fn new(len: usize) -> std::io::Result<Self> {
        let bytes = len
            .checked_mul(core::mem::size_of::<T>())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "buffer too large"))?;
        if bytes > 0 && bytes < SMALL {
            let layout = Self::layout(len)?;
            // SAFETY: a non-zero size; all-zero bytes are a valid `T` (`Zeroable`).
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *const T;
            if ptr.is_null() {
                return Err(std::io::Error::from(std::io::ErrorKind::OutOfMemory));
            }
            return Ok(ZeroedBuf { ptr, len, heap: true });
        }
        let ptr = crate::mmap::map_zeroed(bytes)? as *const T;
        Ok(ZeroedBuf { ptr, len, heap: false })
    }

    #[cfg(not(loom))]
    fn layout(len: usize) -> std::io::Result<std::alloc::Layout> {
        std::alloc::Layout::array::<T>(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    }

    /// Not signal-safe (allocates).
    #[cfg(loom)]
    pub(crate) fn new(len: usize) -> std::io::Result<Self> {
        let owned: Box<[T]> = (0..len).map(|_| T::zero()).collect();
        Ok(ZeroedBuf { ptr: owned.as_ptr(), len, _owned: owned })
    }

    /// Signal-safe.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` valid (zero-initialised) `T`s for the life of `self`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.len * core::mem::size_of::<T>()
    }
}

#[cfg(not(loom))]
impl<T: Zeroable> Drop for ZeroedBuf<T> {
    fn drop(&mut self) {
        if self.heap {
            if let Ok(layout) = Self::layout(self.len) {
                // SAFETY: allocated by `new` with this layout; no borrow is left.
                unsafe { std::alloc::dealloc(self.ptr as *mut u8, layout) };
            }
            return;
        }
        // SAFETY: mapped by `new` with this size; `&mut self` means no borrow is left.
        unsafe { crate::mmap::unmap(self.ptr as *mut u8, self.bytes()) };
    }
}
