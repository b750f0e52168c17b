//! What a run measured: the [`Recorder`] that workers feed, the arithmetic that turns
//! it into numbers (QPS, percentiles, success rate), and the [`Report`] printed as a
//! table or as JSON.
//!
//! Latencies go into HdrHistograms (microseconds, 3 significant digits), so memory
//! stays constant however many requests a run sends and every percentile is within
//! 0.1 % of the exact value. The functions that do arithmetic are pure and unit-tested
//! (`tests`); nothing here reads a clock.

use super::{
    protocol::Protocol,
    scenario::{Mix, Operation, Scenario},
};
use hdrhistogram::Histogram;
use serde::{Serialize, Serializer, ser::SerializeMap};
use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};
use tonic::Code;

/// gRPC defines codes 0 (OK) to 16 (UNAUTHENTICATED).
const CODES: usize = 17;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered with this gRPC status (OK included).
    Status(Code),
    /// The client could not get an answer: connection refused or reset, stream reset,
    /// protocol error. No status came from the server.
    Connection,
    /// No answer at all by the deadline (plus a grace period): the client gave up.
    Timeout,
}

/// Latency of one operation, all outcomes and successes apart.
struct OpRecorder {
    all: Histogram<u64>,
    ok: Histogram<u64>,
    codes: [u64; CODES],
    connection: u64,
    timeout: u64,
}

impl OpRecorder {
    fn new(highest: Duration) -> Self {
        Self {
            all: micros_histogram(highest),
            ok: micros_histogram(highest),
            codes: [0; CODES],
            connection: 0,
            timeout: 0,
        }
    }

    /// An empty recorder with the same histogram bounds as `other`.
    fn empty_like(other: &OpRecorder) -> Self {
        Self {
            all: Histogram::new_from(&other.all),
            ok: Histogram::new_from(&other.ok),
            codes: [0; CODES],
            connection: 0,
            timeout: 0,
        }
    }

    fn merge(&mut self, other: &OpRecorder) {
        // Both histograms were built with the same bounds, so adding cannot fail.
        self.all
            .add(&other.all)
            .expect("histograms with equal bounds");
        self.ok
            .add(&other.ok)
            .expect("histograms with equal bounds");
        for (a, b) in self.codes.iter_mut().zip(other.codes) {
            *a += b;
        }
        self.connection += other.connection;
        self.timeout += other.timeout;
    }

    fn requests(&self) -> u64 {
        self.codes.iter().sum::<u64>() + self.connection + self.timeout
    }
}

/// Collects the outcome and latency of every measured request.
///
/// One recorder holds a histogram pair per operation of the mix; workers share a
/// few recorders (behind uncontended locks) rather than owning one each, because a
/// histogram is ~100 KiB and a closed loop may have thousands of workers.
pub struct Recorder {
    ops: [Option<OpRecorder>; Operation::ALL.len()],
    first_send: Option<Instant>,
    first_done: Option<Instant>,
    last_done: Option<Instant>,
    /// The first and last successful answers.
    first_ok: Option<Instant>,
    last_ok: Option<Instant>,
    first_client_error: Option<String>,
    /// An open loop's measured sends: how long after its due time each was started
    /// (none for a closed loop).
    send_late: Option<Histogram<u64>>,
}

impl Recorder {
    /// A recorder for the operations of `mix`, clamping latencies above `highest`.
    pub fn new(mix: &Mix, highest: Duration) -> Self {
        let ops = Operation::ALL.map(|op| mix.uses(op).then(|| OpRecorder::new(highest)));
        Self {
            ops,
            first_send: None,
            first_done: None,
            last_done: None,
            first_ok: None,
            last_ok: None,
            first_client_error: None,
            send_late: None,
        }
    }

    /// Records a request of `op`, sent (or meant to be sent) at `sent`, answered at `done`.
    pub fn record(&mut self, op: Operation, outcome: Outcome, sent: Instant, done: Instant) {
        let Some(stats) = self.ops[op.index()].as_mut() else {
            debug_assert!(false, "{op} is not in the mix this recorder was made for");
            return;
        };
        let micros = micros(done.saturating_duration_since(sent));
        stats.all.saturating_record(micros);
        match outcome {
            Outcome::Status(code) => {
                stats.codes[code_index(code)] += 1;
                if code == Code::Ok {
                    stats.ok.saturating_record(micros);
                    self.first_ok = Some(self.first_ok.map_or(done, |t| t.min(done)));
                    self.last_ok = Some(self.last_ok.map_or(done, |t| t.max(done)));
                }
            }
            Outcome::Connection => stats.connection += 1,
            Outcome::Timeout => stats.timeout += 1,
        }
        self.first_send = Some(self.first_send.map_or(sent, |t| t.min(sent)));
        self.first_done = Some(self.first_done.map_or(done, |t| t.min(done)));
        self.last_done = Some(self.last_done.map_or(done, |t| t.max(done)));
    }

