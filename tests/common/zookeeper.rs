//! A ZooKeeper server for aux-rule tests and the soak: Debian's
//! `zookeeper` package on a JRE, on a free loopback port with a private
//! data dir, and a `zookeeper-client` to write its nodes.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zookeeper_client as zk;

/// How long a (re)started server may take to answer: the JVM starts
/// slowly on a loaded machine, and the soak restarts it under load.
const START_BOUND: Duration = Duration::from_secs(60);

/// A ZooKeeper server process on 127.0.0.1; killed on drop (its data dir
/// stays across [`ZooKeeper::kill`] and [`ZooKeeper::launch`]).
pub struct ZooKeeper {
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    /// Starts one on a free port.
    pub fn start() -> ZooKeeper {
        let mut z = ZooKeeper::configure(super::stable_port());
        z.launch();
        z
    }

    /// Writes the config for `port` without starting the server.
    pub fn configure(port: u16) -> ZooKeeper {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("data dir");
        std::fs::write(
            dir.path().join("zoo.cfg"),
            format!(
                "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n",
                data.display()
            ),
        )
        .expect("zoo.cfg");
        ZooKeeper {
            child: None,
            port,
            dir,
        }
    }

    /// The server's log (stdout and stderr of every launch, appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("zookeeper.log")
    }

    /// Starts the server (again, on the same port and data dir) and waits
    /// until it answers.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "ZooKeeper already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("zookeeper log");
        let child = Command::new("java")
            .args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar",
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(self.dir.path().join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("java must be installed, with Debian's zookeeper package");
        self.child = Some(child);
        let deadline = Instant::now() + START_BOUND;
        loop {
            let up = block(async {
                let client = connect(&self.hosts()).await.ok()?;
                client.check_stat("/").await.ok()
            });
            if up.is_some() {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!("ZooKeeper exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ZooKeeper on port {} did not answer within {START_BOUND:?}:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The log so far, for a failure message.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it; the data dir stays.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `127.0.0.1:port`.
    pub fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Writes `data` to `path`, creating it (and its parents) if missing;
    /// returns the instant just before the write was sent.
    pub fn set(&self, path: &str, data: &str) -> Instant {
        block(async {
            let client = connect(&self.hosts()).await.expect("connect to ZooKeeper");
            let sent = Instant::now();
            match client.set_data(path, data.as_bytes(), None).await {
                Ok(_) => return sent,
                Err(zk::Error::NoNode) => {}
                Err(e) => panic!("set {path}: {e}"),
            }
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            let parent = path.rfind('/').map_or("", |i| &path[..i]);
            if !parent.is_empty() {
                client.mkdir(parent, &options).await.expect("mkdir");
            }
            let sent = Instant::now();
            client
                .create(path, data.as_bytes(), &options)
                .await
                .unwrap_or_else(|e| panic!("create {path}: {e}"));
            sent
        })
    }

    /// Deletes `path`; returns the instant just before the delete was sent.
    pub fn delete(&self, path: &str) -> Instant {
        block(async {
            let client = connect(&self.hosts()).await.expect("connect to ZooKeeper");
            let sent = Instant::now();
            client
                .delete(path, None)
                .await
                .unwrap_or_else(|e| panic!("delete {path}: {e}"));
            sent
        })
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `f` on a fresh single-threaded runtime (the client's session task
/// runs on it while `f` runs and ends with it).
pub fn block<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// A client of `hosts`, or why not within 5 s.
pub async fn connect(hosts: &str) -> Result<zk::Client, String> {
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
