//! Password hashes made by other systems, verified as they are.
//!
//! Verify-only: authd never writes these formats; a user who logs in with one is
//! rehashed to the policy in force. [`ForeignHash::parse`] reads a stored hash into
//! a typed value (its format, its scheme and cost, its salt and output) and refuses
//! one whose cost is over the [`Caps`]; [`ForeignHash::verify`] checks a password
//! against it: the bytes as the client sent them, never normalized (the system that
//! made the hash did not normalize either), compared in constant time.
//!
//! The formats:
//! - PHC strings: `$pbkdf2-sha256$i=N,l=32$salt$hash` (and `$pbkdf2-sha512$`,
//!   `$pbkdf2$` for SHA-1), `$argon2id$v=19$m=M,t=T,p=P$salt$hash` (and `$argon2i$`,
//!   `$argon2d$`, with or without `v=`), `$scrypt$ln=L,r=R,p=P$salt$hash`; salt and
//!   hash in B64 (standard alphabet, no padding), the salt used as its decoded bytes.
//! - bcrypt: `$2a$`, `$2b$`, `$2y$` (one algorithm under three names); `$2x$` (the
//!   buggy one) is refused.
//! - Django: `pbkdf2_sha256$N$salt$base64`, `pbkdf2_sha1$…`, `argon2$argon2id$…` (a
//!   PHC string behind `argon2`), `bcrypt_sha256$$2b$…` (bcrypt of the hex SHA-256 of
//!   the password), `bcrypt$$2b$…`, `scrypt$N$salt$r$p$base64`; the salt is text,
//!   used as its UTF-8 bytes.
//! - Werkzeug: `pbkdf2:sha256:N$salt$hex` (also `sha1`, `sha512`) and
//!   `scrypt:N:r:p$salt$hex`; the salt is text. A method without its parameters
//!   (Werkzeug's defaults changed between versions) is refused.
//! - passlib: `$pbkdf2-sha256$N$salt$hash` (also `-sha512`, and `$pbkdf2$` for
//!   SHA-1) in passlib's adapted base64 (`.` for `+`, no padding); told apart from
//!   PHC by its bare iteration count.
//! - The structured form, for hashes kept in raw columns: a JSON object
//!   `{"algorithm": "pbkdf2-sha256", "iterations": 10000, "salt": "…",
//!   "salt_encoding": "utf8|hex|base64", "hash": "…", "hash_encoding": "hex|base64"}`
//!   (`pbkdf2-sha512`, `pbkdf2-sha1` too). A hashlib digest with a text salt column is
//!   `utf8` + `hex`; a `pbkdf2_sha256$N$base64salt$base64hash` whose salt is base64 of
//!   the salt's bytes (not Django's: Django's salt is the text itself) is `base64` +
//!   `base64`.
//!
//! Every primitive is a well-kept crate's: `pbkdf2` (with `sha1`, `sha2`), `argon2`,
//! `scrypt`, `bcrypt` (on RustCrypto's `blowfish`, whose own verification compares in
//! constant time); the other outputs are compared with `subtle`.
//!
//! A [`FormatError`] says what is wrong in words and numbers of its own: it never
//! quotes the input, so neither the hash nor the salt reaches a log or an answer.
//! No input panics: every length and number is checked before it is used.
//!
//! Login verifies the ext column with it (`Hasher::verify`), on the hashing pool.

use base64::{
    Engine as _, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use sha2::Digest as _;
use subtle::ConstantTimeEq as _;

/// The highest cost a foreign hash may have: a hash over any of them is refused
/// when it is parsed, so an imported hash never becomes a CPU or memory bomb. The
/// defaults admit what current versions of the systems above write at their own
/// defaults (Django 5: PBKDF2 at 1,000,000, Argon2 at 100 MiB, t = 2, p = 8; passlib's
/// scrypt at 64 MiB; Werkzeug 3: PBKDF2 at 1,000,000, scrypt at 32 MiB), with room,
/// and no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// bcrypt's cost (log₂ of its rounds). Default 14 (common defaults are 10–12;
    /// each step doubles the time).
    pub bcrypt_cost: u32,
    /// scrypt's N·r: its memory is 128·N·r bytes. Default 2^20 (128 MiB).
    pub scrypt_memory: u64,
    /// scrypt's p (its time grows with p, its memory does not). Default 16.
    pub scrypt_parallelism: u32,
    /// Argon2's memory in KiB. Default 131,072 (128 MiB).
    pub argon2_memory_kib: u32,
    /// Argon2's passes over its memory. Default 10.
    pub argon2_time: u32,
    /// Argon2's lanes (computed one after another here). Default 16.
    pub argon2_lanes: u32,
    /// PBKDF2's iterations, times the blocks of its output when the output is longer
    /// than one digest (each block costs the iterations again). Default 2,000,000.
    pub pbkdf2_iterations: u32,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            bcrypt_cost: 14,
            scrypt_memory: 1 << 20,
            scrypt_parallelism: 16,
            argon2_memory_kib: 128 * 1024,
            argon2_time: 10,
            argon2_lanes: 16,
            pbkdf2_iterations: 2_000_000,
        }
    }
}

/// Why a stored hash is refused. Its text names the format and the reason, with
/// the offending parameter's value when it is a cost; never the hash or the salt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not a password hash format authd can verify")]
    Unrecognized,
    #[error("{format} hash: {reason}")]
    Malformed {
        format: &'static str,
        reason: &'static str,
    },
    #[error("{format} hash: {reason}")]
    Unsupported {
        format: &'static str,
        reason: &'static str,
    },
    #[error("{format} hash: {what} {value} is over the cap of {cap}")]
    OverCap {
        format: &'static str,
        what: &'static str,
        value: u64,
        cap: u64,
    },
}

/// The system whose format a hash was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Phc,
    Bcrypt,
    Django,
    Werkzeug,
    Passlib,
    Structured,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Phc => "PHC",
            Format::Bcrypt => "bcrypt",
            Format::Django => "Django",
            Format::Werkzeug => "Werkzeug",
            Format::Passlib => "passlib",
            Format::Structured => "structured",
        }
    }
}

/// PBKDF2's pseudo-random function: HMAC with one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prf {
    Sha1,
    Sha256,
    Sha512,
}

impl Prf {
    /// The digest's length in bytes: one block of PBKDF2's output.
    fn block(self) -> usize {
        match self {
            Prf::Sha1 => 20,
            Prf::Sha256 => 32,
            Prf::Sha512 => 64,
        }
    }
}

/// Argon2's variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Variant {
    Argon2d,
    Argon2i,
    Argon2id,
}

/// What computes a foreign hash, with its cost: everything about it but the salt
/// and the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Pbkdf2 {
        prf: Prf,
        iterations: u32,
    },
    Argon2 {
        variant: Argon2Variant,
        /// 0x10 or 0x13 (`v=19`).
        version: u32,
        memory_kib: u32,
        time: u32,
        lanes: u32,
    },
    Scrypt {
        log_n: u8,
        r: u32,
        p: u32,
    },
    Bcrypt {
        cost: u32,
        /// Django's `bcrypt_sha256`: bcrypt of the hex SHA-256 of the password.
        sha256_prehash: bool,
    },
}

