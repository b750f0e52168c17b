//! The telemetry options: the Prometheus endpoint's address, the log filter and
//! format, and the trace exporter (OpenTelemetry's standard `OTEL_*` variables).
//!
//! [`TelemetryConfig::trace_settings`] builds what the exporter takes; installing
//! the log subscriber and exporting are `crate::telemetry`'s and `crate::otel`'s
//! jobs, not this file's.

use super::parse::MetricsListen;
use crate::otel::{SamplerKind, TraceSettings};
use clap::{Args, ValueEnum};

/// Logs, metrics and traces.
#[derive(Debug, Clone, Args)]
pub struct TelemetryConfig {
    /// Address of the Prometheus endpoint (GET /metrics, plain HTTP); empty or "off"
    /// turns it off.
    #[arg(
        long,
        env = "AUTHD_METRICS_LISTEN",
        default_value = "0.0.0.0:9090",
        global = true,
        display_order = 69
    )]
    pub metrics_listen: MetricsListen,

    /// Log filter, in tracing's EnvFilter syntax (e.g. info, authd=debug).
    #[arg(long, env = "AUTHD_LOG", default_value = "info",
          value_parser = log_filter, global = true, display_order = 70)]
    pub log: String,

    /// Log format.
    #[arg(
        long,
        env = "AUTHD_LOG_FORMAT",
        default_value = "text",
        value_enum,
        global = true,
        display_order = 71
    )]
    pub log_format: LogFormat,

    /// Refusals (RESOURCE_EXHAUSTED) logged one by one each second; past it they
    /// are counted, and one line a second says how many were left out, by method. 0
    /// logs only those lines. Every other request is logged; metrics count them all.
    #[arg(long, env = "AUTHD_LOG_REFUSALS", default_value = "100",
          value_parser = clap::value_parser!(u32).range(0..=1_000_000), global = true,
          display_order = 72)]
    pub log_refusals: u32,

    /// Where to send traces: an OpenTelemetry collector's OTLP/gRPC address (e.g.
    /// http://otel-collector:4317). Unset: no traces. The standard OpenTelemetry
    /// variable, so collectors and operators find it where they expect.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_parser = otlp_endpoint, global = true,
          display_order = 73)]
    pub otlp_endpoint: Option<String>,

    /// The service.name of the traces.
    #[arg(
        long,
        env = "OTEL_SERVICE_NAME",
        default_value = "authd",
        global = true,
        display_order = 74
    )]
    pub otel_service_name: String,

    /// Which traces are recorded; the parentbased_ samplers follow the caller's
    /// traceparent, and decide by themselves only for traces that start here.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        default_value = "parentbased_always_on",
        value_enum,
        global = true,
        display_order = 75
    )]
    pub otel_traces_sampler: SamplerKind,

    /// The fraction of traces the traceidratio samplers record, 0 to 1.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG", default_value = "1.0",
          value_parser = sampler_ratio, global = true, display_order = 76)]
    pub otel_traces_sampler_arg: f64,

    /// Ended spans waiting for export at most; beyond, spans are dropped and counted
    /// (authd_trace_spans_dropped_total), never waited for.
    #[arg(long, env = "AUTHD_TRACE_QUEUE", default_value = "2048",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 77)]
    pub trace_queue: u32,
}

impl TelemetryConfig {
    /// What tracing needs of the configuration.
    pub fn trace_settings(&self) -> TraceSettings {
        TraceSettings {
            endpoint: self.otlp_endpoint.clone(),
            service_name: self.otel_service_name.clone(),
            sampler: self.otel_traces_sampler,
            sampler_arg: self.otel_traces_sampler_arg,
            queue: self.trace_queue as usize,
        }
    }
}

/// An OTLP/gRPC endpoint: an `http://` URL (TLS to the collector is not built in:
/// send to a collector on the same host or pod, which forwards over TLS).
fn otlp_endpoint(value: &str) -> Result<String, String> {
    let uri: http::Uri = value
        .parse()
        .map_err(|_| "not a URL (e.g. http://otel-collector:4317)".to_owned())?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(_)) => Ok(value.to_owned()),
        (Some("https"), _) => {
            Err("https is not supported: use an http:// collector address".into())
        }
        _ => Err("expected http://HOST:PORT (e.g. http://otel-collector:4317)".into()),
    }
}

/// A ratio from 0 to 1.
fn sampler_ratio(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("expected a number from 0 to 1".into()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("not a valid log filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Config};
    use clap::{CommandFactory, Parser};

    #[test]
    fn traces_are_off_by_default_and_take_the_standard_variables() {
        let c = Config::defaults();
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.otel_service_name, "authd");
        assert_eq!(
            c.telemetry.otel_traces_sampler,
            SamplerKind::ParentBasedAlwaysOn
        );
        let cli = Cli::try_parse_from([
            "authd",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--otel-traces-sampler",
            "parentbased_traceidratio",
            "--otel-traces-sampler-arg",
            "0.25",
        ])
        .unwrap();
        let settings = cli.config.telemetry.trace_settings();
        assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(settings.sampler, SamplerKind::ParentBasedTraceIdRatio);
        assert_eq!(settings.sampler_arg, 0.25);
        for (flag, bad) in [
            ("--otlp-endpoint", "127.0.0.1:4317"),
            ("--otlp-endpoint", "https://collector:4317"),
            ("--otlp-endpoint", "not a url"),
            ("--otel-traces-sampler-arg", "1.5"),
            ("--otel-traces-sampler-arg", "-0.1"),
            ("--otel-traces-sampler", "sometimes"),
        ] {
            assert!(
                Cli::try_parse_from(["authd", flag, bad]).is_err(),
                "{flag} {bad}"
            );
        }
    }

    #[test]
    fn an_empty_metrics_address_turns_the_endpoint_off() {
        assert_eq!("".parse::<MetricsListen>().unwrap(), MetricsListen::OFF);
        assert_eq!("off".parse::<MetricsListen>().unwrap(), MetricsListen::OFF);
        assert_eq!(
            "127.0.0.1:0".parse::<MetricsListen>().unwrap().addr(),
            Some("127.0.0.1:0".parse().unwrap())
        );
        assert!("nowhere".parse::<MetricsListen>().is_err());
        let matches = Cli::command()
            .mut_args(|a| a.env(None::<&str>))
            .try_get_matches_from(["authd", "--metrics-listen", ""])
            .unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(cli.config.telemetry.metrics_listen, MetricsListen::OFF);
    }
}
