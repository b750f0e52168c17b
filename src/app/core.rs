//! The core every listener serves from, built from the configuration's groups in
//! the order a start can fail cheapest first: the metrics registry, TLS, traces, the
//! blocklist, then the store, the hash pool, the tokens, the login throttle and the
//! accounts; the rate limiter, admission control and pushback; the connection limits
//! and the trusted callers every port shares.

use crate::{
    accounts::Accounts,
    audit::Audit,
    blocklist::Blocklist,
    config::Config,
    events::{Events, webhooks::Webhooks},
    handlers::extauthz::Authorizer,
    layers::{
        admission::Admission,
        pushback::Pushback,
        refusal_log::RefusalLog,
        trace::{self, Trace},
    },
    metrics::Metrics,
    middleware::MiddlewareLayer,
    otel::Traces,
    ratelimit::{self, RateLimiter},
    redis::SharedRedis,
    rpc::{MAX_MESSAGE_BYTES, TrustedCallers},
    store::Store,
    throttle::Throttle,
    token::{LiveKeyRing, keyfile::KeyFile},
    transport::{self, Limits, tls::ServerTls},
};
use std::sync::Arc;

/// The gRPC framing of a message: a flag byte and a 4-byte length.
const GRPC_FRAME_HEADER: usize = 5;

/// What the listeners and background tasks of one application share.
pub(super) struct Core {
    /// One registry per application, never the process-wide default: tests run
    /// several applications in one process and count each one's requests.
    pub metrics: Arc<Metrics>,
    /// This application's traces (none without OTEL_EXPORTER_OTLP_ENDPOINT).
    pub traces: Option<Arc<Traces>>,
    /// The budget of refusal lines a second that every port's trace layer shares.
    pub refusal_log: Arc<RefusalLog>,
    pub tls: Option<Arc<ServerTls>>,
    pub blocklist: Arc<Blocklist>,
    pub accounts: Arc<Accounts>,
    pub key_ring: LiveKeyRing,
    pub key_file: Option<Arc<KeyFile>>,
    pub rate_limiter: Arc<RateLimiter>,
    /// Envoy's rate limit rules file, when one is configured.
    pub rate_limit_rules: Option<Arc<ratelimit::LiveRules>>,
    pub admission: Arc<Admission>,
    pub pushback: Arc<Pushback>,
    /// External authorization: Envoy's Check on the gRPC port, forward-auth on its own.
    pub authorizer: Arc<Authorizer>,
    /// The bounds of the gRPC port's connections (the others derive theirs).
    pub limits: Limits,
    /// Who may name the client of its requests, on every port alike.
    pub callers: Arc<TrustedCallers>,
    /// The account events: WatchEvents streams and retention.
    pub events: Arc<Events>,
    /// Webhook delivery, when endpoints are configured.
    pub webhooks: Option<Arc<Webhooks>>,
}

impl Core {
    /// The outermost layer of every port: ids, metrics, traces and the request
    /// lines, the refusals' within the budget all ports share.
    pub(crate) fn trace_layer(&self) -> MiddlewareLayer<Trace> {
        trace::layer(
            self.metrics.clone(),
            self.traces.clone(),
            self.refusal_log.clone(),
        )
    }

