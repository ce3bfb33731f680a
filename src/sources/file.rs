//! Hot reload of the policy file.
//!
//! The file's directory is watched (not the file), so every way a file gets
//! replaced is seen: a write in place, an editor's rename-over, delete and
//! recreate, and a Kubernetes ConfigMap update (the `..data` symlink swapped
//! atomically). Events are debounced; SIGHUP forces a reload. Each reload
//! reads, parses and validates the file on a blocking thread, off the
//! request path, and installs the new rule set in one atomic store: a
//! request sees the old rules or the new ones, never a mix. A file that does
//! not load changes nothing; the error is logged with its location and kept
//! in [`ReloadStatus`]. Counters are keyed by rule content, so the counters
//! of unchanged rules carry on and those of changed rules start fresh.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::content_hash;
use crate::config::{self, Policy};
use crate::limiter::Limiter;
use crate::observe::metrics::Metrics;
use crate::sources::RuleSources;

/// Quiet time after the last file event before reloading.
pub const DEBOUNCE: Duration = Duration::from_millis(150);
/// Longest a burst of events may postpone a reload.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

/// What is known about the rules in force and the last reload attempt.
pub struct ReloadStatus {
    /// Where the rule count, generation and reload outcomes are recorded.
    metrics: Arc<Metrics>,
    generation: AtomicU64,
    successes: AtomicU64,
    failures: AtomicU64,
    state: Mutex<StatusText>,
}

#[derive(Debug, Default, Clone)]
struct StatusText {
    hash: String,
    loaded_at: Option<SystemTime>,
    last_error: Option<String>,
}

/// A copy of [`ReloadStatus`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSnapshot {
    /// 1 for the rules loaded at startup, +1 per successful reload that changed them.
    pub generation: u64,
    /// SHA-256 of the file content in force (hex).
    pub hash: String,
    /// When the rules in force were loaded.
    pub loaded_at: Option<SystemTime>,
    /// The last failed reload's error, cleared by the next success.
    pub last_error: Option<String>,
    /// Reloads that installed new rules.
    pub successes: u64,
    /// Reloads that failed and changed nothing.
    pub failures: u64,
}

impl ReloadStatus {
    /// No rules loaded yet; recording to `metrics`.
    fn new(metrics: Arc<Metrics>) -> ReloadStatus {
        ReloadStatus {
            metrics,
            generation: AtomicU64::new(0),
            successes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            state: Mutex::new(StatusText::default()),
        }
    }

    /// A snapshot for the admin API and logs.
    pub fn snapshot(&self) -> StatusSnapshot {
        let text = self.state.lock().map(|s| s.clone()).unwrap_or_default();
        StatusSnapshot {
            generation: self.generation.load(Ordering::Acquire),
            hash: text.hash,
            loaded_at: text.loaded_at,
            last_error: text.last_error,
            successes: self.successes.load(Ordering::Acquire),
            failures: self.failures.load(Ordering::Acquire),
        }
    }

    fn installed(&self, hash: String, rules: usize) {
        self.metrics
            .rules
            .set(i64::try_from(rules).unwrap_or(i64::MAX));
        if let Ok(mut s) = self.state.lock() {
            s.hash = hash;
            s.loaded_at = Some(SystemTime::now());
            s.last_error = None;
        }
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.metrics
            .generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    fn failed(&self, error: String) {
        self.metrics.reloads.with_label_values(&["failure"]).inc();
        if let Ok(mut s) = self.state.lock() {
            s.last_error = Some(error);
        }
        self.failures.fetch_add(1, Ordering::AcqRel);
    }

    fn clear_error(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.last_error = None;
        }
    }

    fn current_hash(&self) -> String {
        self.state
            .lock()
            .map(|s| s.hash.clone())
            .unwrap_or_default()
    }
}

/// Reloads one policy file into the rule sources (which install it, with
/// any aux rules, in the limiter).
pub struct Reloader {
    /// The policy file or directory; `None` when rules come from xDS alone.
    path: Option<PathBuf>,
    sources: Arc<RuleSources>,
    status: Arc<ReloadStatus>,
}

/// The outcome of one reload attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// New rules are in force.
    Installed,
    /// The file's content did not change.
    Unchanged,
}

