//! The export queue: finished spans wait in a bounded queue and go out in
//! batches from one task. A full queue drops the span (counted) instead of
//! making a decision wait; a failed or timed-out export drops its batch
//! (counted). The SDK's own batch processor drops too, but counts nowhere
//! a metric can read.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus::{IntCounter, IntCounterVec};
use tokio::sync::{mpsc, oneshot};

/// Why spans were dropped (`divvy_trace_spans_dropped_total{reason}`).
pub const DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// What the export task is handed.
enum Item {
    Span(Box<SpanData>),
    /// Export what is queued now, then answer.
    Flush(oneshot::Sender<()>),
}

/// A span processor over a bounded queue (see the module's comment); a
/// clone feeds the same queue.
#[derive(Debug, Clone)]
pub struct DroppingBatch {
    tx: mpsc::Sender<Item>,
    dropped: IntCounterVec,
}

/// Where the queue counts what became of its spans.
#[derive(Debug, Clone)]
pub struct SpanCounters {
    /// Dropped, by reason ([`DROP_REASONS`]).
    pub dropped: IntCounterVec,
    /// Accepted by the collector.
    pub exported: IntCounter,
}

/// The queue's bounds and timings.
#[derive(Debug, Clone, Copy)]
pub struct QueueBounds {
    /// Most spans waiting.
    pub max_queue: usize,
    /// Most spans per export.
    pub max_batch: usize,
    /// Longest wait before a partial batch goes.
    pub delay: Duration,
    /// Longest wait for one export.
    pub export_timeout: Duration,
}

impl DroppingBatch {
    /// The processor, its export task spawned on the current runtime;
    /// what becomes of the spans is counted in `counters`. The task ends
    /// when every clone of the processor is dropped.
    pub fn spawn<E: SpanExporter + 'static>(
        exporter: E,
        bounds: QueueBounds,
        counters: SpanCounters,
    ) -> DroppingBatch {
        let (tx, rx) = mpsc::channel(bounds.max_queue.max(1));
        let dropped = counters.dropped.clone();
        tokio::spawn(run(exporter, rx, bounds, counters));
        DroppingBatch { tx, dropped }
    }

    /// Exports what is queued now; waits at most `within`.
    pub async fn flush(&self, within: Duration) {
        let (done, answer) = oneshot::channel();
        // Both the wait for room in a full queue and the export itself
        // count against `within` (a dead collector must not hold shutdown).
        let _ = tokio::time::timeout(within, async {
            if self.tx.send(Item::Flush(done)).await.is_ok() {
                let _ = answer.await;
            }
        })
        .await;
    }
}

impl SpanProcessor for DroppingBatch {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(Item::Span(Box::new(span))).is_err() {
            self.dropped.with_label_values(&["queue_full"]).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // Synchronous callers (the SDK at shutdown) cannot wait on the
        // runtime; the service flushes through `DroppingBatch::flush`.
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Gathers spans into batches of `max_batch` (or what came within
/// `delay`) and exports them one batch at a time.
async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<Item>,
    bounds: QueueBounds,
    counters: SpanCounters,
) {
    let mut batch = Vec::with_capacity(bounds.max_batch);
    loop {
        let tick = tokio::time::sleep(bounds.delay);
        tokio::pin!(tick);
        let mut flushed = None;
        let open = loop {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(Item::Span(span)) => {
                        batch.push(*span);
                        if batch.len() >= bounds.max_batch {
                            break true;
                        }
                    }
                    Some(Item::Flush(done)) => {
                        flushed = Some(done);
                        break true;
                    }
                    None => break false,
                },
                () = &mut tick => break true,
            }
        };
        if !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(bounds.max_batch));
            export(&exporter, spans, bounds.export_timeout, &counters).await;
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
        if !open {
            return;
        }
    }
}

/// One export; a failure or timeout drops the batch, counted.
async fn export<E: SpanExporter>(
    exporter: &E,
    spans: Vec<SpanData>,
    timeout: Duration,
    counters: &SpanCounters,
) {
    let n = spans.len() as u64;
    let failed = match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {
            counters.exported.inc_by(n);
            None
        }
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {timeout:?}")),
    };
    if let Some(why) = failed {
        counters
            .dropped
            .with_label_values(&["export_failed"])
            .inc_by(n);
        tracing::debug!(spans = n, error = %why, "trace export failed; spans dropped");
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use prometheus::Opts;

    use super::*;

    /// A collector that refuses every export.
    #[derive(Debug)]
    struct Refuses;

    impl SpanExporter for Refuses {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Err(OTelSdkError::InternalFailure("refused".into()))
        }
    }

    /// A collector that never answers.
    #[derive(Debug)]
    struct Hangs;

    impl SpanExporter for Hangs {
        fn export(&self, _batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            std::future::pending()
        }
    }

    fn bounds(max_queue: usize) -> QueueBounds {
        QueueBounds {
            max_queue,
            max_batch: 512,
            delay: Duration::from_secs(5),
            export_timeout: Duration::from_secs(10),
        }
    }

    fn counters() -> SpanCounters {
        SpanCounters {
            dropped: IntCounterVec::new(Opts::new("dropped", "dropped"), &["reason"]).unwrap(),
            exported: IntCounter::new("exported", "exported").unwrap(),
        }
    }

    /// A collector that accepts every export.
    #[derive(Debug)]
    struct Accepts;

    impl SpanExporter for Accepts {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn accepted_spans_are_counted_after_the_delay() {
        let c = counters();
        let queue = DroppingBatch::spawn(Accepts, bounds(16), c.clone());
        let _provider = spans(&queue, 4);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(c.exported.get(), 4);
        assert_eq!(c.dropped.with_label_values(&["queue_full"]).get(), 0);
    }

    /// `n` finished spans through `queue`.
    fn spans(queue: &DroppingBatch, n: usize) -> SdkTracerProvider {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue.clone())
            .build();
        let tracer = provider.tracer("test");
        for _ in 0..n {
            drop(tracer.start("span"));
        }
        provider
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_at_once_and_counts() {
        let c = counters();
        let dropped = c.dropped.clone();
        let queue = DroppingBatch::spawn(Hangs, bounds(2), c);
        // The export task has not run yet: two spans fit, three do not.
        let _provider = spans(&queue, 5);
        assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 3);
        assert_eq!(dropped.with_label_values(&["export_failed"]).get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_export_drops_its_batch_and_counts() {
        let c = counters();
        let dropped = c.dropped.clone();
        let queue = DroppingBatch::spawn(Refuses, bounds(16), c);
        let _provider = spans(&queue, 3);
        queue.flush(Duration::from_secs(1)).await;
        assert_eq!(dropped.with_label_values(&["export_failed"]).get(), 3);
        assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_into_a_full_queue_of_a_dead_collector_keeps_its_bound() {
        let queue = DroppingBatch::spawn(Hangs, bounds(2), counters());
        let _provider = spans(&queue, 2);
        let start = tokio::time::Instant::now();
        // The queue is full and every export hangs until its 10 s timeout.
        queue.flush(Duration::from_secs(2)).await;
        assert!(
            start.elapsed() <= Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_export_without_answer_times_out_and_counts() {
        let c = counters();
        let dropped = c.dropped.clone();
        let queue = DroppingBatch::spawn(Hangs, bounds(16), c);
        let _provider = spans(&queue, 2);
        // Paused time runs ahead to the export timeout (10 s).
        queue.flush(Duration::from_secs(60)).await;
        assert_eq!(dropped.with_label_values(&["export_failed"]).get(), 2);
    }
}