/// A foreign password hash, parsed and within its [`Caps`]. Its `Debug` shows the
/// format and the scheme, never the salt or the output.
#[derive(Clone)]
pub struct ForeignHash {
    format: Format,
    scheme: Scheme,
    secret: Secret,
}

#[derive(Clone)]
enum Secret {
    /// A KDF's salt and expected output.
    Derived { salt: Vec<u8>, output: Vec<u8> },
    /// A bcrypt string (`$2a$`, `$2b$` or `$2y$`), checked by the bcrypt crate.
    Bcrypt(String),
}

impl std::fmt::Debug for ForeignHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignHash")
            .field("format", &self.format)
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

/// The longest stored hash read (a structured form included).
const MAX_INPUT: usize = 4096;
/// The longest salt, in bytes.
const MAX_SALT: usize = 1024;
/// The shortest and longest output of a KDF, in bytes: shorter would let wrong
/// passwords match by chance; longer is no one's format.
const MIN_OUTPUT: usize = 16;
const MAX_OUTPUT: usize = 128;

impl ForeignHash {
    /// Parses a stored hash in any of the formats above (a structured form as its
    /// JSON text) and checks it against the default [`Caps`].
    #[cfg(test)]
    pub fn parse(input: &str) -> Result<Self, FormatError> {
        Self::parse_with(input, &Caps::default())
    }

    /// Parses a stored hash and checks it against `caps`.
    pub fn parse_with(input: &str, caps: &Caps) -> Result<Self, FormatError> {
        if input.len() > MAX_INPUT {
            return Err(FormatError::Malformed {
                format: "stored",
                reason: "longer than 4096 bytes",
            });
        }
        let hash = if input.trim_start().starts_with('{') {
            let value: serde_json::Value =
                serde_json::from_str(input).map_err(|_| FormatError::Malformed {
                    format: Format::Structured.name(),
                    reason: "not valid JSON",
                })?;
            return Self::from_json(&value, caps);
        } else if input.starts_with("$2") {
            parse_bcrypt(input, Format::Bcrypt, false)?
        } else if input.starts_with('$') {
            parse_dollar(input)?
        } else if let Some(phc) = input.strip_prefix("argon2").filter(|r| r.starts_with('$')) {
            // Django: "argon2" before argon2-cffi's PHC string.
            parse_phc_argon2(phc, Format::Django)?
        } else if let Some(rest) = input.strip_prefix("bcrypt_sha256$") {
            parse_bcrypt(rest, Format::Django, true)?
        } else if let Some(rest) = input.strip_prefix("bcrypt$") {
            parse_bcrypt(rest, Format::Django, false)?
        } else if input.starts_with("pbkdf2_sha256$") || input.starts_with("pbkdf2_sha1$") {
            parse_django_pbkdf2(input)?
        } else if input.starts_with("scrypt$") {
            parse_django_scrypt(input)?
        } else if input.starts_with("pbkdf2:") || input.starts_with("scrypt:") {
            parse_werkzeug(input)?
        } else {
            return Err(FormatError::Unrecognized);
        };
        hash.check(caps)?;
        Ok(hash)
    }

    /// Parses the structured form from a JSON value (an import record's field) and
    /// checks it against `caps`.
    pub fn from_json(value: &serde_json::Value, caps: &Caps) -> Result<Self, FormatError> {
        let hash = parse_structured(value)?;
        hash.check(caps)?;
        Ok(hash)
    }

    #[cfg(test)]
    pub fn format(&self) -> Format {
        self.format
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The rounds, salt and output of a PBKDF2-SHA256 hash with a 32-byte output:
    /// exactly what authd's PBKDF2 engine computes, so the hashing pool verifies it
    /// in its lanes. `None` for any other scheme or output length.
    pub fn pbkdf2_sha256(&self) -> Option<(u32, &[u8], [u8; 32])> {
        match (&self.secret, self.scheme) {
            (
                Secret::Derived { salt, output },
                Scheme::Pbkdf2 {
                    prf: Prf::Sha256,
                    iterations,
                },
            ) => Some((
                iterations,
                salt,
                <[u8; 32]>::try_from(output.as_slice()).ok()?,
            )),
            _ => None,
        }
    }

    /// Refuses a hash whose cost is over `caps`.
    pub fn check(&self, caps: &Caps) -> Result<(), FormatError> {
        let format = self.format.name();
        let over = |what, value: u64, cap: u64| {
            if value > cap {
                Err(FormatError::OverCap {
                    format,
                    what,
                    value,
                    cap,
                })
            } else {
                Ok(())
            }
        };
        match self.scheme {
            Scheme::Pbkdf2 { prf, iterations } => {
                let blocks = match &self.secret {
                    Secret::Derived { output, .. } => output.len().div_ceil(prf.block()),
                    Secret::Bcrypt(_) => 1,
                };
                over(
                    "PBKDF2 iterations (times output blocks)",
                    u64::from(iterations) * blocks as u64,
                    u64::from(caps.pbkdf2_iterations),
                )
            }
            Scheme::Argon2 {
                memory_kib,
                time,
                lanes,
                ..
            } => {
                over(
                    "Argon2 memory (KiB)",
                    memory_kib.into(),
                    caps.argon2_memory_kib.into(),
                )?;
                over("Argon2 time", time.into(), caps.argon2_time.into())?;
                over("Argon2 lanes", lanes.into(), caps.argon2_lanes.into())
            }
            Scheme::Scrypt { log_n, r, p } => {
                let nr = 1u64
                    .checked_shl(log_n.into())
                    .and_then(|n| n.checked_mul(r.into()))
                    .unwrap_or(u64::MAX);
                over("scrypt N·r", nr, caps.scrypt_memory)?;
                over("scrypt p", p.into(), caps.scrypt_parallelism.into())
            }
            Scheme::Bcrypt { cost, .. } => {
                over("bcrypt cost", cost.into(), caps.bcrypt_cost.into())
            }
        }
    }

    /// Whether `password`, the bytes exactly as the client sent them, is the one
    /// this hash was made from. The outputs are compared in constant time.
    pub fn verify(&self, password: &[u8]) -> bool {
        match (&self.secret, self.scheme) {
            (Secret::Bcrypt(hash), Scheme::Bcrypt { sha256_prehash, .. }) => {
                if sha256_prehash {
                    let hex = hex::encode(sha2::Sha256::digest(password));
                    bcrypt::verify(hex.as_bytes(), hash).unwrap_or(false)
                } else {
                    bcrypt::verify(password, hash).unwrap_or(false)
                }
            }
            (Secret::Derived { salt, output }, scheme) => {
                let mut computed = vec![0u8; output.len()];
                derive(scheme, password, salt, &mut computed)
                    && bool::from(computed.as_slice().ct_eq(output.as_slice()))
            }
            (Secret::Bcrypt(_), _) => false,
        }
    }
}

/// Computes a KDF's output into `out`; false when the crate refuses the parameters
/// (parsing checked them already, so never in practice).
fn derive(scheme: Scheme, password: &[u8], salt: &[u8], out: &mut [u8]) -> bool {
    match scheme {
        Scheme::Pbkdf2 { prf, iterations } => {
            match prf {
                Prf::Sha1 => pbkdf2::pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
                Prf::Sha256 => pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
                Prf::Sha512 => pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
            }
            true
        }
        Scheme::Argon2 { .. } => match argon2_context(scheme, out.len()) {
            Some(context) => context.hash_password_into(password, salt, out).is_ok(),
            None => false,
        },
        Scheme::Scrypt { log_n, r, p } => match scrypt::Params::new(log_n, r, p) {
            Ok(params) => scrypt::scrypt(password, salt, &params, out).is_ok(),
            Err(_) => false,
        },
        Scheme::Bcrypt { .. } => false,
    }
}

fn argon2_context(scheme: Scheme, output_len: usize) -> Option<argon2::Argon2<'static>> {
    let Scheme::Argon2 {
        variant,
        version,
        memory_kib,
        time,
        lanes,
    } = scheme
    else {
        return None;
    };
    let algorithm = match variant {
        Argon2Variant::Argon2d => argon2::Algorithm::Argon2d,
        Argon2Variant::Argon2i => argon2::Algorithm::Argon2i,
        Argon2Variant::Argon2id => argon2::Algorithm::Argon2id,
    };
    let version = match version {
        0x10 => argon2::Version::V0x10,
        0x13 => argon2::Version::V0x13,
        _ => return None,
    };
    let params = argon2::Params::new(memory_kib, time, lanes, Some(output_len)).ok()?;
    Some(argon2::Argon2::new(algorithm, version, params))
}

