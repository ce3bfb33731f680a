//! The ZooKeeper holding the replicas' aux rules (the launcher
//! tests/zookeeper.rs uses, from tests/common), killed and started again
//! as a fault.

use crate::common::zookeeper::ZooKeeper;

/// The node the aux rules live in.
pub const PATH: &str = "/soak-rules";

/// One aux rule ahead of the file's: it blocks a descriptor the load never
/// sends, so it changes no decision; `divvy_aux_rules` shows it in force.
pub const RULES: &str = r#"[{"operation": {"rule": "aux-blocked", "actor": "*"}, "creditLimit": 0, "resetSeconds": 60, "label": "aux-blocked"}]"#;

/// Starts a ZooKeeper on a free port and writes [`RULES`] to [`PATH`].
pub fn start() -> ZooKeeper {
    let zk = ZooKeeper::start();
    zk.set(PATH, RULES);
    zk
}
