//! A ZooKeeper server holding the replicas' aux rules (Debian's package,
//! as tests/zookeeper.rs runs it), killed and started again as a fault.

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use zookeeper_client as zk;

use crate::now;

/// The node the aux rules live in.
pub const PATH: &str = "/soak-rules";

/// One aux rule ahead of the file's: it blocks a descriptor the load never
/// sends, so it changes no decision; `divvy_aux_rules` shows it in force.
pub const RULES: &str = r#"[{"operation": {"rule": "aux-blocked", "actor": "*"}, "creditLimit": 0, "resetSeconds": 60, "label": "aux-blocked"}]"#;

/// A ZooKeeper process on 127.0.0.1; killed on drop (its data dir stays
/// across a kill).
pub struct ZooKeeper {
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    /// Starts one on a fixed free port and writes [`RULES`] to [`PATH`].
    pub fn start() -> ZooKeeper {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::common::stable_port();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("data dir");
        let config = format!(
            "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n",
            data.display()
        );
        std::fs::write(dir.path().join("zoo.cfg"), config).expect("zoo.cfg");
        let mut z = ZooKeeper {
            child: None,
            port,
            dir,
        };
        z.launch();
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let hosts = z.hosts();
        block(async {
            let client = connect(&hosts).await.expect("connect to ZooKeeper");
            client
                .create(PATH, RULES.as_bytes(), &options)
                .await
                .expect("create aux rules")
        });
        z
    }

    /// `127.0.0.1:port`.
    pub fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) and waits up to 60 s for it to answer.
    pub fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("zookeeper.log")).expect("log");
        let child = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
            .arg("/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar")
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.dir.path().join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("java must be installed, with Debian's zookeeper package");
        self.child = Some(child);
        let hosts = self.hosts();
        let give_up = now() + 60.0;
        while block(async { connect(&hosts).await.ok()?.check_stat("/").await.ok() }).is_none() {
            assert!(now() < give_up, "ZooKeeper did not answer within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `f` on a fresh single-threaded runtime.
fn block<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// A client of `hosts`, or why not within 5 s.
async fn connect(hosts: &str) -> Result<zk::Client, String> {
    let connect = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_fail_eagerly()
        .connect(hosts);
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timeout".to_owned()),
    }
}