// ---- decoding ----

/// Standard base64, padded or not (PHC's B64 is unpadded, Python's b64encode pads).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// bcrypt's own base64 (its alphabet, no padding), as the bcrypt crate reads it.
const BCRYPT64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::BCRYPT,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::RequireNone),
);

fn malformed(format: Format, reason: &'static str) -> FormatError {
    FormatError::Malformed {
        format: format.name(),
        reason,
    }
}

fn unsupported(format: Format, reason: &'static str) -> FormatError {
    FormatError::Unsupported {
        format: format.name(),
        reason,
    }
}

/// A decimal number of ASCII digits only (no sign, no space), within u32.
fn number(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn base64(text: &str, format: Format, what: &'static str) -> Result<Vec<u8>, FormatError> {
    BASE64.decode(text).map_err(|_| malformed(format, what))
}

/// passlib's adapted base64: `.` for `+`, no padding.
fn ab64(text: &str, format: Format, what: &'static str) -> Result<Vec<u8>, FormatError> {
    if text.contains(['+', '=']) {
        return Err(malformed(format, what));
    }
    base64(&text.replace('.', "+"), format, what)
}

/// Checks the lengths of a KDF's salt and output.
fn derived(salt: Vec<u8>, output: Vec<u8>, format: Format) -> Result<Secret, FormatError> {
    if salt.len() > MAX_SALT {
        return Err(malformed(format, "the salt is longer than 1024 bytes"));
    }
    if output.len() < MIN_OUTPUT {
        return Err(malformed(format, "the hash is shorter than 16 bytes"));
    }
    if output.len() > MAX_OUTPUT {
        return Err(malformed(format, "the hash is longer than 128 bytes"));
    }
    Ok(Secret::Derived { salt, output })
}

fn pbkdf2_hash(
    format: Format,
    prf: Prf,
    iterations: Option<u32>,
    salt: Vec<u8>,
    output: Vec<u8>,
) -> Result<ForeignHash, FormatError> {
    let iterations = iterations
        .filter(|i| *i > 0)
        .ok_or_else(|| malformed(format, "the iteration count is not a positive number"))?;
    Ok(ForeignHash {
        format,
        scheme: Scheme::Pbkdf2 { prf, iterations },
        secret: derived(salt, output, format)?,
    })
}

/// scrypt's N, which must be a power of two above 1, as its log₂.
fn scrypt_log_n(n: Option<u32>, format: Format) -> Result<u8, FormatError> {
    match n {
        Some(n) if n > 1 && n.is_power_of_two() => Ok(n.trailing_zeros() as u8),
        _ => Err(malformed(
            format,
            "scrypt's N is not a power of two above 1",
        )),
    }
}

fn scrypt_hash(
    format: Format,
    log_n: u8,
    r: Option<u32>,
    p: Option<u32>,
    salt: Vec<u8>,
    output: Vec<u8>,
) -> Result<ForeignHash, FormatError> {
    let (Some(r), Some(p)) = (r, p) else {
        return Err(malformed(format, "scrypt's r or p is not a number"));
    };
    if scrypt::Params::new(log_n, r, p).is_err() {
        return Err(malformed(format, "scrypt's parameters are out of range"));
    }
    Ok(ForeignHash {
        format,
        scheme: Scheme::Scrypt { log_n, r, p },
        secret: derived(salt, output, format)?,
    })
}

// ---- the formats ----

/// `$2a$`, `$2b$`, `$2y$`: 60 characters, a two-digit cost, 22 characters of salt
/// and 31 of hash in bcrypt's base64.
fn parse_bcrypt(
    input: &str,
    format: Format,
    sha256_prehash: bool,
) -> Result<ForeignHash, FormatError> {
    let bytes = input.as_bytes();
    if bytes.len() != 60 || !input.is_ascii() {
        return Err(malformed(format, "a bcrypt hash is 60 ASCII characters"));
    }
    let (version, cost, rest) = (&input[1..3], &input[4..6], &input[7..]);
    if bytes[0] != b'$' || bytes[3] != b'$' || bytes[6] != b'$' {
        return Err(malformed(
            format,
            "a bcrypt hash is $2b$NN$ then 53 characters",
        ));
    }
    match version {
        "2a" | "2b" | "2y" => {}
        "2x" => {
            return Err(unsupported(
                format,
                "bcrypt $2x$ (the buggy variant) is not supported",
            ));
        }
        _ => return Err(malformed(format, "not a bcrypt version ($2a$, $2b$, $2y$)")),
    }
    let cost = number(cost)
        .filter(|c| (4..=31).contains(c))
        .ok_or_else(|| malformed(format, "bcrypt's cost is not a number from 04 to 31"))?;
    let (salt, hash) = rest.split_at(22);
    let (mut salt_bytes, mut hash_bytes) = ([0u8; 16], [0u8; 23]);
    let salt_ok = BCRYPT64.decode_slice(salt, &mut salt_bytes) == Ok(16);
    let hash_ok = BCRYPT64.decode_slice(hash, &mut hash_bytes) == Ok(23);
    if !salt_ok || !hash_ok {
        return Err(malformed(format, "the salt or hash is not bcrypt's base64"));
    }
    Ok(ForeignHash {
        format,
        scheme: Scheme::Bcrypt {
            cost,
            sha256_prehash,
        },
        secret: Secret::Bcrypt(input.to_owned()),
    })
}

/// The `$id$…` strings but bcrypt's: PHC, and passlib's PBKDF2.
fn parse_dollar(input: &str) -> Result<ForeignHash, FormatError> {
    let id = input.split('$').nth(1).unwrap_or_default();
    match id {
        "argon2id" | "argon2i" | "argon2d" => parse_phc_argon2(input, Format::Phc),
        "scrypt" => parse_phc_scrypt(input),
        "pbkdf2" | "pbkdf2-sha256" | "pbkdf2-sha512" => {
            let prf = match id {
                "pbkdf2" => Prf::Sha1,
                "pbkdf2-sha256" => Prf::Sha256,
                _ => Prf::Sha512,
            };
            let params = input.split('$').nth(2).unwrap_or_default();
            if params.bytes().all(|b| b.is_ascii_digit()) {
                parse_passlib_pbkdf2(input, prf)
            } else {
                parse_phc_pbkdf2(input, prf)
            }
        }
        _ => Err(FormatError::Unrecognized),
    }
}

/// A PHC string's fields after the empty one before the first `$`: `[id, …]`.
fn phc_fields(input: &str, format: Format) -> Result<Vec<&str>, FormatError> {
    let mut fields = input.split('$');
    if fields.next() != Some("") {
        return Err(malformed(format, "a PHC string starts with $"));
    }
    Ok(fields.collect())
}

/// `k=v,k=v` parameters, each key once and all of them known.
fn phc_params<'a>(
    text: &'a str,
    keys: &[&str],
    format: Format,
) -> Result<Vec<Option<&'a str>>, FormatError> {
    let mut values = vec![None; keys.len()];
    for pair in text.split(',') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| malformed(format, "a parameter is not key=value"))?;
        let at = keys
            .iter()
            .position(|k| *k == key)
            .ok_or_else(|| unsupported(format, "a parameter this format does not know"))?;
        if values[at].replace(value).is_some() {
            return Err(malformed(format, "a parameter is given twice"));
        }
    }
    Ok(values)
}

