//! The async runtime `divvy serve` runs on: one thread per CPU the process
//! may use, and on one CPU tokio's single-threaded scheduler.
//!
//! With one CPU (a container limited to one core, a process pinned with
//! `taskset`), a multi-threaded runtime still hands every task between its
//! one worker and the thread that drives the server's main future, and
//! wakes them through its shared queues. The single-threaded scheduler
//! runs everything on one thread, measured cheaper per call on one pinned
//! core (docs/performance.md, "Single-threaded runtime on one CPU").
//! `--worker-threads` overrides the choice (1: the single-threaded
//! scheduler; more: that many workers).

use std::num::NonZeroUsize;

use thiserror::Error;
use tokio::runtime::{Builder, Handle, Runtime, RuntimeFlavor};

/// The most worker threads `--worker-threads` accepts.
pub const MAX_WORKER_THREADS: usize = 1024;

/// Why the runtime could not start.
#[derive(Debug, Error)]
#[error("cannot start the async runtime ({threads} worker thread(s)): {source}")]
pub struct RuntimeError {
    /// The worker threads asked for.
    pub threads: usize,
    /// What the operating system said.
    #[source]
    pub source: std::io::Error,
}

/// The worker threads to run: `requested`, or one per CPU this process may
/// use (its CPU affinity and cgroup quota, as the standard library reads
/// them; 1 if that cannot be read).
pub fn worker_threads(requested: Option<NonZeroUsize>) -> NonZeroUsize {
    requested
        .or_else(|| std::thread::available_parallelism().ok())
        .unwrap_or(NonZeroUsize::MIN)
}

/// A runtime with `threads` workers: tokio's single-threaded scheduler for
/// one, its multi-threaded one otherwise; timers and I/O enabled.
pub fn build(threads: NonZeroUsize) -> Result<Runtime, RuntimeError> {
    let mut builder = if threads.get() == 1 {
        Builder::new_current_thread()
    } else {
        let mut b = Builder::new_multi_thread();
        b.worker_threads(threads.get());
        b
    };
    builder.enable_all().build().map_err(|source| RuntimeError {
        threads: threads.get(),
        source,
    })
}

/// The scheduler a runtime runs, as the startup log names it.
pub fn scheduler(handle: &Handle) -> &'static str {
    match handle.runtime_flavor() {
        RuntimeFlavor::CurrentThread => "single-threaded",
        _ => "multi-threaded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requested_count_wins_over_the_cpus() {
        let three = NonZeroUsize::new(3).unwrap();
        assert_eq!(worker_threads(Some(three)), three);
    }

    #[test]
    fn without_a_request_one_thread_per_available_cpu() {
        let cpus = std::thread::available_parallelism().unwrap();
        assert_eq!(worker_threads(None), cpus);
    }

    /// Spawned tasks and timers run on either scheduler.
    fn runs_tasks_and_timers(threads: usize) {
        let rt = build(NonZeroUsize::new(threads).unwrap()).unwrap();
        let got = rt.block_on(async {
            let task = tokio::spawn(async {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                7
            });
            task.await.unwrap()
        });
        assert_eq!(got, 7);
    }

    #[test]
    fn one_thread_is_the_single_threaded_scheduler() {
        let rt = build(NonZeroUsize::MIN).unwrap();
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        assert_eq!(scheduler(rt.handle()), "single-threaded");
        runs_tasks_and_timers(1);
    }

    #[test]
    fn several_threads_are_the_multi_threaded_scheduler() {
        let rt = build(NonZeroUsize::new(2).unwrap()).unwrap();
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(scheduler(rt.handle()), "multi-threaded");
        assert_eq!(rt.handle().metrics().num_workers(), 2);
        runs_tasks_and_timers(2);
    }
}
