//! Wiring: [`Application::build`] builds the core from the configuration and binds
//! every port (port 0 works); [`Application::run_until_stopped`] serves until the
//! shutdown future resolves, then drains and flushes. `main.rs` and every
//! integration test start authd through this same code.
//!
//! Each component builds itself from its configuration group, in a file of its own:
//! - `core`: the metrics registry, TLS, traces, the store, the accounts, the rate
//!   limiter, admission control and pushback: what every port serves from;
//! - `ports`: every port, bound at build and served at run (and the plain-HTTP
//!   ones: metrics and JWKS, forward-auth); `grpc`, `admin` and `health` (readiness,
//!   and the health-only port on a thread of its own) are files of their own;
//! - `background`: the session upkeep and the files re-read while serving;
//! - `supervisor`: the one owner of every task: one cancellation token and one
//!   tracker per stage of the teardown, which is written once, here;
//! - `handle`: [`AppHandle`], the internals tests and tools look at;
//! - `migrate`: `authd migrate` and its checks, which open the database only.

mod admin;
mod background;
mod core;
mod grpc;
mod handle;
mod health;
mod migrate;
mod ports;
mod supervisor;

pub use handle::AppHandle;
pub use migrate::{RollbackVerdict, check_rollback, migrate, schema};

use self::{
    core::Core,
    health::Readiness,
    ports::{Addresses, Ports},
    supervisor::{Stage, Supervisor},
};
use crate::config::Config;
use std::{future::Future, net::SocketAddr};

/// A built, bound, not yet serving authd.
pub struct Application {
    core: Core,
    ports: Ports,
    addresses: Addresses,
    config: Config,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let core = Core::build(&config).await?;
        let ports = Ports::bind(&config).await?;
        Ok(Self {
            addresses: ports.addresses(),
            core,
            ports,
            config,
        })
    }

    /// Where the admin API answers (`None` while `AUTHD_ADMIN_LISTEN` is off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.addresses.admin
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addresses.grpc
    }

    pub fn port(&self) -> u16 {
        self.addresses.grpc.port()
    }

    /// Where `GET /metrics` answers (`None` when `AUTHD_METRICS_LISTEN` is empty).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.addresses.metrics
    }

    /// Where the health-only port answers (`None` when `AUTHD_HEALTH_LISTEN` is empty).
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.addresses.health
    }

    /// A handle on the application's internals that stays valid once it runs
    /// (`run_until_stopped` takes the application itself).
    pub fn handle(&self) -> AppHandle {
        AppHandle::new(&self.core, self.addresses)
    }

    /// Serves until `shutdown` resolves, then: reports NOT_SERVING, refuses new work
    /// while the work in flight finishes (at most the drain timeout), closes the
    /// connections and commits everything the store has queued. A task that stops
    /// on its own (a port's, a background task's) is an error: the same teardown,
    /// without the drain.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            core,
            ports,
            addresses,
            config,
        } = self;
        let mut tasks = Supervisor::new();
        let readiness = Readiness::start(&core, &config, &mut tasks).await;
        background::start(&core, &config, &mut tasks);
        let served = ports.serve(&core, &config, &readiness, &mut tasks);
        let failure = match served {
            Ok(()) => {
                log_serving(&core, &config, &addresses);
                tokio::select! {
                    () = shutdown => None,
                    why = tasks.failed() => Some(anyhow::anyhow!(why)),
                }
            }
            Err(e) => Some(e),
        };

        // The teardown, for a shutdown and a failure alike.
        if failure.is_none() {
            tracing::info!(
                in_flight = core.admission.in_flight(),
                "shutting down: draining requests in flight"
            );
        }
        readiness.not_serving(&core).await;
        tasks.stop(Stage::Readiness).await;
        core.pushback.release();
        let drain = config.server.drain_timeout;
        if failure.is_none() && !core.admission.drain(drain).await {
            tracing::warn!(
                in_flight = core.admission.in_flight(),
                drain_timeout = ?drain,
                "the drain timed out; abandoning the requests still in flight"
            );
        }
        tasks.stop(Stage::Serving).await;
        core.store().close().await;
        // The health and metrics ports answer until now, the drain included.
        tasks.stop(Stage::Auxiliary).await;
        match failure {
            Some(e) => Err(e),
            None => {
                tracing::info!("authd stopped");
                Ok(())
            }
        }
    }
}

/// The one line that says authd serves, and with what.
fn log_serving(core: &Core, config: &Config, addresses: &Addresses) {
    let show = |addr: Option<SocketAddr>| addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
    let pool = core.accounts.hasher().pool();
    let signing = core.key_ring.current();
    tracing::info!(
        listen = %addresses.grpc,
        health = %show(addresses.health),
        admin = %show(addresses.admin),
        forward_auth = %show(addresses.forward_auth),
        metrics = %show(addresses.metrics),
        database = %config.store.database_url,
        password_hash = ?core.accounts.hasher().policy().algorithm,
        pbkdf2_iterations = config.passwords.pbkdf2_iterations,
        argon2_memory_kib = config.passwords.argon2_memory,
        argon2_memory_budget_mib = pool.memory_budget().total_kib() / 1024,
        hash_threads = config.passwords.hash_threads(),
        hash_backend = pool.engine().backend().name(),
        hash_lanes = pool.engine().lanes(),
        hash_kernels = %pool.engine().plan(),
        max_in_flight = config.overload.max_in_flight,
        max_wait = ?config.overload.max_wait,
        max_connections = core.limits.max_connections,
        trusted_callers = %core.callers,
        tls = match (&core.tls, &config.tls.tls_client_ca) {
            (None, _) => "off",
            (Some(_), None) => "on",
            (Some(_), Some(_)) => "mutual",
        },
        token_kid = signing.signing_kid(),
        token_alg = signing.signing_algorithm().jose_name(),
        "authd is serving"
    );
}