/// `$argon2id$v=19$m=M,t=T,p=P$salt$hash` (also without `v=`: version 0x10).
fn parse_phc_argon2(input: &str, format: Format) -> Result<ForeignHash, FormatError> {
    let fields = phc_fields(input, format)?;
    let (id, version, params, salt, hash) = match fields.as_slice() {
        [id, version, params, salt, hash] => {
            (*id, version.strip_prefix("v="), *params, *salt, *hash)
        }
        [id, params, salt, hash] if !params.starts_with("v=") => {
            (*id, Some("16"), *params, *salt, *hash)
        }
        _ => return Err(malformed(format, "an Argon2 PHC string has 4 or 5 fields")),
    };
    let variant = match id {
        "argon2id" => Argon2Variant::Argon2id,
        "argon2i" => Argon2Variant::Argon2i,
        "argon2d" => Argon2Variant::Argon2d,
        _ => return Err(malformed(format, "not an Argon2 variant")),
    };
    let version = match version.and_then(number) {
        Some(16) => 0x10,
        Some(19) => 0x13,
        _ => return Err(malformed(format, "Argon2's version is not 16 or 19")),
    };
    let values = phc_params(params, &["m", "t", "p"], format)?;
    let [Some(m), Some(t), Some(p)] = [values[0], values[1], values[2]].map(|v| v.and_then(number))
    else {
        return Err(malformed(format, "Argon2's m, t and p are not all numbers"));
    };
    let salt = base64(salt, format, "the salt is not base64")?;
    let output = base64(hash, format, "the hash is not base64")?;
    if salt.len() < 8 {
        return Err(malformed(format, "an Argon2 salt is at least 8 bytes"));
    }
    let scheme = Scheme::Argon2 {
        variant,
        version,
        memory_kib: m,
        time: t,
        lanes: p,
    };
    if argon2::Params::new(m, t, p, Some(output.len())).is_err() {
        return Err(malformed(format, "Argon2's parameters are out of range"));
    }
    Ok(ForeignHash {
        format,
        scheme,
        secret: derived(salt, output, format)?,
    })
}

/// `$scrypt$ln=L,r=R,p=P$salt$hash` (passlib's and RustCrypto's).
fn parse_phc_scrypt(input: &str) -> Result<ForeignHash, FormatError> {
    let format = Format::Phc;
    let fields = phc_fields(input, format)?;
    let [_, params, salt, hash] = fields.as_slice() else {
        return Err(malformed(format, "a scrypt PHC string has 4 fields"));
    };
    let values = phc_params(params, &["ln", "r", "p"], format)?;
    let [ln, r, p] = [values[0], values[1], values[2]].map(|v| v.and_then(number));
    let log_n = ln
        .filter(|ln| (1..64).contains(ln))
        .ok_or_else(|| malformed(format, "scrypt's ln is not a number from 1 to 63"))?;
    let salt = base64(salt, format, "the salt is not base64")?;
    let output = base64(hash, format, "the hash is not base64")?;
    scrypt_hash(format, log_n as u8, r, p, salt, output)
}

/// `$pbkdf2-sha256$i=N,l=L$salt$hash` (`l`, the output length, is optional).
fn parse_phc_pbkdf2(input: &str, prf: Prf) -> Result<ForeignHash, FormatError> {
    let format = Format::Phc;
    let fields = phc_fields(input, format)?;
    let [_, params, salt, hash] = fields.as_slice() else {
        return Err(malformed(format, "a PBKDF2 PHC string has 4 fields"));
    };
    let values = phc_params(params, &["i", "l"], format)?;
    let iterations = values[0].and_then(number);
    let salt = base64(salt, format, "the salt is not base64")?;
    let output = base64(hash, format, "the hash is not base64")?;
    if let Some(length) = values[1]
        && number(length) != u32::try_from(output.len()).ok()
    {
        return Err(malformed(format, "l is not the hash's length"));
    }
    pbkdf2_hash(format, prf, iterations, salt, output)
}

/// passlib's `$pbkdf2-sha256$N$salt$hash`, in its adapted base64.
fn parse_passlib_pbkdf2(input: &str, prf: Prf) -> Result<ForeignHash, FormatError> {
    let format = Format::Passlib;
    let fields = phc_fields(input, format)?;
    let [_, iterations, salt, hash] = fields.as_slice() else {
        return Err(malformed(format, "a passlib PBKDF2 hash has 4 fields"));
    };
    let salt = ab64(salt, format, "the salt is not passlib's base64")?;
    let output = ab64(hash, format, "the hash is not passlib's base64")?;
    pbkdf2_hash(format, prf, number(iterations), salt, output)
}

/// Django's `pbkdf2_sha256$N$salt$base64` and `pbkdf2_sha1$…`.
fn parse_django_pbkdf2(input: &str) -> Result<ForeignHash, FormatError> {
    let format = Format::Django;
    let fields: Vec<&str> = input.split('$').collect();
    let [algorithm, iterations, salt, hash] = fields.as_slice() else {
        return Err(malformed(format, "a Django PBKDF2 hash has 4 fields"));
    };
    let prf = match *algorithm {
        "pbkdf2_sha256" => Prf::Sha256,
        _ => Prf::Sha1,
    };
    let output = base64(hash, format, "the hash is not base64")?;
    pbkdf2_hash(
        format,
        prf,
        number(iterations),
        salt.as_bytes().to_vec(),
        output,
    )
}

