//! The governor: turns a rule's rate up and down from a live load metric.
//!
//! [`pid`] is the controller (pure arithmetic on an injected clock),
//! [`prometheus`] reads the load, [`lease`] elects the one replica that
//! governs a rule, and [`run`] drives them, setting the rule's
//! `creditLimit` knob: the governor changes limits only through knobs.

pub mod lease;
pub mod pid;
pub mod prometheus;
pub mod run;

pub use run::{GovernorState, Governors};
