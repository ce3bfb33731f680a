//! The container image. `scripts/build-image.sh` builds it with podman (a
//! release build; a few minutes) and saves it as an OCI archive; the test
//! exports a container's filesystem, checks what is in it and its size, and
//! runs that tree the way a container runtime would: as 65532:65532 under
//! chroot, with an empty environment and the root mounted read-only (a bind
//! mount in a private mount namespace), then asks it over its three
//! protocols. `podman run` is refused on the CI machines (crun cannot set
//! RLIMIT_NOFILE in their sandbox), so the ENTRYPOINT, CMD, USER and ports
//! are checked in the image's config, and the tree is started with that
//! ENTRYPOINT and CMD plus loopback addresses on free ports (the defaults
//! 8081, 8321 and 8080 could be in use).
//!
//! Needs root (chroot, mount) and podman; tests/run-all.sh installs podman
//! and CI runs as root. To reuse a release binary while working on the
//! script: `DIVVY_BINARY=target/release/divvy cargo test --test image -- --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use common::{desc, http_request, parse_ok, request, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The most the unpacked image may weigh, in bytes.
const MAX_BYTES: u64 = 20_000_000;
/// A tag the test adds, to check TAG (a full name is used as it is).
const EXTRA_TAG: &str = "localhost/divvy-image-test:ci";
/// The files of the image besides the shared libraries and the loader.
const FILES: [&str; 6] = [
    "usr/local/bin/divvy",
    "etc/divvy/divvy.yaml",
    "etc/passwd",
    "etc/group",
    "etc/nsswitch.conf",
    "etc/ssl/certs/ca-certificates.crt",
];
/// The image's command line (ENTRYPOINT then CMD).
const ENTRYPOINT: &str = "/usr/local/bin/divvy";
const CMD: [&str; 3] = ["serve", "--config", "/etc/divvy/divvy.yaml"];

/// Runs podman with `args`; its stdout, trimmed (panics with its stderr on failure).
fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run podman ({e}): run `bash tests/run-all.sh`, which installs it")
        });
    assert!(
        out.status.success(),
        "podman {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `podman image inspect --format FORMAT IMAGE`.
fn inspect(image: &str, format: &str) -> String {
    podman(&["image", "inspect", "--format", format, image])
}

/// Runs a host command and asserts that it succeeds; its stdout.
fn run(program: &str, args: &[&Path]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A container, removed on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", &self.0])
            .output();
    }
}

/// One entry of a tree: (kind, size, mtime, mode).
type Entry = (char, u64, SystemTime, u32);

/// Every entry under `root`, by path relative to it (symlinks not followed).
fn listing(root: &Path) -> BTreeMap<PathBuf, Entry> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            let kind = if meta.is_dir() {
                todo.push(path.clone());
                'd'
            } else if meta.is_symlink() {
                'l'
            } else if meta.is_file() {
                'f'
            } else {
                '?'
            };
            let mtime = meta.modified().expect("mtime");
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            out.insert(rel, (kind, meta.len(), mtime, meta.permissions().mode()));
        }
    }
    out
}

/// Removes from `command`'s environment what cargo sets for a test process:
/// a build script that reads CARGO_MANIFEST_DIR (ring's) would otherwise see
/// this crate's, and the script's release build would differ from (and
/// rebuild over) the one a shell makes.
fn without_cargo_test_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo_test = ["CARGO_PKG_", "CARGO_BIN_EXE_"]
            .iter()
            .any(|p| key.starts_with(p))
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref());
        if set_by_cargo_test {
            command.env_remove(key.as_ref());
        }
    }
}