/// Django's `scrypt$N$salt$r$p$base64`.
fn parse_django_scrypt(input: &str) -> Result<ForeignHash, FormatError> {
    let format = Format::Django;
    let fields: Vec<&str> = input.split('$').collect();
    let [_, n, salt, r, p, hash] = fields.as_slice() else {
        return Err(malformed(format, "a Django scrypt hash has 6 fields"));
    };
    let log_n = scrypt_log_n(number(n), format)?;
    let output = base64(hash, format, "the hash is not base64")?;
    scrypt_hash(
        format,
        log_n,
        number(r),
        number(p),
        salt.as_bytes().to_vec(),
        output,
    )
}

/// Werkzeug's `pbkdf2:sha256:N$salt$hex` and `scrypt:N:r:p$salt$hex`.
fn parse_werkzeug(input: &str) -> Result<ForeignHash, FormatError> {
    let format = Format::Werkzeug;
    let fields: Vec<&str> = input.split('$').collect();
    let [method, salt, hash] = fields.as_slice() else {
        return Err(malformed(format, "a Werkzeug hash is method$salt$hex"));
    };
    let output = hex::decode(hash).map_err(|_| malformed(format, "the hash is not hex"))?;
    let salt = salt.as_bytes().to_vec();
    let args: Vec<&str> = method.split(':').collect();
    match args.as_slice() {
        ["pbkdf2", function, iterations] => {
            let prf = match *function {
                "sha1" => Prf::Sha1,
                "sha256" => Prf::Sha256,
                "sha512" => Prf::Sha512,
                _ => {
                    return Err(unsupported(
                        format,
                        "PBKDF2 with a hash function other than sha1, sha256, sha512",
                    ));
                }
            };
            pbkdf2_hash(format, prf, number(iterations), salt, output)
        }
        ["scrypt", n, r, p] => {
            let log_n = scrypt_log_n(number(n), format)?;
            scrypt_hash(format, log_n, number(r), number(p), salt, output)
        }
        ["pbkdf2", ..] | ["scrypt", ..] => Err(malformed(
            format,
            "the method does not give all its parameters (pbkdf2:FUNCTION:N, scrypt:N:r:p)",
        )),
        _ => Err(FormatError::Unrecognized),
    }
}

/// The structured form: a JSON object of the six fields, and no other.
fn parse_structured(value: &serde_json::Value) -> Result<ForeignHash, FormatError> {
    let format = Format::Structured;
    let object = value
        .as_object()
        .ok_or_else(|| malformed(format, "not a JSON object"))?;
    const FIELDS: [&str; 6] = [
        "algorithm",
        "iterations",
        "salt",
        "salt_encoding",
        "hash",
        "hash_encoding",
    ];
    if object.keys().any(|k| !FIELDS.contains(&k.as_str())) {
        return Err(malformed(
            format,
            "a field other than algorithm, iterations, salt, salt_encoding, hash, hash_encoding",
        ));
    }
    let text = |key: &str, reason: &'static str| {
        object
            .get(key)
            .and_then(|v| v.as_str())
            .ok_or_else(|| malformed(format, reason))
    };
    let prf = match text("algorithm", "algorithm is missing or not a string")? {
        "pbkdf2-sha256" => Prf::Sha256,
        "pbkdf2-sha512" => Prf::Sha512,
        "pbkdf2-sha1" => Prf::Sha1,
        _ => {
            return Err(unsupported(
                format,
                "algorithm is not pbkdf2-sha256, pbkdf2-sha512 or pbkdf2-sha1",
            ));
        }
    };
    let iterations = object
        .get("iterations")
        .and_then(|v| v.as_u64())
        .and_then(|i| u32::try_from(i).ok());
    let salt = text("salt", "salt is missing or not a string")?;
    let salt = match text("salt_encoding", "salt_encoding is missing or not a string")? {
        "utf8" => salt.as_bytes().to_vec(),
        "hex" => hex::decode(salt).map_err(|_| malformed(format, "the salt is not hex"))?,
        "base64" => base64(salt, format, "the salt is not base64")?,
        _ => {
            return Err(malformed(
                format,
                "salt_encoding is not utf8, hex or base64",
            ));
        }
    };
    let hash = text("hash", "hash is missing or not a string")?;
    let output = match text("hash_encoding", "hash_encoding is missing or not a string")? {
        "hex" => hex::decode(hash).map_err(|_| malformed(format, "the hash is not hex"))?,
        "base64" => base64(hash, format, "the hash is not base64")?,
        _ => return Err(malformed(format, "hash_encoding is not hex or base64")),
    };
    pbkdf2_hash(format, prf, iterations, salt, output)
}

#[cfg(test)]
mod tests {
    use super::super::testing::fixtures;
    use super::*;
    use serde_json::{Value, json};

