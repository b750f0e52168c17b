//! A decision that waits for the handler. A `client-id` rule counts the client id a
//! grant names, and over gRPC that is in the request's body (IssueServiceToken's
//! `client_id`), which the tower layer does not read. When a rule in force keys on
//! it, the layer puts a [`Deferred`] in the request's extensions and lets the
//! request through; the handler decides every rule of the request at once, first
//! thing once the body is decoded, and the layer adds the quota headers to the
//! answer as it does for the requests it decides itself. One decision per request
//! either way, so a refused request still adds nothing to any rule's log.
//!
//! A request whose body does not decode never reaches its handler, and is not
//! counted: it costs the server no more than its refusal.

use super::{Quota, RateLimiter};
use crate::{error::Error, rpc::ClientIdentity};
use std::{
    net::IpAddr,
    sync::{Arc, OnceLock},
};

/// What the rate-limit layer saw of a request whose decision its handler takes.
#[derive(Clone)]
pub(crate) struct Deferred {
    limiter: Arc<RateLimiter>,
    method: String,
    headers: http::HeaderMap,
    client: Option<IpAddr>,
    identity: Option<ClientIdentity>,
    /// What the handler's decision left, for the answer's headers.
    quota: Arc<OnceLock<Quota>>,
}

impl Deferred {
    pub(crate) fn new(
        limiter: Arc<RateLimiter>,
        method: &str,
        headers: &http::HeaderMap,
        client: Option<IpAddr>,
        identity: Option<&ClientIdentity>,
    ) -> Self {
        Self {
            limiter,
            method: method.to_owned(),
            headers: headers.clone(),
            client,
            identity: identity.cloned(),
            quota: Arc::new(OnceLock::new()),
        }
    }

    /// Decides every rule of the request, which names `client_id` (or none): Ok
    /// when it may go on, else the refusal (RESOURCE_EXHAUSTED, or UNAVAILABLE
    /// when Redis fails and the limiter fails closed). The handler calls it once.
    pub(crate) async fn decide(&self, client_id: Option<&str>) -> Result<(), Error> {
        let planned = self.limiter.plan_grant(
            &self.method,
            &self.headers,
            self.client,
            self.identity.as_ref(),
            client_id,
        );
        if planned.is_empty() {
            return Ok(());
        }
        let quota = self.limiter.decide(&planned).await?;
        let _ = self.quota.set(quota);
        Ok(())
    }

    /// The quota left by the handler's decision, once it was taken and allowed.
    pub(crate) fn quota(&self) -> Option<Quota> {
        self.quota.get().copied()
    }
}
