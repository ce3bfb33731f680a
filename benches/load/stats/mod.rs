//! Statistics and reporting: figures and percentiles, CPU tallies, the
//! printed rows and the closing summary.

pub mod figures;
pub mod format;
pub mod summary;
pub mod tally;
