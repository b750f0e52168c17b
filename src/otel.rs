//! Traces: OpenTelemetry spans of every request, exported over OTLP/gRPC.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Each [`Application`] owns its
//! [`Traces`] (a tracer provider of its own, never the process-wide one), so that
//! several applications in one process, as in the tests, each export their own.
//!
//! How a span finds its parent: the trace layer starts the server span (continuing
//! the caller's W3C `traceparent`) and runs the rest of the request inside an
//! OpenTelemetry [`Context`] that holds that span and the application's tracer.
//! Every child ([`child`]) is started from `Context::current()`; with tracing off
//! the context holds no tracer and a child is nothing at all (no allocation, no
//! clock read). Work that leaves the request's task (the hashing threads) carries
//! the context with it ([`Context::current`] taken when the job is queued) and
//! records its spans with explicit start and end times.
//!
//! The exporter never slows a request: an ended span is handed to a bounded queue
//! with `try_send`; when the queue is full (the collector is slow or down) the span
//! is dropped and counted (`authd_trace_spans_dropped_total`), as are the spans of
//! an export that failed. One task drains the queue in batches.
//!
//! Nor does a collector that is down: building spans only to drop them would still
//! cost every request. When an export fails or the queue is full, the export is
//! paused ([`Gate`]): new requests are not traced at all (as with tracing off, one
//! atomic load), and are counted. A full queue pauses tracing until the export in
//! progress succeeds. A failed export pauses it for a back-off (1 s, doubling to
//! 10 s), after which tracing resumes as a probe: the next export tells whether the
//! collector is back; a success resets the back-off. (If the export task itself
//! died, the queue would stay full and tracing paused: requests are never slowed.)
//!
//! Nothing secret goes into a span: RPC names, status codes, backends, operation
//! names and rule names only, never a username, password or token.
//!
//! [`Application`]: crate::app::Application

use crate::metrics::Metrics;
use opentelemetry::{
    Context, KeyValue,
    propagation::{Extractor, TextMapPropagator as _},
    trace::{Span as _, SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    propagation::TraceContextPropagator,
    trace::{Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor},
};
use prometheus::{IntCounter, IntGauge};
use std::{
    borrow::Cow,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};
use tokio::sync::mpsc;

/// Most spans sent to the collector in one export call.
const MAX_BATCH: usize = 512;
/// How long one export may take before its spans are given up (and counted dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause after a failed export; each failed probe doubles it.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause: how long a collector that is back may wait to be noticed.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, the specification's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerKind {
    /// Every trace.
    #[value(name = "always_on")]
    AlwaysOn,
    /// None.
    #[value(name = "always_off")]
    AlwaysOff,
    /// A fraction of the traces (OTEL_TRACES_SAMPLER_ARG), by trace id.
    #[value(name = "traceidratio")]
    TraceIdRatio,
    /// As the caller's traceparent says; every trace that starts here.
    #[value(name = "parentbased_always_on")]
    ParentBasedAlwaysOn,
    /// As the caller's traceparent says; none that start here.
    #[value(name = "parentbased_always_off")]
    ParentBasedAlwaysOff,
    /// As the caller's traceparent says; a fraction of those that start here.
    #[value(name = "parentbased_traceidratio")]
    ParentBasedTraceIdRatio,
}

/// Everything tracing needs from the configuration.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    /// The collector's OTLP/gRPC address (`http://host:4317`); `None`: no traces.
    pub endpoint: Option<String>,
    pub service_name: String,
    pub sampler: SamplerKind,
    /// The ratio of the `traceidratio` samplers, 0 to 1.
    pub sampler_arg: f64,
    /// Ended spans waiting for export, at most.
    pub queue: usize,
}

impl TraceSettings {
    fn sampler(&self) -> Sampler {
        let ratio = || Sampler::TraceIdRatioBased(self.sampler_arg);
        match self.sampler {
            SamplerKind::AlwaysOn => Sampler::AlwaysOn,
            SamplerKind::AlwaysOff => Sampler::AlwaysOff,
            SamplerKind::TraceIdRatio => ratio(),
            SamplerKind::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerKind::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            SamplerKind::ParentBasedTraceIdRatio => Sampler::ParentBased(Box::new(ratio())),
        }
    }
}

/// The tracing pipeline of one application.
///
/// When the last handle on the provider goes (the application and its spans), the
/// queue closes and the export task sends what is left, then stops.
pub(crate) struct Traces {
    _provider: SdkTracerProvider,
    tracer: SdkTracer,
    gate: Arc<Gate>,
    untraced: IntCounter,
}

