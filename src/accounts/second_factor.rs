//! The second factor's use cases (docs/second-factor.md): enrolling a TOTP factor,
//! the challenge a Login answers for a user who has one, completing that Login,
//! turning the factor off and replacing the recovery codes.
//!
//! A code is checked here against the opened secret, and used up in the store by
//! one conditional write together with what it proves (see `store::factor`), so
//! every code works once across requests and replicas. Every code presented takes
//! a place in the login throttle's second-factor counts first (refused there before
//! it is checked once over the limit); a challenge gives at most
//! [`CHALLENGE_ATTEMPTS`] code checks, each taken in the store before the check.
//! The time of codes and challenges is the accounts' clock (tests move it).

use super::{Accounts, LoginAnswer, Session};
use crate::{
    audit::Caller,
    error::Error,
    metrics::{CodeOutcome, FactorChange},
    second_factor::{self as codes, Challenge, Code, DataKeys},
    store::{Account, AccountKey, FactorAnswer, FactorWrite, Proof, Proved, Purpose},
    throttle::Attempt,
};
use std::time::{Duration, Instant};

/// How many codes one Login challenge lets be checked.
pub const CHALLENGE_ATTEMPTS: i64 = 5;

/// The second factor's settings.
#[derive(Clone)]
pub struct SecondFactorSettings {
    /// `None`: no TOTP secret can be sealed or opened (TOTP calls answer
    /// FAILED_PRECONDITION; recovery codes still work).
    pub data_keys: Option<DataKeys>,
    /// The otpauth URI's issuer.
    pub issuer: String,
    /// How long a Login's challenge lives.
    pub challenge_ttl: Duration,
}

impl Default for SecondFactorSettings {
    /// No data key, the default issuer and challenge lifetime.
    fn default() -> Self {
        Self {
            data_keys: None,
            issuer: "authd".into(),
            challenge_ttl: Duration::from_secs(5 * 60),
        }
    }
}

/// A new enrollment: what the user's app takes.
pub struct Enrollment {
    /// Base32, no padding.
    pub secret: String,
    pub otpauth_uri: String,
}

/// What a code is presented for (the audit trail's `purpose`).
#[derive(Debug, Clone, Copy)]
enum Use {
    Login,
    Confirm,
    Disable,
    Regenerate,
}

impl Use {
    fn label(self) -> &'static str {
        match self {
            Use::Login => "login",
            Use::Confirm => "confirm",
            Use::Disable => "disable",
            Use::Regenerate => "regenerate",
        }
    }
}

fn kind(code: &Code) -> &'static str {
    match code {
        Code::Totp(_) => "totp",
        Code::Recovery(_) => "recovery",
    }
}

/// A code presented: by whom, for which user, what for.
#[derive(Clone, Copy)]
struct Presented<'a> {
    caller: &'a Caller,
    user_id: &'a str,
    code: &'a Code,
    why: Use,
}

/// Why a code proves nothing.
enum Refusal {
    Wrong,
    Reused,
}

impl Accounts {
    fn now_ms(&self) -> i64 {
        self.clock.millis()
    }

    fn data_keys(&self) -> Result<&DataKeys, Error> {
        self.factors
            .data_keys
            .as_ref()
            .ok_or(Error::SecondFactorNotConfigured)
    }