    /// Keeps the message of the first client-side error, to show what went wrong.
    /// `message` is only called when none was kept yet.
    pub fn note_client_error(&mut self, message: impl FnOnce() -> String) {
        if self.first_client_error.is_none() {
            self.first_client_error = Some(message());
        }
    }

    /// Keeps an open loop's lateness of its measured sends (microseconds).
    pub fn note_send_lateness(&mut self, late: Histogram<u64>) {
        self.send_late = Some(late);
    }

    /// Adds everything `other` recorded (made for the same mix and bound) to this one.
    pub fn merge(&mut self, other: &Recorder) {
        for (mine, theirs) in self.ops.iter_mut().zip(&other.ops) {
            match (mine.as_mut(), theirs) {
                (Some(m), Some(t)) => m.merge(t),
                (None, Some(_)) => panic!("merging recorders made for different mixes"),
                _ => {}
            }
        }
        let earliest = |a: Option<Instant>, b: Option<Instant>| a.into_iter().chain(b).min();
        self.first_send = earliest(self.first_send, other.first_send);
        self.first_done = earliest(self.first_done, other.first_done);
        self.last_done = self.last_done.into_iter().chain(other.last_done).max();
        self.first_ok = earliest(self.first_ok, other.first_ok);
        self.last_ok = self.last_ok.into_iter().chain(other.last_ok).max();
        if self.first_client_error.is_none() {
            self.first_client_error
                .clone_from(&other.first_client_error);
        }
        match (&mut self.send_late, &other.send_late) {
            // Both made by open loops of the same bound, so adding cannot fail.
            (Some(mine), Some(theirs)) => mine.add(theirs).expect("histograms with equal bounds"),
            (None, Some(theirs)) => self.send_late = Some(theirs.clone()),
            _ => {}
        }
    }

    /// Requests recorded so far, whatever their outcome.
    pub fn requests(&self) -> u64 {
        self.ops.iter().flatten().map(OpRecorder::requests).sum()
    }
}

/// Everything about a run that is not a measurement, for the report's header.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub scenario: Scenario,
    pub mix: Mix,
    pub target: String,
    pub protocol: Protocol,
    pub load: LoadInfo,
    pub connections: usize,
    pub warmup: Duration,
    pub warmup_requests: u64,
    /// `--forwarded-for N`: the end users' addresses passed in `x-forwarded-for`.
    pub forwarded_for: Option<usize>,
}

/// The load shape, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum LoadInfo {
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
    /// Sends at a fixed `rate` per second, whatever the answers.
    Open { rate: f64 },
}

/// Latency statistics in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    pub avg: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Counts of each status code seen, serialized as `{"OK": n, "RESOURCE_EXHAUSTED": m}`
/// in code order, leaving out codes never seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodeCounts([u64; CODES]);