/// Builds the image with the script (tags, `--save`), checks the tags and
/// the image's config, and returns its id and the archive's path.
fn build_image(work: &Path) -> (String, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let archive = work.join("divvy.oci.tar");
    // The release build goes to the target directory these tests were built
    // in (CARGO_TARGET_TMPDIR is its tmp/), so a build already made is reused.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir");
    let mut script = Command::new("bash");
    without_cargo_test_env(&mut script);
    let out = script
        .arg(root.join("scripts/build-image.sh"))
        .arg("--save")
        .arg(&archive)
        .arg(EXTRA_TAG)
        .env("CONTAINER_ENGINE", "podman")
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run scripts/build-image.sh");
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{log}"
    );

    let version = env!("CARGO_PKG_VERSION");
    let id = inspect(&format!("divvy:{version}"), "{{.Id}}");
    for tag in ["divvy:latest", EXTRA_TAG] {
        let tagged = inspect(tag, "{{.Id}}");
        assert_eq!(tagged, id, "{tag} is not the image divvy:{version}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&inspect(&id, "{{json .Config}}")).expect("image config is JSON");
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!([ENTRYPOINT]),
        "{config}"
    );
    assert_eq!(config["Cmd"], serde_json::json!(CMD), "{config}");
    let ports: Vec<&str> = config["ExposedPorts"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(ports, ["8080/tcp", "8081/tcp", "8321/tcp"], "{config}");

    let size: u64 = inspect(&id, "{{.Size}}").parse().expect("image size");
    println!("image divvy:{version} ({id:.12}): {size} bytes (podman image inspect)");
    assert!(
        size <= MAX_BYTES,
        "the image is {size} bytes, over {MAX_BYTES}"
    );
    (id, archive)
}

/// Exports a container of image `id` and unpacks its filesystem into `tree`.
fn export_tree(id: &str, work: &Path, tree: &Path) {
    let name = format!("divvy-image-test-{}", std::process::id());
    podman(&["create", "--replace", "--name", &name, id]);
    let _container = Container(name.clone());
    let tar = work.join("rootfs.tar");
    podman(&[
        "export",
        "--output",
        tar.to_str().expect("UTF-8 path"),
        &name,
    ]);
    std::fs::create_dir(tree).expect("create tree dir");
    run("tar", &[Path::new("-xf"), &tar, Path::new("-C"), tree]);
}

/// What the tree may hold: the binary, the policy, the user database, the CA
/// certificates and shared libraries; nothing else (no shell, no tools).
fn check_layout(tree: &Path) {
    let files = listing(tree);
    for required in FILES.iter().chain(&["lib64/ld-linux-x86-64.so.2"]) {
        let entry = files.get(Path::new(required));
        assert!(
            matches!(entry, Some(('f', ..))),
            "{required} is missing: {files:#?}"
        );
    }
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash", "bin/busybox"] {
        assert!(!tree.join(shell).exists(), "{shell} in the image");
    }
    let mut total = 0;
    for (path, (kind, size, ..)) in &files {
        let library =
            (path.starts_with("lib") || path.starts_with("lib64") || path.starts_with("usr/lib"))
                && path.to_string_lossy().contains(".so");
        match kind {
            'd' => {}
            'f' => assert!(
                FILES.iter().any(|f| path == Path::new(f)) || library,
                "unexpected file {} in the image",
                path.display()
            ),
            'l' if path == Path::new("bin/ratelimit") => {
                let target = std::fs::read_link(tree.join(path)).expect("readlink");
                assert_eq!(
                    target,
                    Path::new(ENTRYPOINT),
                    "/bin/ratelimit points elsewhere"
                );
            }
            _ => panic!("unexpected {kind} entry {} in the image", path.display()),
        }
        total += size;
    }
    println!("exported tree: {total} bytes in {} entries", files.len());
    assert!(
        total <= MAX_BYTES,
        "the exported tree is {total} bytes, over {MAX_BYTES}"
    );

    let passwd = std::fs::read_to_string(tree.join("etc/passwd")).expect("passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("nonroot:x:65532:65532:")),
        "{passwd}"
    );
    let group = std::fs::read_to_string(tree.join("etc/group")).expect("group");
    assert!(group.lines().any(|l| l == "nonroot:x:65532:"), "{group}");
}

/// Runs the image's command in the tree, as a container runtime would:
/// as 65532:65532, with an empty environment, on a read-only mount of the
/// tree, the ports moved to free ones on 127.0.0.1.
fn serve_tree(tree: &Path) -> Server {
    let mut argv = vec![ENTRYPOINT];
    argv.extend(CMD);
    argv.extend(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"]);
    argv.extend(["--http-addr", "127.0.0.1:0"]);
    in_tree(tree, &[], &argv)
}

/// `argv` run in the tree with only `env` (`NAME=value`) as 65532:65532 on
/// a read-only bind mount of it. The wrapper runs in its own mount
/// namespace, so the mount goes away with the server; each step ends in
/// exec, so the server's pid is the child's.
fn in_tree(tree: &Path, env: &[&str], argv: &[&str]) -> Server {
    const WRAPPER: &str = r#"set -e
root=$1; shift
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
exec env -i "$@""#;
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chroot (coreutils) is installed");
    let mut command = Command::new("unshare");
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            WRAPPER,
            "sh",
        ])
        .arg(tree)
        .args(env)
        .args([chroot, "--userspec=65532:65532"])
        .arg(tree)
        .args(argv);
    Server::spawn(command)
}