impl Reloader {
    /// A reloader for the rules already in `limiter`, loaded from `path`
    /// whose content hashed to `hash` (generation 1), installing through `sources`.
    pub fn new(
        path: Option<PathBuf>,
        limiter: &Limiter,
        sources: Arc<RuleSources>,
        hash: String,
    ) -> Reloader {
        let status = Arc::new(ReloadStatus::new(limiter.telemetry().metrics.clone()));
        status.installed(hash, limiter.rules().rules().len());
        Reloader {
            path,
            sources,
            status,
        }
    }

    /// The status shared with the admin API.
    pub fn status(&self) -> Arc<ReloadStatus> {
        self.status.clone()
    }

    /// Reads, validates and installs the file now (on a blocking thread).
    /// Content identical to the rules in force is not even parsed.
    pub async fn reload(&self) -> Result<Reloaded, String> {
        let Some(path) = self.path.clone() else {
            return Ok(Reloaded::Unchanged);
        };
        let current = self.status.current_hash();
        let loaded = tokio::task::spawn_blocking(move || load_if_changed(&path, &current)).await;
        let outcome = match loaded {
            Ok(Ok(None)) => {
                // Back to the content in force: an earlier error no longer applies.
                self.status.clear_error();
                return Ok(Reloaded::Unchanged);
            }
            Ok(Ok(Some((policy, hash)))) => match self.sources.install_file(policy) {
                Err(e) => Err(format!(
                    "the new policy and the aux rules in force do not fit together: {e}"
                )),
                Ok(rules) => {
                    self.status.installed(hash.clone(), rules);
                    self.status.successes.fetch_add(1, Ordering::AcqRel);
                    self.status
                        .metrics
                        .reloads
                        .with_label_values(&["success"])
                        .inc();
                    tracing::info!(
                        rules,
                        generation = self.status.generation.load(Ordering::Acquire),
                        hash = %&hash[..12],
                        "policy reloaded"
                    );
                    Ok(Reloaded::Installed)
                }
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("reload task failed: {e}")),
        };
        if let Err(e) = &outcome {
            tracing::error!("policy reload failed; the rules in force are unchanged: {e}");
            self.status.failed(e.clone());
        }
        outcome
    }