impl CodeCounts {
    pub fn get(&self, code: Code) -> u64 {
        self.0[code_index(code)]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(code, count)` of every code seen, in code order.
    pub fn seen(&self) -> impl Iterator<Item = (Code, u64)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (Code::from_i32(i as i32), *n))
    }
}

impl Serialize for CodeCounts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (code, n) in self.seen() {
            map.serialize_entry(code_name(code), &n)?;
        }
        map.end()
    }
}

/// Requests that got no status from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ClientErrors {
    /// Connection refused or reset, stream reset, protocol errors.
    pub connection: u64,
    /// No answer by the deadline plus a grace period.
    pub timeout: u64,
}

impl ClientErrors {
    pub fn total(&self) -> u64 {
        self.connection + self.timeout
    }
}

/// The measurements of one operation of the mix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationReport {
    pub requests: u64,
    pub ok: u64,
    pub success_rate: Option<f64>,
    pub latency_ms: Option<Latency>,
    pub ok_latency_ms: Option<Latency>,
    pub codes: CodeCounts,
    pub client_errors: ClientErrors,
}

/// The result of a run: what `authbench` prints.
///
/// Only requests sent after the warm-up are in it, and each of them is in it exactly
/// once: `requests` = the sum of `codes` + `client_errors`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub scenario: Scenario,
    /// The weights, for the mixed scenario.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<String>,
    pub target: String,
    /// `"http"` for a run over HTTP/1.1, whose answers are counted as the gRPC codes
    /// their statuses stand for; absent for gRPC.
    #[serde(skip_serializing_if = "Protocol::is_grpc")]
    pub protocol: Protocol,
    pub load: LoadInfo,
    pub connections: usize,
    /// `--forwarded-for N`: every request passed one of N end users' addresses
    /// (198.18.0.0/15) in `x-forwarded-for`; absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded_for: Option<usize>,
    pub warmup_s: f64,
    /// Requests sent during the warm-up, left out of everything below.
    pub warmup_requests: u64,
    /// From the first measured send to the last measured answer.
    pub elapsed_s: f64,
    /// Measured requests: each ended with a status code or a client error.
    pub requests: u64,
    pub ok: u64,
    /// `ok / requests`; null when nothing was measured.
    pub success_rate: Option<f64>,
    /// Answers (of any status) per second; see [`throughput`].
    pub qps: f64,
    /// Successful answers per second, over the span of the successful answers (see
    /// [`throughput`]).
    pub ok_qps: f64,
    /// Latency of every measured request, whatever its outcome.
    pub latency_ms: Option<Latency>,
    /// Latency of the successful requests only.
    pub ok_latency_ms: Option<Latency>,
    pub codes: CodeCounts,
    pub client_errors: ClientErrors,
    /// The first client-side error's message, to tell what went wrong.
    pub first_client_error: Option<String>,
    /// Open loop only: how long after its due time the client started each measured
    /// request. It is part of every latency above (they count from the due time); a
    /// high tail here is the client's, or its host's, not the server's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_late_ms: Option<Latency>,
    /// Per operation, for a mix of more than one.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "serialize_operations"
    )]
    pub operations: Vec<(Operation, OperationReport)>,
}

impl Report {
    /// Builds the report of a run from everything its workers recorded.
    pub fn new(info: &RunInfo, recorder: &Recorder) -> Self {
        let present: Vec<(Operation, &OpRecorder)> = Operation::ALL
            .iter()
            .zip(&recorder.ops)
            .filter_map(|(op, stats)| stats.as_ref().map(|s| (*op, s)))
            .collect();
        let mut total = match present.first() {
            Some((_, stats)) => OpRecorder::empty_like(stats),
            None => OpRecorder::new(Duration::from_micros(2)),
        };
        let mut operations = Vec::new();
        for (op, stats) in present {
            total.merge(stats);
            operations.push((op, operation_report(stats)));
        }
        if operations.len() < 2 {
            operations.clear();
        }
        let whole = operation_report(&total);
        let elapsed = span(recorder.first_send, recorder.last_done);
        let responses = span(recorder.first_done, recorder.last_done);
        Report {
            scenario: info.scenario,
            mix: (info.scenario == Scenario::Mixed).then(|| info.mix.to_string()),
            target: info.target.clone(),
            protocol: info.protocol,
            load: info.load,
            connections: info.connections,
            forwarded_for: info.forwarded_for,
            warmup_s: info.warmup.as_secs_f64(),
            warmup_requests: info.warmup_requests,
            elapsed_s: elapsed.as_secs_f64(),
            requests: whole.requests,
            ok: whole.ok,
            success_rate: whole.success_rate,
            qps: throughput(whole.requests, responses, elapsed),
            // Over the successes' own span: refusals a server holds back before
            // answering them (pushback) arrive after the last success, and must not
            // stretch the time the successes took.
            ok_qps: throughput(whole.ok, span(recorder.first_ok, recorder.last_ok), elapsed),
            latency_ms: whole.latency_ms,
            ok_latency_ms: whole.ok_latency_ms,
            codes: whole.codes,
            client_errors: whole.client_errors,
            first_client_error: recorder.first_client_error.clone(),
            send_late_ms: recorder.send_late.as_ref().and_then(latency_summary),
            operations,
        }
    }

    /// The share of measured requests that ended with `code` (0 when none were measured).
    pub fn share(&self, code: Code) -> f64 {
        ratio(self.codes.get(code), self.requests)
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The report as a human-readable table.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let load = match self.load {
            LoadInfo::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
            LoadInfo::Open { rate } => format!("open loop, {} req/s scheduled", trim_float(rate)),
        };
        let scenario = match &self.mix {
            Some(mix) => format!("{} ({mix})", self.scenario),
            None => self.scenario.to_string(),
        };
        let over = match self.protocol {
            Protocol::Grpc => "",
            Protocol::Http => " over HTTP/1.1",
            Protocol::Json => " over HTTP/1.1 with JSON (Connect)",
            Protocol::GrpcWeb => " over HTTP/1.1 with gRPC-Web",
        };
        let _ = writeln!(out, "authbench: {scenario} against {}{over}", self.target);
        let _ = writeln!(
            out,
            "load:        {load}, over {} connection{}",
            self.connections,
            plural(self.connections)
        );
        if let Some(n) = self.forwarded_for {
            let _ = writeln!(
                out,
                "forwarded:   x-forwarded-for from {n} end user address{} (198.18.0.0/15)",
                if n == 1 { "" } else { "es" }
            );
        }
        // Requests, or the events of the events scenario.
        let (counted, per) = self.scenario.counts();
        let _ = writeln!(
            out,
            "measured:    {} {counted} in {:.2} s (after a {} warm-up of {} {counted})",
            self.requests,
            self.elapsed_s,
            humantime::format_duration(Duration::from_secs_f64(self.warmup_s)),
            self.warmup_requests
        );
        let _ = writeln!(
            out,
            "throughput:  {:.1} {per} ({:.1} {per} successful)",
            self.qps, self.ok_qps
        );
        let _ = writeln!(out, "success:     {}", percent(self.success_rate));
        out.push('\n');

        // An event's "latency" is the wait since the event before it.
        let heading = match self.scenario {
            Scenario::Events => "wait (ms)",
            _ => "latency (ms)",
        };
        let _ = writeln!(
            out,
            "{heading:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "avg", "min", "p50", "p90", "p99", "p99.9", "max"
        );
        let mut row = |name: &str, latency: &Option<Latency>| {
            let _ = match latency {
                Some(l) => writeln!(
                    out,
                    "{name:<18} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                    l.avg, l.min, l.p50, l.p90, l.p99, l.p999, l.max
                ),
                None => writeln!(out, "{name:<18} {:>9}", "-"),
            };
        };
        row("all", &self.latency_ms);
        row("successful", &self.ok_latency_ms);
        for (op, r) in &self.operations {
            row(&format!("{op}"), &r.latency_ms);
            row(&format!("{op} successful"), &r.ok_latency_ms);
        }
        if self.send_late_ms.is_some() {
            row("sent late", &self.send_late_ms);
            let _ = writeln!(
                out,
                "(sent late: how long after its due time the client started each request; \
                 part of the latencies above)"
            );
        }
        if self.scenario == Scenario::Events {
            let _ = writeln!(
                out,
                "(wait: from the event before, or for the first from the subscription)"
            );
        }
        out.push('\n');

        let _ = writeln!(out, "{:<24} {:>10} {:>8}", "outcome", "count", "share");
        for (code, n) in self.codes.seen() {
            let _ = writeln!(
                out,
                "{:<24} {n:>10} {:>8}",
                code_name(code),
                percent(Some(ratio(n, self.requests)))
            );
        }
        for (name, n) in [
            ("client: connection", self.client_errors.connection),
            ("client: timeout", self.client_errors.timeout),
        ] {
            if n > 0 {
                let _ = writeln!(
                    out,
                    "{name:<24} {n:>10} {:>8}",
                    percent(Some(ratio(n, self.requests)))
                );
            }
        }
        if self.requests == 0 {
            let _ = writeln!(out, "(no {counted} measured)");
        }
        if let Some(e) = &self.first_client_error {
            let _ = writeln!(out, "first client error: {e}");
        }
        if matches!(self.protocol, Protocol::Http | Protocol::Json) {
            let _ = writeln!(
                out,
                "(HTTP statuses counted as the gRPC codes they stand for: 2xx OK, \
                 401 UNAUTHENTICATED, 409 ALREADY_EXISTS, 429 RESOURCE_EXHAUSTED, \
                 503 UNAVAILABLE; see authbench --help)"
            );
        }
        for (op, r) in &self.operations {
            let codes: Vec<String> = r
                .codes
                .seen()
                .map(|(c, n)| format!("{}={n}", code_name(c)))
                .chain(
                    (r.client_errors.total() > 0)
                        .then(|| format!("client_errors={}", r.client_errors.total())),
                )
                .collect();
            let _ = writeln!(out, "  {op}: {} requests: {}", r.requests, codes.join(" "));
        }
        out
    }
}

fn operation_report(stats: &OpRecorder) -> OperationReport {
    let requests = stats.requests();
    let ok = stats.codes[code_index(Code::Ok)];
    OperationReport {
        requests,
        ok,
        success_rate: (requests > 0).then(|| ratio(ok, requests)),
        latency_ms: latency_summary(&stats.all),
        ok_latency_ms: latency_summary(&stats.ok),
        codes: CodeCounts(stats.codes),
        client_errors: ClientErrors {
            connection: stats.connection,
            timeout: stats.timeout,
        },
    }
}

fn span(from: Option<Instant>, to: Option<Instant>) -> Duration {
    match (from, to) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    }
}

/// Answers per second.
///
/// The rate is taken over the answers themselves, from the first measured answer to
/// the last: `(count - 1) / response_span`, the mean gap between consecutive answers.
/// Counting from the first *send* would charge the run for its ramp (in a closed
/// loop the first answers need a full latency to arrive, and warm-up stragglers
/// still occupy the server when measurement starts); this way neither end biases the
/// rate. With fewer than two answers, or all at one instant, it falls back to
/// `count / elapsed` (first send to last answer), and to 0 when that is zero too.
pub fn throughput(count: u64, response_span: Duration, elapsed: Duration) -> f64 {
    if count >= 2 && !response_span.is_zero() {
        (count - 1) as f64 / response_span.as_secs_f64()
    } else if !elapsed.is_zero() {
        count as f64 / elapsed.as_secs_f64()
    } else {
        0.0
    }
}

/// `part / whole`, 0 when `whole` is 0.
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A histogram of microseconds from 1 µs to `highest` (at least 2 µs; values above
/// it are recorded as it), at 3 significant digits: the form of every histogram of a
/// report, so any two of a run add up.
pub fn micros_histogram(highest: Duration) -> Histogram<u64> {
    let highest = u64::try_from(highest.as_micros()).unwrap_or(u64::MAX);
    Histogram::new_with_bounds(1, highest.max(2), 3)
        .expect("1 µs to a bound of 2 µs or more at 3 digits is a valid histogram")
}

/// `duration` in whole microseconds as a histogram records it: below 1 µs, the
/// histograms' floor, it rounds up to it; beyond `u64`, it saturates.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The latency at quantile `q` (0 to 1) of a histogram of microseconds, in
/// milliseconds; `None` when it is empty. Within 0.1 % of the exact value.
pub fn percentile_ms(histogram: &Histogram<u64>, q: f64) -> Option<f64> {
    (!histogram.is_empty()).then(|| micros_to_ms(histogram.value_at_quantile(q)))
}

/// avg, min, p50, p90, p99, p99.9 and max of a histogram of microseconds, in ms.
pub fn latency_summary(histogram: &Histogram<u64>) -> Option<Latency> {
    if histogram.is_empty() {
        return None;
    }
    let q = |q| micros_to_ms(histogram.value_at_quantile(q));
    Some(Latency {
        avg: histogram.mean() / 1000.0,
        min: micros_to_ms(histogram.min()),
        p50: q(0.50),
        p90: q(0.90),
        p99: q(0.99),
        p999: q(0.999),
        max: micros_to_ms(histogram.max()),
    })
}

fn micros_to_ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn code_index(code: Code) -> usize {
    // `Code` is a fieldless enum with discriminants 0..=16.
    (code as usize).min(CODES - 1)
}

/// The canonical name of a gRPC code, as in the gRPC spec: `RESOURCE_EXHAUSTED`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn percent(rate: Option<f64>) -> String {
    match rate {
        Some(r) => format!("{:.2} %", r * 100.0),
        None => "n/a".into(),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn trim_float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// Serializes `(Operation, OperationReport)` pairs as a map keyed by operation name.
fn serialize_operations<S: Serializer>(
    operations: &[(Operation, OperationReport)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(operations.len()))?;
    for (op, r) in operations {
        map.serialize_entry(op.name(), r)?;
    }
    map.end()
}

#[cfg(test)]
mod tests;