    pub(super) async fn build(config: &Config) -> anyhow::Result<Self> {
        let keys = config.tokens.keys()?;
        let metrics = Arc::new(Metrics::new());
        // The one clock of every component that reads the time.
        let clock = config.clock();
        // Before anything is opened: a bad certificate or key stops the start with
        // one line naming the option.
        let tls = config
            .tls
            .files()?
            .map(|files| ServerTls::load(files, metrics.tls.clone()))
            .transpose()?;
        let traces = Traces::start(&config.telemetry.trace_settings(), &metrics)?.map(Arc::new);
        // Before the store: a bad list file stops the start before anything is opened.
        let blocklist = Arc::new(config.passwords.blocklist(&metrics)?);
        // Before the store: a webhook setting that does not hold stops the start.
        let webhook_settings = config.events.webhooks()?;
        let store = Arc::new(Store::open(config.store.settings(), &metrics, clock.clone()).await?);
        let events = Arc::new(Events::new(
            store.clone(),
            clock.clone(),
            config.events.settings(),
            metrics.events.clone(),
        ));
        let webhooks = webhook_settings.map(|settings| {
            Arc::new(Webhooks::new(
                store.clone(),
                clock.clone(),
                settings,
                metrics.events.clone(),
            ))
        });
        if let Some(webhooks) = &webhooks {
            webhooks
                .prepare()
                .await
                .map_err(|e| anyhow::anyhow!("recording the webhook endpoints: {e:#}"))?;
        }
        let hasher = (config.passwords.hasher(&metrics)?).with_caps(config.import.caps());
        let tokens = config
            .tokens
            .tokens(keys.ring.clone(), &metrics, clock.clone())
            .with_issuer(config.oidc.issuer.as_deref());
        let key_ring = tokens.key_ring().clone();
        let key_file = keys.file.map(|(path, digest)| {
            Arc::new(KeyFile::for_ring(path, digest, key_ring.clone(), &metrics))
        });
        // Names accounts in the throttle's Redis keys and in audit events.
        let digest = config.tokens.account_digest(&keys.ring);
        let redis = open_redis(config, &metrics)?;
        let throttle = Throttle::new(
            config.limits.throttle(redis.clone())?,
            digest.clone(),
            metrics.throttle.clone(),
            clock.clone(),
        )?;
        throttle.connect().await;
        let accounts = Arc::new(
            Accounts::new(
                store,
                hasher,
                tokens,
                throttle,
                Audit::new(digest),
                config.tokens.sessions(),
                &metrics,
            )
            .with_second_factor(config.second_factor.settings())
            .with_services(config.tokens.services())
            .with_issuers(Arc::new(crate::issuers::Issuers::new(
                &config.oidc.issuers(config.tokens.token_clock_skew)?,
                clock.clone(),
                metrics.service.issuer_fetches.clone(),
            )?))
            .with_reset_ttl(config.events.password_reset_ttl),
        );
        // Failed logins cost as much as the most expensive stored hash from the first.
        accounts
            .refresh_hash_cost()
            .await
            .map_err(|e| anyhow::anyhow!("reading the highest stored password hash cost: {e}"))?;
        // What was revoked before this start is refused from the first request on.
        accounts
            .load_revocations()
            .await
            .map_err(|e| anyhow::anyhow!("reading the revoked sessions and accounts: {e}"))?;
        // The connection cap is fitted under the open-file limit, raised to its hard
        // limit first.
        let limits = config.server.connection_limits(transport::raise_fd_limit());
        // Envoy's rate limit rules: a file that does not parse stops the start.
        let rate_limit_rules = (config.limits.rate_limit_rules_file.clone())
            .map(|path| ratelimit::LiveRules::load(path, metrics.clone()).map(Arc::new))
            .transpose()?;
        let file_rules = (rate_limit_rules.as_ref()).and_then(|r| r.current().file.authd.clone());
        // Never fails on a Redis outage: the limiter starts degraded and keeps trying.
        let rate_limiter = RateLimiter::start(
            config
                .limits
                .rate_limiter(redis, file_rules.as_ref(), clock)?,
            &metrics,
        )
        .await?;
        if let Some(rules) = &rate_limit_rules {
            // A reload that changes the file's authd: section changes authd's own rules.
            let (limiter, limits) = (rate_limiter.clone(), config.limits.clone());
            rules.on_authd_rules(move |file_rules| {
                limiter.replace_rules(limits.authd_rules(file_rules)?);
                Ok(())
            });
        }
        let admission = Admission::new(
            config.overload.admission(
                MAX_MESSAGE_BYTES + GRPC_FRAME_HEADER,
                accounts.hasher().pool().parallelism(),
            ),
            metrics.overload.clone(),
        );
        let pushback = Pushback::new(config.overload.pushback(), metrics.overload.clone());
        let authorizer = Authorizer::new(
            accounts.clone(),
            config.authz.settings(),
            metrics.authz.clone(),
        );
        Ok(Self {
            callers: config.limits.trusted_callers(),
            metrics,
            traces,
            tls,
            blocklist,
            accounts,
            key_ring,
            key_file,
            rate_limiter,
            rate_limit_rules,
            admission,
            pushback,
            refusal_log: Arc::new(RefusalLog::new(config.telemetry.log_refusals)),
            authorizer,
            limits,
            events,
            webhooks,
        })
    }

    /// The store, closed last: it commits what its writer has queued.
    pub(super) fn store(&self) -> &Arc<Store> {
        self.accounts.store()
    }
}

/// One Redis connection for the rate limiter and the login throttle, when
/// configured; which master Sentinel named is read at each scrape.
fn open_redis(config: &Config, metrics: &Metrics) -> anyhow::Result<Option<Arc<SharedRedis>>> {
    let redis = (config.limits.redis_url.as_ref())
        .map(SharedRedis::open)
        .transpose()?;
    if let Some(redis) = &redis {
        // Nothing for other URLs.
        let (redis, master) = (Arc::downgrade(redis), metrics.sentinel.master.clone());
        metrics.on_scrape(move || {
            master.reset();
            if let Some(node) = redis.upgrade().and_then(|r| r.node()) {
                master.with_label_values(&[node.as_str()]).set(1);
            }
        });
    }
    Ok(redis)
}
