//! Lists a decision reuses from the previous one on the same thread, so
//! that once warm a request's counter ops and tallies cost no allocation.

use std::cell::Cell;

use crate::store::CounterOp;

use super::record::Tally;

thread_local! {
    static OPS: Cell<Vec<CounterOp>> = const { Cell::new(Vec::new()) };
    static TALLIES: Cell<Vec<Tally>> = const { Cell::new(Vec::new()) };
}

/// Most items a list may have room for to be kept: a request of many
/// descriptors does not pin its lists' memory to the thread.
const KEEP: usize = 16;

/// An empty list of ops (the thread's kept one, if any).
pub(super) fn ops() -> Vec<CounterOp> {
    OPS.take()
}

/// An empty list of tallies (the thread's kept one, if any).
pub(super) fn tallies() -> Vec<Tally> {
    TALLIES.take()
}

/// Keeps `ops`, emptied, for the thread's next request.
pub(super) fn keep_ops(mut ops: Vec<CounterOp>) {
    if ops.capacity() <= KEEP {
        ops.clear();
        OPS.set(ops);
    }
}

/// Keeps `tallies`, emptied, for the thread's next request.
pub(super) fn keep_tallies(mut tallies: Vec<Tally>) {
    if tallies.capacity() <= KEEP {
        tallies.clear();
        TALLIES.set(tallies);
    }
}