/// The server process `pid` runs as 65532:65532 with an empty environment,
/// and its root directory is a read-only mount.
fn check_process(pid: u32) {
    let proc = |name: &str| std::fs::read(format!("/proc/{pid}/{name}")).expect("read /proc");
    let status = String::from_utf8(proc("status")).expect("status");
    for id in ["Uid", "Gid"] {
        let line = format!("\n{id}:\t65532\t65532\t65532\t65532\n");
        assert!(status.contains(&line), "not 65532:65532:\n{status}");
    }
    let environ = proc("environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.is_empty(), "the server's environment: {environ}");
    // Mount points are relative to the process's root: the last mount at
    // "/" is its root.
    let mounts = String::from_utf8(proc("mountinfo")).expect("mountinfo");
    let root = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.len() > 5 && f[4] == "/")
        .unwrap_or_else(|| panic!("no root mount in the server's mountinfo:\n{mounts}"));
    assert!(
        root[5].split(',').any(|o| o == "ro"),
        "the server's root is not read-only: {root:?}"
    );
}

#[tokio::test]
async fn image_builds_and_its_tree_serves_read_only_as_nonroot() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "tests/image.rs needs root: it runs the image's tree with chroot and a read-only bind \
         mount (CI runs as root; locally: sudo -E cargo test --test image)"
    );
    let work = tempfile::tempdir().expect("temp dir");
    let (id, archive) = build_image(work.path());

    let entries = run("tar", &[Path::new("-tf"), &archive]);
    for name in ["index.json", "oci-layout"] {
        assert!(
            entries.lines().any(|l| l == name),
            "{name} not in the --save archive:\n{entries}"
        );
    }

    let tree = work.path().join("rootfs");
    export_tree(&id, work.path(), &tree);
    check_layout(&tree);
    let before = listing(&tree);

    let mut server = serve_tree(&tree);
    check_process(server.pid());

    let (code, body) = http_request(server.http, "GET", "/healthz", "", None);
    assert_eq!(code, 200, "/healthz: {body}");

    // The default policy: cookies-per-ip, 3 an hour by IP.
    let answer = server.line_exchange(b"HIT method=GET path=/pantry/cookies/oat ip=192.0.2.7\n");
    let (allowed, credits, _) = parse_ok(&answer);
    assert!(allowed && credits == 2, "HIT answered {answer:?}");

    // The default policy: edge-login, 5 a minute per client address.
    let mut client = server.client().await;
    let entries = [("path", "/login"), ("remote_address", "192.0.2.7")];
    let answer = common::ask(&mut client, request("edge", vec![desc(&entries)])).await;
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    let limit = answer.statuses[0]
        .current_limit
        .as_ref()
        .expect("current limit");
    assert_eq!(
        (limit.requests_per_unit, answer.statuses[0].limit_remaining),
        (5, 4),
        "{answer:?}"
    );

    let exit = server.terminate();
    assert!(exit.success(), "divvy exited with {exit} on SIGTERM");

    // /bin/ratelimit: envoyproxy/ratelimit's process, from its environment.
    let server = ratelimit_in_tree(&tree);
    let (code, body) = http_request(server.http, "GET", "/healthcheck", "", None);
    assert_eq!((code, body.trim()), (200, "OK"));
    let mut client = server.client().await;
    let answer = common::ask(&mut client, request("edge", vec![desc(&entries)])).await;
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    drop(server);
    assert_eq!(listing(&tree), before, "the server changed its filesystem");
}

/// `/bin/ratelimit` in the tree with envoyproxy/ratelimit's variables only:
/// its files under `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`
/// (here the image's /etc/divvy), its ports moved to free ones.
fn ratelimit_in_tree(tree: &Path) -> Server {
    let env = [
        "RUNTIME_ROOT=/etc",
        "RUNTIME_SUBDIRECTORY=divvy",
        "RUNTIME_APPDIRECTORY=.",
        "USE_STATSD=false",
        "LOG_LEVEL=info",
        "HOST=127.0.0.1",
        "PORT=0",
        "GRPC_HOST=127.0.0.1",
        "GRPC_PORT=0",
    ];
    in_tree(tree, &env, &["/bin/ratelimit"])
}