/// Whether new requests are traced: closed (paused) while the collector cannot take
/// spans. Shared by the request path (reads), the span processor (pauses when the
/// queue is full) and the export task (pauses on failure, resumes).
/// `authd_trace_export_paused` is read from the flag at each scrape.
#[derive(Debug, Default)]
struct Gate {
    paused: AtomicBool,
}

impl Gate {
    /// A new, open gate, shown by `gauge`.
    fn new(gauge: IntGauge, metrics: &Metrics) -> Arc<Self> {
        let gate = Arc::new(Self::default());
        let shown = Arc::downgrade(&gate);
        metrics.on_scrape(move || {
            gauge.set(shown.upgrade().map_or(0, |g| i64::from(!g.is_open())));
        });
        gate
    }

    fn is_open(&self) -> bool {
        !self.paused.load(Ordering::Relaxed)
    }

    fn pause(&self) {
        // Read first: while paused, spans still ending must not all write the line.
        if self.is_open() {
            self.paused.store(true, Ordering::Relaxed);
        }
    }

    fn resume(&self) {
        if !self.is_open() {
            self.paused.store(false, Ordering::Relaxed);
        }
    }
}

/// What a request's [`Context`] holds besides its span: the tracer its children use.
#[derive(Clone)]
struct AppTracer(SdkTracer);

impl Traces {
    /// The pipeline `settings` describe, or `None` when no endpoint is set. Must be
    /// called inside the Tokio runtime (the export task runs there). Connecting is
    /// lazy: a collector that is down at start costs nothing but dropped spans.
    pub(crate) fn start(
        settings: &TraceSettings,
        metrics: &Metrics,
    ) -> anyhow::Result<Option<Self>> {
        let Some(endpoint) = &settings.endpoint else {
            return Ok(None);
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}"))?;
        // OTEL_RESOURCE_ATTRIBUTES is read here; the service name is ours to set.
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        let (sender, receiver) = mpsc::channel(settings.queue.max(1));
        let gate = Gate::new(metrics.traces.paused.clone(), metrics);
        let processor = Queue {
            sender,
            dropped: metrics.traces.dropped.clone(),
            gate: gate.clone(),
        };
        tokio::spawn(
            Export {
                exporter,
                queue: receiver,
                gate: gate.clone(),
                exported: metrics.traces.exported.clone(),
                dropped: metrics.traces.dropped.clone(),
            }
            .run(),
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(settings.sampler())
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("authd");
        Ok(Some(Self {
            _provider: provider,
            tracer,
            gate,
            untraced: metrics.traces.untraced.clone(),
        }))
    }

    /// Starts the server span of a request: a child of the caller's `traceparent`
    /// when the headers carry a valid one. The context returned holds the span and
    /// the tracer; run the request inside it. `None` while the export is paused: the
    /// request is then handled as with tracing off.
    pub(crate) fn server_span(
        &self,
        headers: &http::HeaderMap,
        service: &'static str,
        method: &'static str,
    ) -> Option<Context> {
        if !self.gate.is_open() {
            self.untraced.inc();
            return None;
        }
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let span = self
            .tracer
            .span_builder(format!("{service}/{method}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service),
                KeyValue::new("rpc.method", method),
            ])
            .start_with_context(&self.tracer, &parent);
        Some(
            parent
                .with_span(span)
                .with_value(AppTracer(self.tracer.clone())),
        )
    }
}

/// Ends the server span in `cx` with the request's gRPC status code.
pub(crate) fn end_server_span(cx: &Context, code: usize, code_name: &'static str) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
    // The semantic conventions: for a server, only codes that say the server failed
    // are errors (a refused password is the service working).
    if matches!(
        code_name,
        "UNKNOWN"
            | "DEADLINE_EXCEEDED"
            | "UNIMPLEMENTED"
            | "INTERNAL"
            | "UNAVAILABLE"
            | "DATA_LOSS"
    ) {
        span.set_status(opentelemetry::trace::Status::error(code_name));
    }
    span.end();
}

/// The trace id of a caller's valid `traceparent`, for the log line of a request
/// that is not traced here (tracing off).
pub(crate) fn caller_trace_id(headers: &http::HeaderMap) -> Option<String> {
    headers.get("traceparent")?;
    trace_id(&TraceContextPropagator::new().extract(&Headers(headers)))
}

/// The trace id of `cx`'s span, when it is recorded (for log lines): a trace the
/// sampler left out has an id no collector will ever hold.
pub(crate) fn trace_id(cx: &Context) -> Option<String> {
    let span = cx.span();
    let context = span.span_context();
    (context.is_valid() && context.is_sampled()).then(|| context.trace_id().to_string())
}

/// The trace id of the request being handled (for log lines and audit events).
pub(crate) fn current_trace_id() -> Option<String> {
    trace_id(&Context::current())
}

/// A child span of the current request, ended when dropped; nothing when tracing
/// is off or no request is being traced.
pub(crate) struct Child(Option<opentelemetry_sdk::trace::Span>);

impl Child {
    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed (its status), with a short, secret-free description.
    pub(crate) fn fail(&mut self, why: &'static str) {
        if let Some(span) = &mut self.0 {
            span.set_status(opentelemetry::trace::Status::error(why));
        }
    }
}

/// Starts a child of the current request's span called `name`.
pub(crate) fn child(name: &'static str) -> Child {
    child_of(&Context::current(), name, None)
}

/// Starts a child of `cx`'s span, at `start` if given.
fn child_of(cx: &Context, name: &'static str, start: Option<SystemTime>) -> Child {
    let Some(AppTracer(tracer)) = cx.get::<AppTracer>() else {
        return Child(None);
    };
    let mut builder = tracer.span_builder(Cow::Borrowed(name));
    builder.start_time = start;
    Child(Some(builder.start_with_context(tracer, cx)))
}

/// The context of a request whose work goes to another thread, captured where the
/// work is queued: `None` (and free) when the request is not traced.
#[derive(Clone)]
pub(crate) struct Carried(Option<Context>);

impl Carried {
    pub(crate) fn current() -> Self {
        let cx = Context::current();
        Self(cx.get::<AppTracer>().is_some().then_some(cx))
    }