    /// Watches the file's directory and reloads on changes (debounced), and
    /// on SIGHUP. Runs until the runtime stops. A watcher that cannot start
    /// is reported; SIGHUP still works.
    pub fn spawn(self: Arc<Self>, watch: bool) -> tokio::task::JoinHandle<()> {
        let (tx, mut rx) = mpsc::channel::<()>(64);
        let Some(path) = self.path.clone() else {
            return tokio::spawn(async {});
        };
        let watcher = if watch {
            match watch_dir(&path, tx.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!(
                        "cannot watch {} for changes ({e}); reload with SIGHUP",
                        path.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        // The file may have changed between the first load and the watcher
        // starting: look once more (free when the content is the same).
        let _ = tx.try_send(());
        let tx_watch = tx.clone();
        spawn_sighup(tx);
        tokio::spawn(async move {
            // Keep the watcher alive as long as this task.
            let mut watcher = watcher;
            while rx.recv().await.is_some() {
                // Debounce: wait until events stop for DEBOUNCE, but never
                // longer than MAX_DEBOUNCE in all.
                let give_up = tokio::time::Instant::now() + MAX_DEBOUNCE;
                loop {
                    let wait = DEBOUNCE
                        .min(give_up.saturating_duration_since(tokio::time::Instant::now()));
                    if wait.is_zero() {
                        break;
                    }
                    match tokio::time::timeout(wait, rx.recv()).await {
                        Ok(Some(())) => continue,
                        Ok(None) => return,
                        Err(_) => break,
                    }
                }
                // Watch afresh before reading: after a symlink swap the old
                // watch still follows the directory it replaced.
                if watcher.is_some() {
                    watcher = rewatch(&path, &tx_watch).or(watcher);
                }
                let _ = self.reload().await;
            }
        })
    }
}

/// A new watcher of `path`; `None` (and the error logged) when it cannot start.
fn rewatch(path: &Path, tx: &mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    watch_dir(path, tx.clone())
        .inspect_err(|e| tracing::warn!("cannot watch {} afresh ({e})", path.display()))
        .ok()
}

/// Loads a policy (file or directory) and hashes what it was loaded from.
pub fn load_with_hash(path: &Path) -> Result<(Policy, String), config::ConfigError> {
    let (files, hash) = read_hashed(path)?;
    Ok((config::load_source(path, &files)?, hash))
}

/// Reads the source once and hashes it; parses and validates it only when
/// its hash differs from `current`.
fn load_if_changed(
    path: &Path,
    current: &str,
) -> Result<Option<(Policy, String)>, config::ConfigError> {
    let (files, hash) = read_hashed(path)?;
    if hash == current {
        return Ok(None);
    }
    config::load_source(path, &files).map(|policy| Some((policy, hash)))
}

/// The source's files and their hash (of the one file's bytes; for a
/// directory, of every file's name and bytes).
fn read_hashed(path: &Path) -> Result<(Vec<config::SourceFile>, String), config::ConfigError> {
    let files = config::read_source(path)?;
    let hash = match files.as_slice() {
        [one] if !path.is_dir() => content_hash(&one.bytes),
        many => {
            let mut all = Vec::new();
            for f in many {
                let name = f.path.file_name().map(|n| n.to_string_lossy().into_owned());
                all.extend_from_slice(name.unwrap_or_default().as_bytes());
                all.push(0);
                all.extend_from_slice(&(f.bytes.len() as u64).to_le_bytes());
                all.extend_from_slice(&f.bytes);
            }
            content_hash(&all)
        }
    };
    Ok((files, hash))
}

fn watch_dir(path: &Path, tx: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    // Absolute, symlinks kept: the links found below and the paths events
    // carry are then in one form.
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let whole_dir = path.is_dir();
    let dir = match path.parent() {
        Some(d) if !whole_dir => d.to_path_buf(),
        _ => path.clone(),
    };
    let name = path.file_name().map(|n| n.to_os_string());
    let links = linked_ancestors(&dir);
    let (watched, link_paths) = (dir.clone(), links.clone());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Changes to the file itself (written, renamed over, deleted,
        // recreated) or to the ConfigMap's `..data` symlink; never mere
        // reads, which include our own.
        let Ok(event) = event else { return };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        // Events dropped by the kernel come without paths: look again.
        let ours = event.paths.is_empty()
            || event.paths.iter().any(|p| {
                let in_dir = p.parent() == Some(watched.as_path()) || *p == watched;
                // A directory: any file in it added, changed or removed.
                in_dir
                    && (whole_dir
                        || p.file_name().is_some_and(|f| {
                            Some(f) == name.as_deref() || f.to_string_lossy().starts_with("..data")
                        }))
            });
        // A symlink on the way to the policy swapped to a new target.
        let swapped = event.paths.iter().any(|p| link_paths.contains(p));
        if ours || swapped {
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    for parent in links.iter().filter_map(|l| l.parent()) {
        if parent == dir {
            continue;
        }
        // Without it a swap goes unseen, but edits in place still reload.
        if let Err(e) = watcher.watch(parent, RecursiveMode::NonRecursive) {
            tracing::warn!(
                "cannot watch {} for a swap of the symlink in it ({e}); reload with SIGHUP after one",
                parent.display()
            );
        }
    }
    Ok(watcher)
}

/// `dir` and its ancestors that are symlinks (envoyproxy/ratelimit's
/// `RUNTIME_ROOT`, `/srv/runtime_data/current`, is one, swapped to a new
/// directory on each deploy). A watch follows the directory a link named
/// when it began, so a swap is seen only by watching the link's parent.
fn linked_ancestors(dir: &Path) -> Vec<PathBuf> {
    dir.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .filter(|a| std::fs::symlink_metadata(a).is_ok_and(|m| m.file_type().is_symlink()))
        .map(Path::to_path_buf)
        .collect()
}

#[cfg(unix)]
fn spawn_sighup(tx: mpsc::Sender<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading the policy");
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("cannot handle SIGHUP: {e}"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup(_tx: mpsc::Sender<()>) {}
