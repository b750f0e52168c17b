//! The report's unit tests: recording, percentiles, rates and the two renderings.

use super::*;

fn histogram_of_millis(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for ms in values {
        h.record(ms * 1000).unwrap();
    }
    h
}

fn close(actual: f64, expected: f64) -> bool {
    // HdrHistogram at 3 significant digits: within 0.1 %.
    (actual - expected).abs() <= expected * 0.001 + 1e-9
}

#[test]
fn percentiles_of_a_uniform_distribution() {
    let h = histogram_of_millis(1..=1000);
    for (q, expected) in [
        (0.5, 500.0),
        (0.9, 900.0),
        (0.99, 990.0),
        (0.999, 999.0),
        (1.0, 1000.0),
    ] {
        let got = percentile_ms(&h, q).unwrap();
        assert!(close(got, expected), "p{q}: {got} vs {expected}");
    }
    let l = latency_summary(&h).unwrap();
    assert!(close(l.avg, 500.5), "{l:?}");
    assert!(close(l.min, 1.0) && close(l.max, 1000.0), "{l:?}");
    assert!(close(l.p99, 990.0) && close(l.p999, 999.0), "{l:?}");
}

#[test]
fn percentiles_see_a_rare_tail() {
    // 990 fast requests and 10 very slow ones: p99 is still fast, p99.9 is not.
    let h = histogram_of_millis(std::iter::repeat_n(2, 990).chain(std::iter::repeat_n(5000, 10)));
    assert!(close(percentile_ms(&h, 0.5).unwrap(), 2.0));
    assert!(close(percentile_ms(&h, 0.99).unwrap(), 2.0));
    assert!(close(percentile_ms(&h, 0.999).unwrap(), 5000.0));
    assert!(close(latency_summary(&h).unwrap().max, 5000.0));
}

#[test]
fn an_empty_histogram_has_no_percentiles() {
    let h = histogram_of_millis([]);
    assert_eq!(percentile_ms(&h, 0.5), None);
    assert_eq!(latency_summary(&h), None);
}

#[test]
fn throughput_is_measured_between_answers() {
    // 1001 answers evenly spaced over 10 s: 100 per second exactly.
    let qps = throughput(1001, Duration::from_secs(10), Duration::from_secs(11));
    assert!((qps - 100.0).abs() < 1e-9, "{qps}");
    // One answer: fall back to first send to last answer.
    assert_eq!(
        throughput(1, Duration::ZERO, Duration::from_millis(500)),
        2.0
    );
    // Nothing measured.
    assert_eq!(throughput(0, Duration::ZERO, Duration::ZERO), 0.0);
    // Several answers at the same instant.
    assert_eq!(throughput(4, Duration::ZERO, Duration::from_secs(2)), 2.0);
}

#[test]
fn ratios_and_shares() {
    assert_eq!(ratio(0, 0), 0.0);
    assert_eq!(ratio(1, 4), 0.25);
    assert_eq!(percent(Some(0.975)), "97.50 %");
    assert_eq!(percent(None), "n/a");
}