    /// Records a finished span `name` from `start` to `end`, measured elsewhere.
    pub(crate) fn record(&self, name: &'static str, start: Instant, end: Instant) {
        let Some(cx) = &self.0 else {
            return;
        };
        // Spans carry wall-clock times; the pool measures with the monotonic clock.
        // Real time: spans carry the machine's time, as other services' do.
        let now = (Instant::now(), SystemTime::now());
        let wall = |at: Instant| now.1 - now.0.saturating_duration_since(at);
        if let Some(mut span) = child_of(cx, name, Some(wall(start))).0 {
            span.end_with_timestamp(wall(end));
        }
    }
}

/// The W3C headers of a request, for the propagator.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span processor: hands ended spans to the export task, never waiting.
#[derive(Debug)]
struct Queue {
    sender: mpsc::Sender<SpanData>,
    dropped: IntCounter,
    gate: Arc<Gate>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.sender.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                // The collector cannot keep up: stop tracing until the export in
                // progress succeeds (or fails, and its back-off ends).
                self.dropped.inc();
                self.gate.pause();
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped.inc(),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task: sends the queued spans in batches, and pauses tracing while the
/// collector does not take them.
struct Export<E> {
    exporter: E,
    queue: mpsc::Receiver<SpanData>,
    gate: Arc<Gate>,
    exported: IntCounter,
    dropped: IntCounter,
}

impl<E: opentelemetry_sdk::trace::SpanExporter> Export<E> {
    /// Runs until the queue is closed and empty.
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut pause = FIRST_PAUSE;
        while self.queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
            let n = batch.len() as u64;
            let sent = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
            let failure =
                match tokio::time::timeout(EXPORT_TIMEOUT, self.exporter.export(sent)).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("timed out".to_owned()),
                };
            let Some(failure) = failure else {
                self.exported.inc_by(n);
                self.gate.resume();
                pause = FIRST_PAUSE;
                continue;
            };
            self.gate.pause();
            // What is queued was made before the pause: given up, so that the probe
            // after the pause is made of fresh spans.
            let mut given_up = n;
            while self.queue.try_recv().is_ok() {
                given_up += 1;
            }
            self.dropped.inc_by(given_up);
            tracing::debug!(
                error = %failure,
                spans = given_up,
                pause_ms = pause.as_millis() as u64,
                "exporting spans failed; tracing paused"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            // A probe: the next requests are traced, and their export says whether
            // the collector is back.
            self.gate.resume();
        }
    }
}
