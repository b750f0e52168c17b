//! The background tasks: the session upkeep, the summaries of refusals not logged, the account events' retention and
//! webhook delivery, and the files re-read while serving
//! (TLS certificates, the token key file, the rate limit rules file). A task is
//! added here, registered with the supervisor under the stage it stops with.

use super::{
    core::Core,
    supervisor::{Stage, Supervisor},
};
use crate::config::Config;

pub(super) fn start(core: &Core, config: &Config, tasks: &mut Supervisor) {
    // Revocations from every replica, and the purge of old sessions.
    let upkeep = (core.accounts.clone()).upkeep(config.tokens.revocation_delay / 2);
    tasks.spawn_until_stopped(Stage::Serving, "session upkeep", upkeep);
    // The summaries of refusals not logged one by one, the last one as it stops.
    let refusal_log = core.refusal_log.clone();
    tasks.spawn(Stage::Serving, "refusal log", |stop| refusal_log.run(stop));
    // The account events' retention, and webhook delivery.
    let events = core.events.clone();
    tasks.spawn(Stage::Serving, "event retention", |stop| {
        events.prune_every(stop)
    });
    if let Some(webhooks) = core.webhooks.clone() {
        tasks.spawn(Stage::Serving, "webhooks", |stop| webhooks.run(stop));
    }
    if let Some(tls) = core.tls.clone() {
        let every = config.tls.tls_reload;
        tasks.spawn(Stage::Serving, "TLS reload", |stop| {
            tls.reload_every(every, stop)
        });
    }
    if let Some(file) = core.key_file.clone() {
        let every = config.tokens.token_keys_reload;
        tasks.spawn(Stage::Auxiliary, "token key file reload", |stop| {
            file.reread_every(every, stop)
        });
    }
    if let Some(rules) = core.rate_limit_rules.clone() {
        let every = config.limits.rate_limit_rules_reload;
        tasks.spawn(Stage::Auxiliary, "rate limit rules reload", |stop| {
            rules.reread_every(every, stop)
        });
    }
}
