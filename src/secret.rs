//! Secret-bearing settings: the URLs that carry a password (the database's, Redis's)
//! and the clap value parser that reads every secret-bearing option.
//!
//! [`SecretUrl`] keeps a URL whole for the client library that connects with it and
//! prints it, in `Display` and `Debug` alike, with its secrets replaced by `***`: the
//! password of the userinfo, and every query parameter whose name speaks of a secret
//! (`?password=`, `sslpassword`, Redis's `pass`), its name percent-decoded first as
//! the libraries decode it. The URL as given is reached only through
//! [`SecretUrl::expose`], which the code that connects calls and nothing else.
//!
//! [`AdminKey`] is the key `authd admin` presents to the admin API: printed as
//! `***`, reached through [`AdminKey::expose`] by the code that sends it only.
//!
//! [`parser`] is the value parser of `--database-url`, `--redis-url`,
//! `--token-keys` and `--account-digest-key`: clap's own error ("invalid value 'postgres://u:s3cret@…'") quotes
//! the value, this one never does. The `FromStr` errors it relays must not quote it
//! either. This module must not log, and must not read files (config does).

use std::{ffi::OsStr, fmt, marker::PhantomData, str::FromStr};

/// Query parameter names (lowercased, percent-decoded) that hold a secret when they
/// contain one of these.
const SECRET_PARAMETERS: [&str; 4] = ["pass", "pwd", "secret", "token"];

/// A URL that may hold a password, printed with every secret replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    url: String,
    /// A userinfo without `:` is the password rather than a user name (`redis://PASSWORD@host`).
    bare_userinfo_is_secret: bool,
}

impl SecretUrl {
    /// A URL whose userinfo is `user[:password]`: the user is shown, the password hidden.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            bare_userinfo_is_secret: false,
        }
    }

    /// A URL whose userinfo without `:` is a password too, and is hidden whole.
    pub fn with_bare_userinfo_secret(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            bare_userinfo_is_secret: true,
        }
    }

    /// The URL as given, secrets included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// Whether the URL holds anything that printing it would hide.
    pub fn has_secret(&self) -> bool {
        self.redacted().1
    }

    /// The URL as printed, and whether anything was hidden.
    fn redacted(&self) -> (String, bool) {
        let mut hidden = false;
        let url = self.url.as_str();
        // Nothing after `#` reaches a server, and nothing there is worth showing.
        let (url, fragment) = match url.split_once('#') {
            Some((url, _)) => (url, "#***"),
            None => (url, ""),
        };
        let (scheme, rest) = match url.split_once("://") {
            Some((scheme, rest)) => (format!("{scheme}://"), rest),
            None => (String::new(), url),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => {
                    hidden = true;
                    format!("{user}:***@{host}")
                }
                None if self.bare_userinfo_is_secret => {
                    hidden = true;
                    format!("***@{host}")
                }
                None => authority.to_owned(),
            },
            None => authority.to_owned(),
        };
        let mut out = format!("{scheme}{authority}{path}");
        if let Some(query) = query {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret_parameter(name) => {
                        hidden = true;
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            out.push('?');
            out.push_str(&pairs.join("&"));
        }
        if !fragment.is_empty() {
            hidden = true;
        }
        out.push_str(fragment);
        (out, hidden)
    }
}

/// Whether a query parameter's name (as written in the URL) names a secret.
pub(crate) fn is_secret_parameter(name: &str) -> bool {
    // Decoded as the URL libraries decode it: `%70assword` is `password` to sqlx.
    let decoded = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    SECRET_PARAMETERS.iter().any(|s| decoded.contains(s))
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted().0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted().0)
    }
}

/// A Redis URL, checked at parse time: one server (`redis://[user:password@]host:port[/db]`,
/// `rediss://`, `redis+unix://`, as the Redis client reads them), a Redis Cluster
/// (`redis+cluster://[user:password@]host:port,host:port,…`: any of its nodes, the
/// rest found through them) or a master watched by Sentinel
/// (`redis+sentinel://[user:password@]host:port,host:port,…/MASTERNAME[/db]`: the
/// sentinels, the master's name; the password is the master's, the sentinels are
/// asked without one). A userinfo without `:` counts as a password: Redis has
/// passwords more often than user names.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(SecretUrl);

impl RedisUrl {
    /// The URL with its password, for connecting only.
    pub(crate) fn expose(&self) -> &str {
        self.0.expose()
    }

    pub fn has_secret(&self) -> bool {
        self.0.has_secret()
    }
}

impl FromStr for RedisUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        redis_target(url)?;
        Ok(RedisUrl(SecretUrl::with_bare_userinfo_secret(url)))
    }
}

impl RedisUrl {
    /// What the URL names, each server's URL with the password (for connecting only).
    pub(crate) fn target(&self) -> RedisTarget {
        redis_target(self.expose()).expect("checked when parsed")
    }
}