    fn field<'a>(record: &'a Value, key: &str) -> &'a str {
        record[key]
            .as_str()
            .unwrap_or_else(|| panic!("{record}: no {key}"))
    }

    fn parse_record(record: &Value, caps: &Caps) -> Result<ForeignHash, FormatError> {
        match &record["hash"] {
            Value::String(hash) => ForeignHash::parse_with(hash, caps),
            object => ForeignHash::from_json(object, caps),
        }
    }

    /// The salt and hash of a record: the text an error must never quote.
    fn secrets(record: &Value) -> Vec<String> {
        match &record["hash"] {
            Value::String(hash) => hash
                .split('$')
                .skip(1)
                .filter(|s| {
                    s.len() >= 8
                        && !s.contains(['=', ',', ':', '_', '-'])
                        && !s.starts_with("argon2")
                        && !s.bytes().all(|b| b.is_ascii_digit())
                })
                .map(str::to_owned)
                .collect(),
            object => vec![field(object, "salt").into(), field(object, "hash").into()],
        }
    }

    /// Whether `text` quotes 8 characters in a row of any of `secrets`.
    fn quotes(text: &str, secrets: &[String]) -> bool {
        secrets.iter().any(|secret| {
            let chars: Vec<char> = secret.chars().collect();
            chars
                .windows(8)
                .any(|w| text.contains(&w.iter().collect::<String>()))
        })
    }

    fn expected_format(name: &str) -> Format {
        match name.split('-').next().unwrap() {
            "phc" => Format::Phc,
            "bcrypt" => Format::Bcrypt,
            "django" => Format::Django,
            "werkzeug" => Format::Werkzeug,
            "passlib" => Format::Passlib,
            "structured" => Format::Structured,
            other => panic!("a fixture of an unknown format: {other}"),
        }
    }

    #[test]
    fn every_fixture_verifies_with_its_password_and_never_with_the_wrong_one() {
        let records = fixtures();
        let mut formats = std::collections::BTreeSet::new();
        for record in &records {
            let name = field(record, "format");
            let hash =
                parse_record(record, &Caps::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(hash.format(), expected_format(name), "{name}");
            let (password, wrong) = (field(record, "password"), field(record, "wrong"));
            assert!(hash.verify(password.as_bytes()), "{name}: {password:?}");
            assert!(!hash.verify(wrong.as_bytes()), "{name}: {wrong:?}");
            assert!(!hash.verify(b""), "{name}");
            formats.insert(name);
        }
        for name in [
            "phc-pbkdf2-sha256",
            "phc-pbkdf2-sha512",
            "phc-argon2id",
            "phc-argon2id-lanes",
            "phc-argon2i",
            "phc-argon2d",
            "phc-scrypt",
            "bcrypt-2a",
            "bcrypt-2b",
            "bcrypt-2y",
            "django-pbkdf2-sha256",
            "django-pbkdf2-sha1",
            "django-argon2id",
            "django-bcrypt-sha256",
            "django-bcrypt",
            "django-scrypt",
            "werkzeug-pbkdf2-sha256",
            "werkzeug-pbkdf2-sha512",
            "werkzeug-scrypt",
            "passlib-pbkdf2-sha256",
            "passlib-pbkdf2-sha512",
            "passlib-pbkdf2-sha1",
            "structured-report-service",
            "structured-pbkdf2-sha256-utf8-hex",
            "structured-pbkdf2-sha512-hex-base64",
            "structured-pbkdf2-sha1-hex-base64",
        ] {
            assert!(formats.contains(name), "no fixture of {name}");
        }
    }

    #[test]
    fn the_schemes_carry_the_parameters_of_the_fixtures() {
        let records = fixtures();
        let scheme = |name: &str| {
            let record = records.iter().find(|r| field(r, "format") == name).unwrap();
            parse_record(record, &Caps::default()).unwrap().scheme()
        };
        assert_eq!(
            scheme("phc-argon2id-lanes"),
            Scheme::Argon2 {
                variant: Argon2Variant::Argon2id,
                version: 0x13,
                memory_kib: 1024,
                time: 1,
                lanes: 4
            }
        );
        assert_eq!(
            scheme("django-bcrypt-sha256"),
            Scheme::Bcrypt {
                cost: 4,
                sha256_prehash: true
            }
        );
        assert_eq!(
            scheme("werkzeug-scrypt"),
            Scheme::Scrypt {
                log_n: 10,
                r: 8,
                p: 1
            }
        );
        assert_eq!(
            scheme("passlib-pbkdf2-sha1"),
            Scheme::Pbkdf2 {
                prf: Prf::Sha1,
                iterations: 1000
            }
        );
        assert_eq!(
            scheme("structured-report-service"),
            Scheme::Pbkdf2 {
                prf: Prf::Sha256,
                iterations: 10_000
            }
        );
    }

    /// bench/report-service's `pbkdf2_sha256$N$base64salt$base64hash` reads as a
    /// Django hash, whose salt is text: it is not one, and does not verify as one.
    /// Its structured form (the salt base64-decoded) does.
    #[test]
    fn the_report_service_format_is_the_structured_form_not_djangos() {
        let records = fixtures();
        let record = (records.iter())
            .find(|r| field(r, "format") == "structured-report-service")
            .unwrap();
        let password = field(record, "password").as_bytes();
        let as_django = ForeignHash::parse(field(record, "stored")).unwrap();
        assert_eq!(as_django.format(), Format::Django);
        assert!(!as_django.verify(password));
        assert!(
            parse_record(record, &Caps::default())
                .unwrap()
                .verify(password)
        );
    }

    #[test]
    fn a_password_is_verified_as_sent_never_normalized() {
        for record in fixtures() {
            let password = field(&record, "password");
            if !password.contains('\u{301}') {
                continue;
            }
            let hash = parse_record(&record, &Caps::default()).unwrap();
            assert!(hash.verify(password.as_bytes()));
            let nfc: String = unicode_normalization::UnicodeNormalization::nfkc(password).collect();
            assert_ne!(nfc, password);
            assert!(!hash.verify(nfc.as_bytes()), "{}", field(&record, "format"));
        }
    }

    /// Caps low enough that every fixture is over one of them.
    const TIGHT: Caps = Caps {
        bcrypt_cost: 3,
        scrypt_memory: 1023 * 8,
        scrypt_parallelism: 1,
        argon2_memory_kib: 1023,
        argon2_time: 1,
        argon2_lanes: 1,
        pbkdf2_iterations: 999,
    };

    #[test]
    fn over_cap_parameters_are_refused_with_a_reason_that_quotes_no_secret() {
        for record in fixtures() {
            let name = field(&record, "format");
            let error = parse_record(&record, &TIGHT).unwrap_err();
            let FormatError::OverCap { value, cap, .. } = error else {
                panic!("{name}: {error:?}");
            };
            assert!(value > cap, "{name}");
            let reason = error.to_string();
            assert!(reason.contains(" is over the cap of "), "{reason}");
            assert!(!quotes(&reason, &secrets(&record)), "{name}: {reason}");
        }
        let salt = "c2FsdHNhbHRzYWx0c2FsdA";
        let hash = "aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g";
        for (stored, reason) in [
            (
                "$2b$15$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW".to_owned(),
                "bcrypt hash: bcrypt cost 15 is over the cap of 14",
            ),
            (
                format!("$argon2id$v=19$m=262144,t=1,p=1${salt}${hash}"),
                "PHC hash: Argon2 memory (KiB) 262144 is over the cap of 131072",
            ),
            (
                format!("$argon2id$v=19$m=65536,t=11,p=1${salt}${hash}"),
                "PHC hash: Argon2 time 11 is over the cap of 10",
            ),
            (
                format!("$argon2id$v=19$m=65536,t=1,p=17${salt}${hash}"),
                "PHC hash: Argon2 lanes 17 is over the cap of 16",
            ),
            (
                format!("$scrypt$ln=21,r=8,p=1${salt}${hash}"),
                "PHC hash: scrypt N·r 16777216 is over the cap of 1048576",
            ),
            (
                format!("$scrypt$ln=40,r=8,p=1${salt}${hash}"),
                "PHC hash: scrypt N·r 8796093022208 is over the cap of 1048576",
            ),
            (
                format!("$scrypt$ln=14,r=8,p=17${salt}${hash}"),
                "PHC hash: scrypt p 17 is over the cap of 16",
            ),
            (
                format!("$pbkdf2-sha256$i=4294967295,l=32${salt}${hash}"),
                "PHC hash: PBKDF2 iterations (times output blocks) 4294967295 is over the cap of 2000000",
            ),
            (
                format!("pbkdf2:sha256:2000001$saltsalt${}", "ab".repeat(32)),
                "Werkzeug hash: PBKDF2 iterations (times output blocks) 2000001 is over the cap of 2000000",
            ),
            (
                // SHA-1 with a 64-byte output: four blocks, each the iterations again.
                json!({"algorithm": "pbkdf2-sha1", "iterations": 600000, "salt": "saltsalt",
                       "salt_encoding": "utf8", "hash": "ab".repeat(64), "hash_encoding": "hex"})
                .to_string(),
                "structured hash: PBKDF2 iterations (times output blocks) 2400000 is over the cap of 2000000",
            ),
        ] {
            let error = ForeignHash::parse(&stored).unwrap_err();
            assert_eq!(error.to_string(), reason);
            assert!(!quotes(reason, &[salt.into(), hash.into()]));
        }
    }

    /// What current versions of the systems write at their own defaults passes the
    /// default caps (the parameters; the salt and hash are stand-ins).
    #[test]
    fn the_default_caps_admit_the_systems_defaults() {
        let salt = "c2FsdHNhbHRzYWx0c2FsdA";
        let hash = "aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g";
        let b64_64 = "aGFzaA".repeat(16);
        for stored in [
            // Django 5.2's PBKDF2, Argon2 and scrypt.
            "pbkdf2_sha256$1000000$salt$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g=".into(),
            format!("argon2$argon2id$v=19$m=102400,t=2,p=8${salt}${hash}"),
            format!("scrypt$16384$salt$8$5${b64_64}"),
            // Werkzeug 3.1's PBKDF2 and scrypt.
            format!("pbkdf2:sha256:1000000$salt${}", "ab".repeat(32)),
            format!("scrypt:32768:8:1$salt${}", "ab".repeat(64)),
            // argon2-cffi's default, passlib's scrypt, OWASP's PBKDF2-SHA1 and Keycloak's SHA-512.
            format!("$argon2id$v=19$m=65536,t=3,p=4${salt}${hash}"),
            format!("$scrypt$ln=16,r=8,p=1${salt}${hash}"),
            format!("$pbkdf2$1300000${salt}${}", "aGFzaGhhc2hoYXNoaGFzaGhhc2g"),
            format!("$pbkdf2-sha512$i=210000,l=32${salt}${hash}"),
            // bcrypt at a common cost.
            "$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW".into(),
        ] {
            let parsed = ForeignHash::parse(&stored);
            assert!(parsed.is_ok(), "{stored}: {parsed:?}");
        }
    }

    #[test]
    fn malformed_inputs_are_refused_with_a_reason() {
        let salt = "c2FsdHNhbHRzYWx0c2FsdA";
        let hash = "aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g";
        let bcrypt_rest = "R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW";
        let hex64 = "ab".repeat(32);
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "not a password hash format authd can verify"),
            (
                "password".into(),
                "not a password hash format authd can verify",
            ),
            ("$".into(), "not a password hash format authd can verify"),
            (
                "$md5$abc".into(),
                "not a password hash format authd can verify",
            ),
            ("[1]".into(), "not a password hash format authd can verify"),
            ("x".repeat(5000), "stored hash: longer than 4096 bytes"),
            // bcrypt
            (
                "$2b$".into(),
                "bcrypt hash: a bcrypt hash is 60 ASCII characters",
            ),
            (
                format!("$2x$04${bcrypt_rest}"),
                "bcrypt hash: bcrypt $2x$ (the buggy variant) is not supported",
            ),
            (
                format!("$2c$04${bcrypt_rest}"),
                "bcrypt hash: not a bcrypt version ($2a$, $2b$, $2y$)",
            ),
            (
                format!("$2b$03${bcrypt_rest}"),
                "bcrypt hash: bcrypt's cost is not a number from 04 to 31",
            ),
            (
                format!("$2b$32${bcrypt_rest}"),
                "bcrypt hash: bcrypt's cost is not a number from 04 to 31",
            ),
            (
                format!("$2b$+4${bcrypt_rest}"),
                "bcrypt hash: bcrypt's cost is not a number from 04 to 31",
            ),
            (
                format!("$2b$04${}", &bcrypt_rest.replace('/', "+")),
                "bcrypt hash: the salt or hash is not bcrypt's base64",
            ),
            (
                format!("$2b$04$é{}", &bcrypt_rest[2..]),
                "bcrypt hash: a bcrypt hash is 60 ASCII characters",
            ),
            (
                format!("$2b$04x{bcrypt_rest}"),
                "bcrypt hash: a bcrypt hash is $2b$NN$ then 53 characters",
            ),
            // Argon2
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1$c2FsdA${hash}"),
                "PHC hash: an Argon2 salt is at least 8 bytes",
            ),
            (
                format!("$argon2id$v=18$m=1024,t=1,p=1${salt}${hash}"),
                "PHC hash: Argon2's version is not 16 or 19",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1,keyid=YWJj${salt}${hash}"),
                "PHC hash: a parameter this format does not know",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1${salt}${hash}"),
                "PHC hash: Argon2's m, t and p are not all numbers",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1,p=1${salt}${hash}"),
                "PHC hash: a parameter is given twice",
            ),
            (
                format!("$argon2id$v=19$m=1024,t,p=1${salt}${hash}"),
                "PHC hash: a parameter is not key=value",
            ),
            (
                format!("$argon2id$v=19$m=8,t=1,p=2${salt}${hash}"),
                "PHC hash: Argon2's parameters are out of range",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=0,p=1${salt}${hash}"),
                "PHC hash: Argon2's parameters are out of range",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1${salt}$!!"),
                "PHC hash: the hash is not base64",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1${salt}$aGFzaA"),
                "PHC hash: the hash is shorter than 16 bytes",
            ),
            (
                format!("$argon2id$v=19$m=1024,t=1,p=1${salt}"),
                "PHC hash: an Argon2 PHC string has 4 or 5 fields",
            ),
            (
                "argon2$".into(),
                "Django hash: an Argon2 PHC string has 4 or 5 fields",
            ),
            // scrypt
            (
                format!("$scrypt$ln=0,r=8,p=1${salt}${hash}"),
                "PHC hash: scrypt's ln is not a number from 1 to 63",
            ),
            (
                format!("$scrypt$ln=64,r=8,p=1${salt}${hash}"),
                "PHC hash: scrypt's ln is not a number from 1 to 63",
            ),
            (
                format!("$scrypt$ln=10,r=0,p=1${salt}${hash}"),
                "PHC hash: scrypt's parameters are out of range",
            ),
            (
                format!("$scrypt$ln=10,r=8${salt}${hash}"),
                "PHC hash: scrypt's r or p is not a number",
            ),
            (
                format!("scrypt$1000$salt$8$1${hash}"),
                "Django hash: scrypt's N is not a power of two above 1",
            ),
            (
                format!("scrypt$1024$salt$8${hash}"),
                "Django hash: a Django scrypt hash has 6 fields",
            ),
            // PBKDF2
            (
                format!("$pbkdf2-sha256$i=0,l=32${salt}${hash}"),
                "PHC hash: the iteration count is not a positive number",
            ),
            (
                format!("$pbkdf2-sha256$i=1000,l=31${salt}${hash}"),
                "PHC hash: l is not the hash's length",
            ),
            (
                format!("$pbkdf2-sha256$l=32${salt}${hash}"),
                "PHC hash: the iteration count is not a positive number",
            ),
            (
                format!("$pbkdf2-sha256$1000$a+b${hash}"),
                "passlib hash: the salt is not passlib's base64",
            ),
            (
                format!("$pbkdf2-sha256$${salt}${hash}"),
                "passlib hash: the iteration count is not a positive number",
            ),
            (
                format!("$pbkdf2-sha256$1000${salt}"),
                "passlib hash: a passlib PBKDF2 hash has 4 fields",
            ),
            (
                "pbkdf2_sha256$abc$salt$aGFzaGhhc2hoYXNoaGFzaA==".into(),
                "Django hash: the iteration count is not a positive number",
            ),
            (
                "pbkdf2_sha256$1000$salt$!!!".into(),
                "Django hash: the hash is not base64",
            ),
            (
                "pbkdf2_sha256$1000$salt$c2hvcnQ=".into(),
                "Django hash: the hash is shorter than 16 bytes",
            ),
            (
                format!("pbkdf2_sha256$1000$salt${}", "aGFzaA".repeat(40)),
                "Django hash: the hash is longer than 128 bytes",
            ),
            (
                "pbkdf2_sha1$1000$salt".into(),
                "Django hash: a Django PBKDF2 hash has 4 fields",
            ),
            // Werkzeug
            (
                format!("pbkdf2:sha256$salt${hex64}"),
                "Werkzeug hash: the method does not give all its parameters (pbkdf2:FUNCTION:N, scrypt:N:r:p)",
            ),
            (
                format!("scrypt$salt${hex64}"),
                "Django hash: a Django scrypt hash has 6 fields",
            ),
            (
                format!("scrypt:$salt${hex64}"),
                "Werkzeug hash: the method does not give all its parameters (pbkdf2:FUNCTION:N, scrypt:N:r:p)",
            ),
            (
                format!("pbkdf2:md5:1000$salt${hex64}"),
                "Werkzeug hash: PBKDF2 with a hash function other than sha1, sha256, sha512",
            ),
            (
                format!("pbkdf2:sha256:-1$salt${hex64}"),
                "Werkzeug hash: the iteration count is not a positive number",
            ),
            (
                format!("scrypt:1000:8:1$salt${hex64}"),
                "Werkzeug hash: scrypt's N is not a power of two above 1",
            ),
            (
                "scrypt:1024:8:1$salt$zz".into(),
                "Werkzeug hash: the hash is not hex",
            ),
            (
                format!("pbkdf2:sha256:1000$salt${hex64}$x"),
                "Werkzeug hash: a Werkzeug hash is method$salt$hex",
            ),
            // The structured form
            ("{".into(), "structured hash: not valid JSON"),
            (
                "{}".into(),
                "structured hash: algorithm is missing or not a string",
            ),
        ];
        for (stored, reason) in &cases {
            let error = ForeignHash::parse(stored).unwrap_err();
            assert_eq!(&error.to_string(), reason, "{stored}");
        }
        let good = json!({"algorithm": "pbkdf2-sha256", "iterations": 1000, "salt": "saltsalt",
                          "salt_encoding": "utf8", "hash": hex64, "hash_encoding": "hex"});
        assert!(ForeignHash::from_json(&good, &Caps::default()).is_ok());
        for (key, value, reason) in [
            (
                "algorithm",
                json!("md5"),
                "algorithm is not pbkdf2-sha256, pbkdf2-sha512 or pbkdf2-sha1",
            ),
            (
                "algorithm",
                json!(1),
                "algorithm is missing or not a string",
            ),
            (
                "iterations",
                json!("1000"),
                "the iteration count is not a positive number",
            ),
            (
                "iterations",
                json!(-1),
                "the iteration count is not a positive number",
            ),
            (
                "iterations",
                json!(10.5),
                "the iteration count is not a positive number",
            ),
            (
                "iterations",
                json!(0),
                "the iteration count is not a positive number",
            ),
            (
                "iterations",
                json!(1u64 << 40),
                "the iteration count is not a positive number",
            ),
            ("salt", json!(null), "salt is missing or not a string"),
            (
                "salt_encoding",
                json!("latin1"),
                "salt_encoding is not utf8, hex or base64",
            ),
            ("salt_encoding", json!("hex"), "the salt is not hex"),
            (
                "hash_encoding",
                json!("utf8"),
                "hash_encoding is not hex or base64",
            ),
            ("hash", json!("abc"), "the hash is not hex"),
            ("hash", json!(["ab"]), "hash is missing or not a string"),
            (
                "extra",
                json!(1),
                "a field other than algorithm, iterations, salt, salt_encoding, hash, hash_encoding",
            ),
        ] {
            let mut record = good.clone();
            record[key] = value;
            let error = ForeignHash::from_json(&record, &Caps::default()).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("structured hash: {reason}"),
                "{key}"
            );
        }
    }

    /// Every cut and every one-character change of every fixture, and bytes no
    /// format has: refused or parsed, never a panic; a refusal never quotes the
    /// salt or the hash, nor does a parsed hash's Debug.
    #[test]
    fn no_input_panics_and_no_reason_quotes_the_salt_or_the_hash() {
        let mut refused = 0;
        for record in fixtures() {
            let secrets = secrets(&record);
            // The reasons given for this record's mutations, each checked once below.
            let mut reasons = std::collections::BTreeSet::new();
            let password = field(&record, "password").as_bytes();
            let Value::String(stored) = &record["hash"] else {
                let text = record["hash"].to_string();
                for (at, _) in text.char_indices() {
                    if let Err(e) = ForeignHash::parse(&text[..at]) {
                        refused += 1;
                        reasons.insert(e.to_string());
                    }
                }
                assert!(reasons.iter().all(|r| !quotes(r, &secrets)), "{reasons:?}");
                continue;
            };
            let hash = ForeignHash::parse(stored).unwrap();
            assert!(!quotes(&format!("{hash:?}"), &secrets), "{hash:?}");
            let cuts = stored.char_indices().map(|(at, _)| stored[..at].to_owned());
            let changes = stored.char_indices().flat_map(|(at, c)| {
                ['$', '0', '9', '.', ',', '=', ':', 'é', '\0'].map(|with| {
                    let mut changed = stored.clone();
                    changed.replace_range(at..at + c.len_utf8(), &with.to_string());
                    changed
                })
            });
            for (i, mutated) in cuts.chain(changes).enumerate() {
                match ForeignHash::parse_with(&mutated, &Caps::default()) {
                    Err(e) => {
                        refused += 1;
                        reasons.insert(e.to_string());
                    }
                    // Verifying runs the crates on what parsing let through: a sample.
                    Ok(hash) if i % 31 == 0 => {
                        let _ = hash.verify(password);
                    }
                    Ok(_) => {}
                }
            }
            assert!(reasons.iter().all(|r| !quotes(r, &secrets)), "{reasons:?}");
        }
        assert!(refused > 1000, "{refused}");
        // The check itself finds a quote when there is one.
        assert!(quotes("the salt c2FsdHNh", &["c2FsdHNhbHRz".into()]));
        for bytes in [&b"\xff\xfe"[..], b"\0\0\0", b"$2b$\x80", b"{\"a\":"] {
            let text = String::from_utf8_lossy(bytes);
            assert!(ForeignHash::parse(&text).is_err());
        }
    }
}