#[test]
fn code_names_follow_the_grpc_spec() {
    assert_eq!(code_name(Code::Ok), "OK");
    assert_eq!(code_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
    assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
    assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
    for i in 0..CODES as i32 {
        assert_eq!(code_index(Code::from_i32(i)), i as usize);
    }
}

fn info(mix: &Mix) -> RunInfo {
    RunInfo {
        scenario: Scenario::Mixed,
        mix: mix.clone(),
        target: "http://127.0.0.1:1".into(),
        protocol: Protocol::Grpc,
        load: LoadInfo::Closed { concurrency: 2 },
        connections: 1,
        warmup: Duration::ZERO,
        warmup_requests: 0,
        forwarded_for: None,
    }
}

#[test]
fn every_recorded_request_is_counted_once() {
    let mix: Mix = "login=1,register=1".parse().unwrap();
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut a = Recorder::new(&mix, Duration::from_secs(60));
    let mut b = Recorder::new(&mix, Duration::from_secs(60));
    a.record(Operation::Login, Outcome::Status(Code::Ok), ms(0), ms(10));
    a.record(
        Operation::Login,
        Outcome::Status(Code::ResourceExhausted),
        ms(1),
        ms(2),
    );
    b.record(
        Operation::Register,
        Outcome::Status(Code::Ok),
        ms(5),
        ms(25),
    );
    b.record(Operation::Register, Outcome::Connection, ms(6), ms(7));
    b.note_client_error(|| "connection refused".into());
    b.record(Operation::Login, Outcome::Timeout, ms(8), ms(1008));
    a.merge(&b);
    assert_eq!(a.requests(), 5);

    let report = Report::new(&info(&mix), &a);
    assert_eq!(report.requests, 5);
    assert_eq!(report.ok, 2);
    assert_eq!(report.codes.total() + report.client_errors.total(), 5);
    assert_eq!(report.codes.get(Code::ResourceExhausted), 1);
    assert_eq!(
        report.client_errors,
        ClientErrors {
            connection: 1,
            timeout: 1
        }
    );
    assert_eq!(report.success_rate, Some(0.4));
    assert_eq!(report.share(Code::ResourceExhausted), 0.2);
    assert_eq!(
        report.first_client_error.as_deref(),
        Some("connection refused")
    );
    // Sent from 0 ms to the last answer at 1008 ms; answers from 2 ms to 1008 ms.
    assert!((report.elapsed_s - 1.008).abs() < 1e-9);
    assert!((report.qps - 4.0 / 1.006).abs() < 1e-9, "{}", report.qps);
    // Successes answered at 10 ms and 25 ms: one gap of 15 ms.
    assert!(
        (report.ok_qps - 1.0 / 0.015).abs() < 1e-9,
        "{}",
        report.ok_qps
    );
    let ok = report.ok_latency_ms.unwrap();
    assert!(close(ok.min, 10.0) && close(ok.max, 20.0), "{ok:?}");
    assert!(close(report.latency_ms.unwrap().max, 1000.0));
    assert_eq!(report.operations.len(), 2);
    let (op, login) = &report.operations[1];
    assert_eq!(*op, Operation::Login);
    assert_eq!(login.requests, 3);

    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["codes"]["RESOURCE_EXHAUSTED"], 1);
    assert_eq!(json["codes"]["OK"], 2);
    assert_eq!(json["client_errors"]["timeout"], 1);
    assert_eq!(json["operations"]["login"]["requests"], 3);
    assert_eq!(json["load"]["mode"], "closed");
    let text = report.to_text();
    assert!(text.contains("RESOURCE_EXHAUSTED"), "{text}");
    assert!(text.contains("client: timeout"), "{text}");
    // A closed loop sends when an answer comes: it has no due times to be late for.
    assert_eq!(report.send_late_ms, None);
    assert!(json.get("send_late_ms").is_none(), "{json}");
    assert!(!text.contains("sent late"), "{text}");
    // Without --forwarded-for, neither says anything of it.
    assert!(json.get("forwarded_for").is_none(), "{json}");
    assert!(!text.contains("forwarded"), "{text}");
}

#[test]
fn the_forwarded_addresses_are_reported() {
    let mix: Mix = "register=1".parse().unwrap();
    let mut info = info(&mix);
    info.forwarded_for = Some(1000);
    let report = Report::new(&info, &Recorder::new(&mix, Duration::from_secs(60)));
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["forwarded_for"], 1000);
    let text = report.to_text();
    assert!(
        text.contains("forwarded:   x-forwarded-for from 1000 end user addresses (198.18.0.0/15)"),
        "{text}"
    );
}

#[test]
fn an_open_loops_lateness_is_reported_and_merged() {
    let mix: Mix = "validate=1".parse().unwrap();
    let mut merged = Recorder::new(&mix, Duration::from_secs(60));
    let t0 = Instant::now();
    merged.record(
        Operation::Validate,
        Outcome::Status(Code::Ok),
        t0,
        t0 + Duration::from_millis(1),
    );
    // Lateness in microseconds: 98 sends on time (the floor, 1 µs), one 2 ms late,
    // one 9 ms late.
    let mut late = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
    late.record_n(1, 98).unwrap();
    late.record(2_000).unwrap();
    late.record(9_000).unwrap();
    let mut shard = Recorder::new(&mix, Duration::from_secs(60));
    shard.note_send_lateness(late);
    merged.merge(&shard);
    let mut info = info(&mix);
    info.load = LoadInfo::Open { rate: 100.0 };

    let report = Report::new(&info, &merged);
    let send_late = report.send_late_ms.expect("an open loop's lateness");
    assert!(close(send_late.p50, 0.001), "{send_late:?}");
    assert!(close(send_late.p99, 2.0), "{send_late:?}");
    assert!(close(send_late.max, 9.0), "{send_late:?}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert!(
        close(json["send_late_ms"]["max"].as_f64().unwrap(), 9.0),
        "{json}"
    );
    let text = report.to_text();
    let row = text
        .lines()
        .find(|l| l.starts_with("sent late"))
        .expect(&text);
    assert!(row.contains(" 2.00 ") && row.contains(" 9.0"), "{row}");
}