/// What a [`RedisUrl`] names: the URLs the Redis client connects to (passwords
/// included: for connecting only, never printed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisTarget {
    /// One server.
    Single(String),
    /// A Redis Cluster: the nodes to learn its topology from (`redis://` URLs).
    Cluster(Vec<String>),
    /// A master found through Sentinel: the sentinels (`redis://host:port`), the
    /// master's name, and a URL (`redis://[userinfo@]sentinel-master/db`) whose
    /// userinfo and database are the master's.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        settings: String,
    },
}

/// Reads a Redis URL of one of the three forms; the error never quotes it.
fn redis_target(url: &str) -> Result<RedisTarget, String> {
    // The error's kind only: its text may quote the URL, secret included.
    let check = |url: &str| {
        ::redis::Client::open(url)
            .map(|_| ())
            .map_err(|e| format!("not a usable Redis URL ({:?})", e.kind()))
    };
    let (cluster, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        (false, rest)
    } else if url.starts_with("rediss+cluster://") || url.starts_with("rediss+sentinel://") {
        return Err(
            "TLS to a Redis Cluster or Sentinel is not supported (this build \
                    has no Redis TLS)"
                .into(),
        );
    } else {
        check(url)?;
        return Ok(RedisTarget::Single(url.to_owned()));
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() {
        return Err("names no host (host:port,host:port,…)".into());
    }
    if cluster {
        if !path.is_empty() && path != "/" {
            return Err("a Redis Cluster has no database number: drop the path".into());
        }
        let nodes: Vec<String> = (hosts.iter())
            .map(|h| format!("redis://{userinfo}{h}"))
            .collect();
        nodes.iter().try_for_each(|n| check(n))?;
        return Ok(RedisTarget::Cluster(nodes));
    }
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let master = parts.next().unwrap_or_default();
    if master.is_empty() {
        return Err("names no master (…/MASTERNAME)".into());
    }
    let db = parts.next().unwrap_or_default();
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err("the database after the master's name is not a number".into());
    }
    let sentinels: Vec<String> = hosts.iter().map(|h| format!("redis://{h}")).collect();
    sentinels.iter().try_for_each(|n| check(n))?;
    let settings = format!("redis://{userinfo}sentinel-master/{db}");
    check(&settings)?;
    Ok(RedisTarget::Sentinel {
        sentinels,
        master: master.to_owned(),
        settings,
    })
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", self.0)
    }
}

/// The key of the keyed digest that names an account in the login throttle's keys
/// and in audit events (`--account-digest-key`): at least 32 bytes, given in
/// base64. Never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct DigestKey(Vec<u8>);

/// The fewest bytes an account digest key may have.
pub const MIN_DIGEST_KEY_BYTES: usize = 32;

impl DigestKey {
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl FromStr for DigestKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| "not valid base64".to_owned())?;
        if bytes.len() < MIN_DIGEST_KEY_BYTES {
            return Err(format!(
                "must be at least {MIN_DIGEST_KEY_BYTES} bytes (got {}); \
                 e.g. `head -c 32 /dev/urandom | base64`",
                bytes.len()
            ));
        }
        Ok(DigestKey(bytes))
    }
}

impl fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestKey(***)")
    }
}

/// The admin key `authd admin` presents (`authorization: Bearer KEY`), from
/// `--key-file` or `AUTHD_ADMIN_KEY`: surrounding whitespace ignored, and only
/// characters a header carries as they are (visible ASCII). Never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(String);

impl AdminKey {
    /// The key itself: only for the header that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for AdminKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let key = text.trim();
        if key.is_empty() {
            return Err("the admin key is empty".into());
        }
        // The error says what is wrong, never which character: it would quote the key.
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the admin key holds characters other than visible ASCII, \
                        which a header cannot carry"
                .into());
        }
        Ok(AdminKey(key.to_owned()))
    }
}

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminKey(***)")
    }
}

/// The clap value parser of a secret-bearing option: `T::from_str`, with an error
/// that names the option (and its variable) but never quotes the value.
pub fn parser<T>() -> SecretParser<T> {
    SecretParser(PhantomData)
}

/// See [`parser`].
pub struct SecretParser<T>(PhantomData<fn() -> T>);

impl<T> Clone for SecretParser<T> {
    fn clone(&self) -> Self {
        SecretParser(PhantomData)
    }
}

