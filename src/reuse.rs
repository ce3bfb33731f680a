//! Lists a request reuses from the previous one on the same thread, so
//! that once warm its working lists cost no allocation.

use std::cell::Cell;
use std::thread::LocalKey;

/// A thread's kept list of `T` (declare one with `thread_local!` and
/// `const { Cell::new(Vec::new()) }`).
pub type Kept<T> = LocalKey<Cell<Vec<T>>>;

/// Most items a list may have room for to be kept: a request of many
/// descriptors does not pin its lists' memory to the thread.
const MOST: usize = 16;

/// An empty list: the thread's kept one, if any.
pub fn take<T>(kept: &'static Kept<T>) -> Vec<T> {
    kept.take()
}

/// Keeps `list`, emptied, for the thread's next [`take`].
pub fn keep<T>(kept: &'static Kept<T>, mut list: Vec<T>) {
    if list.capacity() <= MOST {
        list.clear();
        kept.set(list);
    }
}