    /// Login's answer for a user with a second factor on, whose password was
    /// right: a challenge bound to the user and the password version verified.
    pub(super) async fn challenge(
        &self,
        user: &crate::store::User,
        caller: &Caller,
    ) -> Result<LoginAnswer, Error> {
        let challenge = Challenge::random();
        let now = self.now_ms();
        let ttl = i64::try_from(self.factors.challenge_ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at = now.saturating_add(ttl);
        (self.store)
            .factor_write(FactorWrite::NewChallenge {
                digest: challenge.digest(),
                user_id: user.id.clone(),
                password_version: user.password_version,
                now,
                expires_at,
            })
            .await?;
        self.audit.login_challenged(caller, &user.id);
        Ok(LoginAnswer::Challenge {
            challenge: challenge.expose().to_owned(),
            expires_at: super::system_time(expires_at),
        })
    }

    /// Deletes up to `limit` Login challenges that expired; how many it deleted.
    pub(super) async fn purge_challenges(&self, limit: i64) -> Result<u64, Error> {
        let write = FactorWrite::PurgeChallenges {
            now: self.now_ms(),
            limit,
        };
        Ok(match self.store.factor_write(write).await? {
            FactorAnswer::Count(n) => n,
            _ => 0,
        })
    }

    /// Starts (or restarts) the TOTP enrollment of the user of `access_token`.
    pub async fn begin_totp_enrollment(
        &self,
        access_token: &str,
        caller: &Caller,
    ) -> Result<Enrollment, Error> {
        let user = self.validate(access_token, None)?;
        let keys = self.data_keys()?;
        let secret = codes::new_secret();
        let sealed = keys.seal(&user.user_id, &secret)?;
        let write = FactorWrite::Begin {
            user_id: user.user_id.clone(),
            sealed,
            now: self.now_ms(),
        };
        if !matches!(
            self.store.factor_write(write).await?,
            FactorAnswer::Wrote(true)
        ) {
            return Err(Error::SecondFactorState(
                "a second factor is on already: turn it off first",
            ));
        }
        self.metrics_sf.change(FactorChange::Begun);
        (self.audit).second_factor_changed(caller, &user.user_id, "enrollment_begun");
        Ok(Enrollment {
            secret: codes::base32(&secret),
            otpauth_uri: codes::otpauth_uri(&self.factors.issuer, &user.username, &secret),
        })
    }

    /// Turns the pending factor on with a current code; answers the recovery codes.
    pub async fn confirm_totp_enrollment(
        &self,
        access_token: &str,
        digits: String,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<Vec<String>, Error> {
        let user = self.validate(access_token, None)?;
        let keys = self.data_keys()?;
        let user_id = user.user_id.as_str();
        let code = Code::Totp(digits.clone());
        let p = Presented {
            caller,
            user_id,
            code: &code,
            why: Use::Confirm,
        };
        let attempt = self.code_attempt(&p, deadline).await?;
        let factor = (self.store.factor(user_id).await?)
            .filter(|f| !f.enabled)
            .ok_or(Error::SecondFactorState("no enrollment is pending"))?;
        let secret = open(keys, user_id, &factor.sealed)?;
        let steps = codes::matching_steps(&secret, &digits, self.now_secs());
        let Some(&step) = steps.first() else {
            return Err(self.code_refused(attempt, &p, Refusal::Wrong).await);
        };
        let (shown, digests) = codes::new_recovery_codes(user_id);
        let write = FactorWrite::Confirm {
            user_id: user_id.to_owned(),
            sealed: factor.sealed,
            step: i64::try_from(step).unwrap_or(i64::MAX),
            recovery: digests,
            now: self.now_ms(),
        };
        if !matches!(
            self.store.factor_write(write).await?,
            FactorAnswer::Wrote(true)
        ) {
            // Another confirmation (or a new enrollment) came first.
            return Err(self.code_refused(attempt, &p, Refusal::Reused).await);
        }
        self.code_accepted(attempt, &p).await;
        self.metrics_sf.change(FactorChange::Confirmed);
        (self.audit).second_factor_changed(caller, user_id, "enrolled");
        Ok(shown)
    }

    /// Finishes a Login that asked for the second factor.
    pub async fn complete_login(
        &self,
        challenge: &str,
        code: Code,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<Session, Error> {
        let challenge = Challenge::parse(challenge).ok_or(Error::InvalidChallenge)?;
        let digest = challenge.digest();
        let now = self.now_ms();
        let live = (self.store)
            .live_challenge(&digest, now, CHALLENGE_ATTEMPTS)
            .await?
            .ok_or(Error::InvalidChallenge)?;
        let user_id = live.user_id.as_str();
        if matches!(code, Code::Totp(_)) {
            self.data_keys()?;
        }
        let p = Presented {
            caller,
            user_id,
            code: &code,
            why: Use::Login,
        };
        let attempt = self.code_attempt(&p, deadline).await?;
        // One of the challenge's attempts, taken before the code is checked.
        let write = FactorWrite::Attempt {
            digest: digest.clone(),
            now,
            max: CHALLENGE_ATTEMPTS,
        };
        match self.store.factor_write(write).await? {
            FactorAnswer::Attempted(Some(owner)) if owner == live.user_id => {}
            _ => return Err(Error::InvalidChallenge),
        }
        let proof = match self.proof(user_id, &code).await? {
            Ok(proof) => proof,
            Err(why) => {
                return Err(self.code_refused(attempt, &p, why).await);
            }
        };
        let write = FactorWrite::Prove {
            user_id: user_id.to_owned(),
            proof,
            purpose: Purpose::Challenge(digest),
            now,
        };
        match self.store.factor_write(write).await? {
            FactorAnswer::Proved(Proved::Accepted) => {}
            FactorAnswer::Proved(Proved::Refused) => {
                let why = Refusal::Reused;
                return Err(self.code_refused(attempt, &p, why).await);
            }
            _ => return Err(Error::InvalidChallenge),
        }
        self.code_accepted(attempt, &p).await;
        // The session is stored only while the password is at the version the
        // Login verified (a change or a disable since ends it there).
        let mut user =
            (self.store.find_user_by_id(user_id).await?).ok_or(Error::InvalidChallenge)?;
        user.password_version = live.password_version;
        match self.start_session(&user, caller, "pwd otp").await {
            Ok(session) => {
                self.throttle.count_login(crate::metrics::LoginOutcome::Ok);
                self.audit.login_succeeded(caller, user_id);
                Ok(session)
            }
            Err(Error::InvalidCredentials) => Err(Error::InvalidChallenge),
            Err(e) => Err(e),
        }
    }

    /// Turns the factor of the user of `access_token` off.
    pub async fn disable_totp(
        &self,
        access_token: &str,
        code: Code,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<(), Error> {
        let user = self.validate(access_token, None)?;
        self.prove_for(
            &user.user_id,
            code,
            Purpose::Disable,
            Use::Disable,
            deadline,
            caller,
        )
        .await?;
        self.metrics_sf.change(FactorChange::Disabled);
        (self.audit).second_factor_changed(caller, &user.user_id, "disabled");
        Ok(())
    }

    /// Replaces the recovery codes of the user of `access_token`.
    pub async fn regenerate_recovery_codes(
        &self,
        access_token: &str,
        code: String,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<Vec<String>, Error> {
        let user = self.validate(access_token, None)?;
        let (shown, digests) = codes::new_recovery_codes(&user.user_id);
        let purpose = Purpose::Replace(digests);
        let code = Code::Totp(code);
        self.prove_for(
            &user.user_id,
            code,
            purpose,
            Use::Regenerate,
            deadline,
            caller,
        )
        .await?;
        (self.audit).second_factor_changed(caller, &user.user_id, "recovery_codes_replaced");
        Ok(shown)
    }

    /// An administrator removes the user's factor (on or pending), its recovery
    /// codes and its challenges; answers the account and whether it had a factor.
    pub async fn remove_second_factors(
        &self,
        key: &AccountKey,
        caller: &Caller,
    ) -> Result<(Account, bool), Error> {
        let account = self.account(key).await?;
        let write = FactorWrite::Remove {
            user_id: account.id.clone(),
        };
        let removed = matches!(
            self.store.factor_write(write).await?,
            FactorAnswer::Wrote(true)
        );
        if removed {
            self.metrics_sf.change(FactorChange::Removed);
            (self.audit).second_factor_changed(caller, &account.id, "removed");
        }
        Ok((account, removed))
    }

    /// A code of a signed-in user (DisableTotp, RegenerateRecoveryCodes): throttled,
    /// checked, and used up with `purpose` in one store write.
    async fn prove_for(
        &self,
        user_id: &str,
        code: Code,
        purpose: Purpose,
        why: Use,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<(), Error> {
        if matches!(code, Code::Totp(_)) {
            self.data_keys()?;
        }
        let p = Presented {
            caller,
            user_id,
            code: &code,
            why,
        };
        let attempt = self.code_attempt(&p, deadline).await?;
        if !(self.store.factor(user_id).await?).is_some_and(|f| f.enabled) {
            return Err(Error::SecondFactorState("no second factor is on"));
        }
        let proof = match self.proof(user_id, &code).await? {
            Ok(proof) => proof,
            Err(refusal) => {
                return Err(self.code_refused(attempt, &p, refusal).await);
            }
        };
        let write = FactorWrite::Prove {
            user_id: user_id.to_owned(),
            proof,
            purpose,
            now: self.now_ms(),
        };
        if !matches!(
            self.store.factor_write(write).await?,
            FactorAnswer::Proved(Proved::Accepted)
        ) {
            return Err(self.code_refused(attempt, &p, Refusal::Reused).await);
        }
        self.code_accepted(attempt, &p).await;
        Ok(())
    }

    fn now_secs(&self) -> u64 {
        self.clock.unix_secs()
    }

    /// What `code` would prove for `user_id` now: the latest step it is the code of
    /// that was not accepted yet, or a recovery code's digest (whether it is one of
    /// the user's, the store's write decides).
    async fn proof(&self, user_id: &str, code: &Code) -> Result<Result<Proof, Refusal>, Error> {
        match code {
            Code::Recovery(folded) => {
                Ok(Ok(Proof::Recovery(codes::recovery_digest(user_id, folded))))
            }
            Code::Totp(digits) => {
                let keys = self.data_keys()?;
                let Some(factor) = (self.store.factor(user_id).await?).filter(|f| f.enabled) else {
                    return Ok(Err(Refusal::Wrong));
                };
                let secret = open(keys, user_id, &factor.sealed)?;
                let steps = codes::matching_steps(&secret, digits, self.now_secs());
                let fresh = (steps.iter())
                    .filter_map(|s| i64::try_from(*s).ok())
                    .find(|s| *s > factor.last_step);
                Ok(match (fresh, steps.is_empty()) {
                    (Some(step), _) => Ok(Proof::Step(step)),
                    (None, true) => Err(Refusal::Wrong),
                    (None, false) => Err(Refusal::Reused),
                })
            }
        }
    }

    /// A place in the throttle's second-factor counts for a code of `user_id`; a
    /// refusal is counted and audited here, before the code is checked.
    async fn code_attempt(
        &self,
        p: &Presented<'_>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        let Presented {
            caller,
            user_id,
            code,
            why,
        } = *p;
        let begun = self
            .throttle
            .begin_codes(user_id, caller.client, deadline)
            .await;
        if let Err(Error::CodesThrottled { .. }) = &begun {
            self.metrics_sf.code(CodeOutcome::Throttled);
            (self.audit).second_factor_code(caller, user_id, kind(code), why.label(), "throttled");
        }
        begun
    }

    async fn code_accepted(&self, attempt: Option<Attempt>, p: &Presented<'_>) {
        let Presented {
            caller,
            user_id,
            code,
            why,
        } = *p;
        if let Some(attempt) = attempt {
            attempt.succeeded().await;
        }
        self.metrics_sf.code(CodeOutcome::Accepted);
        if matches!(code, Code::Recovery(_)) {
            self.metrics_sf.recovery_used.inc();
        }
        (self.audit).second_factor_code(caller, user_id, kind(code), why.label(), "ok");
    }

    /// A wrong or reused code: counted by the throttle, the metric and the audit
    /// trail; the caller is told only that the code is invalid.
    async fn code_refused(
        &self,
        attempt: Option<Attempt>,
        p: &Presented<'_>,
        refusal: Refusal,
    ) -> Error {
        let Presented {
            caller,
            user_id,
            code,
            why,
        } = *p;
        if let Some(attempt) = attempt {
            attempt.failed().await;
        }
        let (outcome, label) = match refusal {
            Refusal::Wrong => (CodeOutcome::Wrong, "wrong"),
            Refusal::Reused => (CodeOutcome::Reused, "reused"),
        };
        self.metrics_sf.code(outcome);
        (self.audit).second_factor_code(caller, user_id, kind(code), why.label(), label);
        Error::InvalidCode
    }
}

/// The secret sealed for `user_id`; a seal that does not open is the server's
/// fault (a data key removed too early, a row tampered with), logged, never shown.
fn open(keys: &DataKeys, user_id: &str, sealed: &str) -> Result<Vec<u8>, Error> {
    keys.open(user_id, sealed).map_err(|e| {
        Error::Internal(anyhow::anyhow!(e).context(format!(
            "the TOTP secret of user {user_id} does not open (data keys: {:?})",
            keys.kids()
        )))
    })
}