impl<T> clap::builder::TypedValueParser for SecretParser<T>
where
    T: FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let option = match arg {
            Some(arg) => {
                let flag = format!("--{}", arg.get_long().unwrap_or(arg.get_id().as_str()));
                match arg.get_env() {
                    Some(var) => format!("'{flag}' ({})", var.to_string_lossy()),
                    None => format!("'{flag}'"),
                }
            }
            None => "a secret setting".to_owned(),
        };
        let fail = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {option}: {why}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value
            .to_str()
            .ok_or_else(|| fail("not valid UTF-8".into()))?;
        text.parse().map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_key_is_trimmed_checked_and_never_shown() {
        let key: AdminKey = "  k3y-0123456789abcdef\n".parse().unwrap();
        assert_eq!(key.expose(), "k3y-0123456789abcdef");
        assert_eq!(format!("{key:?}"), "AdminKey(***)");
        assert!(" \n".parse::<AdminKey>().unwrap_err().contains("empty"));
        for bad in ["k3y with a space", "k3y\u{e9}"] {
            let why = bad.parse::<AdminKey>().unwrap_err();
            assert!(!why.contains("k3y"), "{why}");
        }
    }

    #[test]
    fn passwords_in_the_userinfo_and_the_query_are_hidden() {
        for (url, shown) in [
            (
                "postgres://authd:s3cret@db:5432/authd?sslmode=require",
                "postgres://authd:***@db:5432/authd?sslmode=require",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/test?password=s3cret&sslmode=disable",
                "postgres://postgres@127.0.0.1:5432/test?password=***&sslmode=disable",
            ),
            (
                "postgres://u@h/db?sslpassword=s3cret&PassWord=s3cret",
                "postgres://u@h/db?sslpassword=***&PassWord=***",
            ),
            // Percent-encoded names are what the libraries decode them to.
            (
                "postgres://u@h/db?%70assword=s3cret",
                "postgres://u@h/db?%70assword=***",
            ),
            // A password holding `@`: the host is after the last one.
            ("postgres://u:s3c@ret@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db#s3cret", "postgres://u@h/db#***"),
        ] {
            let secret = SecretUrl::new(url);
            assert_eq!(secret.to_string(), shown, "{url}");
            assert!(!format!("{secret:?}").contains("s3c"), "{url}");
            assert!(secret.has_secret(), "{url}");
            assert_eq!(secret.expose(), url);
        }
        for plain in [
            "postgres://authd@db/authd",
            "postgres://db/authd?sslmode=require&options[search_path]=x",
        ] {
            let url = SecretUrl::new(plain);
            assert_eq!(url.to_string(), plain);
            assert!(!url.has_secret(), "{plain}");
        }
    }

    #[test]
    fn redis_urls_never_show_their_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@cache:6379/2", "redis://:***@cache:6379/2"),
            ("redis://authd:s3cret@cache", "redis://authd:***@cache"),
            ("redis://s3cret@cache", "redis://***@cache"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
        ] {
            let parsed: RedisUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(parsed.to_string(), shown);
            assert!(!format!("{parsed:?}").contains("s3cret"));
            assert_eq!(parsed.expose(), url);
        }
        assert!(!"redis://cache".parse::<RedisUrl>().unwrap().has_secret());
        for (url, shown) in [
            (
                "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7000",
                "redis+cluster://:***@10.0.0.1:7000,10.0.0.2:7000",
            ),
            (
                "redis+sentinel://s3cret@10.0.0.1:26379,10.0.0.2:26379/mymaster/2",
                "redis+sentinel://***@10.0.0.1:26379,10.0.0.2:26379/mymaster/2",
            ),
        ] {
            let parsed: RedisUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(parsed.to_string(), shown);
            assert!(!format!("{parsed:?}").contains("s3cret"));
        }
        let err = "http://:s3cret@cache".parse::<RedisUrl>().unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn cluster_and_sentinel_urls_name_their_nodes() {
        let target = |url: &str| url.parse::<RedisUrl>().unwrap().target();
        assert_eq!(
            target("redis://cache:6379/1"),
            RedisTarget::Single("redis://cache:6379/1".into())
        );
        assert_eq!(
            target("redis+cluster://:pw@a:7000,b:7001"),
            RedisTarget::Cluster(vec![
                "redis://:pw@a:7000".into(),
                "redis://:pw@b:7001".into()
            ])
        );
        assert_eq!(
            target("redis+sentinel://:pw@a:26379,b:26380/mymaster/3"),
            RedisTarget::Sentinel {
                sentinels: vec!["redis://a:26379".into(), "redis://b:26380".into()],
                master: "mymaster".into(),
                settings: "redis://:pw@sentinel-master/3".into(),
            }
        );
        assert_eq!(
            target("redis+sentinel://a:26379/mymaster"),
            RedisTarget::Sentinel {
                sentinels: vec!["redis://a:26379".into()],
                master: "mymaster".into(),
                settings: "redis://sentinel-master/".into(),
            }
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://a:1/2",
            "redis+sentinel://a:26379",
            "redis+sentinel://a:26379/m/x",
            "rediss+cluster://:s3cret@a:1",
        ] {
            let why = bad.parse::<RedisUrl>().unwrap_err();
            assert!(!why.contains("s3cret"), "{why}");
        }
    }

    #[test]
    fn the_parser_names_the_option_and_never_quotes_the_value() {
        #[derive(Clone, Debug)]
        struct Picky;
        impl FromStr for Picky {
            type Err = String;
            fn from_str(_: &str) -> Result<Self, String> {
                Err("not picky enough".into())
            }
        }
        let cmd = clap::Command::new("authd").arg(
            clap::Arg::new("thing")
                .long("thing")
                .env("AUTHD_TEST_SECRET_PARSER_THING")
                .value_parser(parser::<Picky>()),
        );
        let err = cmd
            .try_get_matches_from(["authd", "--thing", "s3cret"])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "error: invalid value for '--thing' (AUTHD_TEST_SECRET_PARSER_THING): not picky enough"
            ),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
}
