//! The command line of `authd admin`, the admin API's client (docs/admin.md): its
//! subcommands, the options of its connection, and the admin key it presents.
//!
//! The key is read from `--key-file` or `AUTHD_ADMIN_KEY` ([`AdminConnection::key`]),
//! never from an argument: every local user can read a command line (`ps`). No
//! option here has an `AUTHD_*` variable of its own: these are a client's options,
//! not the server's, and `AUTHD_ADMIN_LISTEN` (the server's) gives the default
//! address.
//!
//! Its options take the display orders below the first of authd's own (5), so that
//! each subcommand's `--help` lists them before the server options it also accepts:
//! a subcommand's own options first (0), then the connection's (1 to 3).

use super::parse::positive_duration;
use crate::secret::AdminKey;
use clap::{Args, Subcommand};
use std::{ffi::OsString, path::PathBuf, time::Duration};

/// The exit statuses of every `authd admin` command, shown by each one's `--help`.
const EXIT_STATUS: &str = "\
Exit status: 0 done; 1 the server refused the call (one line on stderr names its gRPC code and \
message: UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, INVALID_ARGUMENT, ...); 2 a usage error \
(a bad option, no admin key, a file that cannot be read, delete without --yes); 3 no answer \
(cannot connect, the connection failed, the timeout passed, or UNAVAILABLE): trying again later \
may help.";

/// The exit statuses of `authd admin users import`.
const IMPORT_EXIT_STATUS: &str = "\
Exit status: 0 every line imported, unchanged or skipped; 1 a line was refused (each printed \
with its number and reason), or the server refused the call or stopped it on a conflict \
(--on-conflict fail); 2 a usage error (no admin key, a file that cannot be read); 3 no answer \
(cannot connect, the connection failed, or UNAVAILABLE).";

/// `--on-conflict`: what to do when a different user has a record's name or id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnConflictArg {
    Fail,
    Skip,
}

/// The variable holding the admin key when `--key-file` is not given.
const ADMIN_KEY_VAR: &str = "AUTHD_ADMIN_KEY";

/// `authd admin`: the connection, and what to do.
#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS)]
pub struct AdminCommand {
    #[command(flatten)]
    pub connection: AdminConnection,
    #[command(subcommand)]
    pub action: AdminAction,
}

/// Where the admin API answers, how to reach it, how to print its answers.
#[derive(Debug, Clone, Args)]
pub struct AdminConnection {
    /// The admin port, HOST:PORT (https://HOST:PORT for TLS) [default: loopback on the
    /// port of AUTHD_ADMIN_LISTEN (--admin-listen)].
    #[arg(long, global = true, display_order = 1)]
    pub addr: Option<String>,
    /// File holding the admin key (surrounding whitespace ignored) [default: the
    /// environment variable AUTHD_ADMIN_KEY]. The key itself is never an argument.
    #[arg(long, value_name = "PATH", global = true, display_order = 1)]
    pub key_file: Option<PathBuf>,
    /// Longest connecting may take, and then each call.
    #[arg(long, default_value = "10s", value_parser = positive_duration, global = true,
          display_order = 2)]
    pub timeout: Duration,
    /// Print the answer as one JSON document (fields named as in admin.proto, times in
    /// RFC 3339) instead of text for people.
    #[arg(long, global = true, display_order = 2)]
    pub json: bool,
    /// Speak TLS, trusting the CAs of this PEM bundle (the admin port serves TLS with
    /// AUTHD_TLS_CERT) [default with an https:// address: the Mozilla roots].
    #[arg(
        long = "tls-ca",
        id = "admin_tls_ca",
        value_name = "PEM",
        global = true,
        display_order = 3
    )]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate to present to a server with mutual TLS (AUTHD_TLS_CLIENT_CA).
    #[arg(
        long = "tls-cert",
        id = "admin_tls_cert",
        value_name = "PEM",
        requires = "admin_tls_key",
        global = true,
        display_order = 3
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long = "tls-key",
        id = "admin_tls_key",
        value_name = "PEM",
        requires = "admin_tls_cert",
        global = true,
        display_order = 3
    )]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry [default: the host of --addr].
    #[arg(
        long = "tls-server-name",
        id = "admin_tls_server_name",
        value_name = "NAME",
        global = true,
        display_order = 3
    )]
    pub tls_server_name: Option<String>,
}

impl AdminConnection {
    /// The admin key: the file of `--key-file` when given, else `AUTHD_ADMIN_KEY`.
    /// An error names where the key was looked for, never the key.
    pub fn key(&self) -> Result<AdminKey, String> {
        self.key_from(std::env::var_os(ADMIN_KEY_VAR))
    }

    /// [`key`](Self::key), with the variable's value given.
    fn key_from(&self, var: Option<OsString>) -> Result<AdminKey, String> {
        if let Some(path) = &self.key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--key-file {}: cannot read the file: {e}", path.display()))?;
            return (text.parse()).map_err(|why| format!("--key-file {}: {why}", path.display()));
        }
        match var {
            None => Err(format!(
                "no admin key: set {ADMIN_KEY_VAR} or give --key-file PATH \
                 (never the key itself on the command line)"
            )),
            Some(value) => value
                .to_str()
                .ok_or_else(|| "not valid UTF-8".to_owned())
                .and_then(str::parse)
                .map_err(|why| format!("{ADMIN_KEY_VAR}: {why}")),
        }
    }
}

/// What `authd admin` does.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminAction {
    /// List, show, disable, enable and delete accounts.
    #[command(subcommand, after_help = EXIT_STATUS)]
    Users(UsersAction),
    /// List and end a user's sessions.
    #[command(subcommand, after_help = EXIT_STATUS)]
    Sessions(SessionsAction),
    /// Create, list, show, disable and delete service accounts, and rotate their
    /// credentials (docs/service-accounts.md).
    #[command(subcommand, after_help = EXIT_STATUS)]
    ServiceAccounts(ServiceAccountsAction),
    /// Account events (docs/events.md).
    #[command(subcommand, after_help = EXIT_STATUS)]
    Events(EventsAction),
    /// Set a user's password (an administrator's reset: the current one is not needed):
    /// the new one is the first line of standard input or of --password-file, never an
    /// argument. The password rules and the blocklist apply. The user's sessions end,
    /// unless --keep-sessions; a disabled account stays disabled.
    #[command(after_help = EXIT_STATUS)]
    SetPassword {
        #[command(flatten)]
        user: UserArg,
        /// Read the new password from the first line of this file instead of from
        /// standard input.
        #[arg(long, value_name = "PATH", display_order = 0)]
        password_file: Option<PathBuf>,
        /// Keep the user's sessions (by default they end, and their tokens stop
        /// working).
        #[arg(long, display_order = 0)]
        keep_sessions: bool,
    },
}

/// `authd admin events …`.
#[derive(Debug, Clone, Subcommand)]
pub enum EventsAction {
    /// Print account events as they commit, one a line (JSON Lines with --json):
    /// from now on, or those after --from POS first. Runs until interrupted, or
    /// until --count events are printed. A subscriber that records the last
    /// position it processed resumes with --from that position and misses nothing.
    #[command(after_help = EXIT_STATUS)]
    Tail {
        /// Start after this position (0: from the first event retained, if none was
        /// deleted yet) [default: from now on].
        #[arg(long, value_name = "POS", conflicts_with = "oldest", display_order = 0)]
        from: Option<u64>,
        /// Start at the oldest event retained.
        #[arg(long, display_order = 0)]
        oldest: bool,
        /// Stop after this many events.
        #[arg(long, value_name = "N", display_order = 0)]
        count: Option<u64>,
    },
}

/// `authd admin users …`.
#[derive(Debug, Clone, Subcommand)]
pub enum UsersAction {
    /// List accounts in username order: one page, or every page with --all.
    #[command(after_help = EXIT_STATUS)]
    List {
        /// Only usernames that start with this (case-insensitive).
        #[arg(long, value_name = "TEXT", display_order = 0)]
        prefix: Option<String>,
        /// Only disabled accounts.
        #[arg(long, conflicts_with = "enabled", display_order = 0)]
        disabled: bool,
        /// Only enabled accounts.
        #[arg(long, display_order = 0)]
        enabled: bool,
        /// Accounts a page, 1 to 1000 [default: the server's, 100; with --all, 1000].
        #[arg(long, value_name = "N", display_order = 0,
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        page_size: Option<u32>,
        /// Start at this page: the next_page_token of the page before (--json shows it),
        /// with the same filters.
        #[arg(long, value_name = "TOKEN", display_order = 0)]
        page_token: Option<String>,
        /// Every page, not only the first.
        #[arg(long, display_order = 0)]
        all: bool,
    },
    /// Show one account: id, username, created and updated, disabled (when and why),
    /// live sessions, last login.
    #[command(after_help = EXIT_STATUS)]
    Get {
        #[command(flatten)]
        user: UserArg,
    },
    /// Disable an account: its logins, refreshes and password changes fail as with a
    /// wrong password, its sessions end, its tokens are refused. Disabling a disabled
    /// account changes nothing.
    #[command(after_help = EXIT_STATUS)]
    Disable {
        #[command(flatten)]
        user: UserArg,
        /// Why, for the audit trail and `users get` (1 to 512 characters; never shown
        /// to the user).
        #[arg(long, value_name = "TEXT", display_order = 0)]
        reason: String,
    },
    /// Enable a disabled account: its password works again (its tokens from before
    /// stay refused).
    #[command(after_help = EXIT_STATUS)]
    Enable {
        #[command(flatten)]
        user: UserArg,
    },
    /// Remove a user's second factors (docs/second-factor.md): the TOTP factor, its
    /// recovery codes and pending Login challenges, for a user who lost both the device
    /// and the recovery codes; the password alone signs in again.
    #[command(after_help = EXIT_STATUS)]
    RemoveSecondFactors {
        #[command(flatten)]
        user: UserArg,
    },
    /// Import users with the password hashes they already have, from a JSON Lines file
    /// (one user a line; docs/migration.md) or `-` for standard input. Every refused
    /// line is printed with its number and why; a summary ends the output; progress
    /// shows on stderr when it is a terminal. Exit status 0 when no line was refused.
    #[command(after_help = IMPORT_EXIT_STATUS)]
    Import {
        /// The JSON Lines file, or - for standard input.
        #[arg(value_name = "FILE|-")]
        file: PathBuf,
        /// What to do with a user whose username or user_id belongs to a different
        /// user already: fail (refuse it and stop after its batch) or skip it (and go
        /// on). Never overwritten.
        #[arg(long, value_enum, default_value = "fail", display_order = 0)]
        on_conflict: OnConflictArg,
    },
    /// Delete an account, its sessions and their refresh tokens, for good; its username
    /// may be registered again. Needs --yes.
    #[command(after_help = EXIT_STATUS)]
    Delete {
        #[command(flatten)]
        user: UserArg,
        /// Yes, delete it: without this nothing is deleted.
        #[arg(long, display_order = 0)]
        yes: bool,
    },
}

/// `authd admin sessions …`.
#[derive(Debug, Clone, Subcommand)]
pub enum SessionsAction {
    /// List a user's live sessions, newest first: id, started, refreshed, expires,
    /// client address.
    #[command(after_help = EXIT_STATUS)]
    List {
        #[command(flatten)]
        user: UserArg,
    },
    /// End a user's sessions: the ones named with --session, or every one when none is.
    /// Their refresh tokens stop working at once, their access tokens within
    /// AUTHD_REVOCATION_DELAY.
    #[command(after_help = EXIT_STATUS)]
    End {
        #[command(flatten)]
        user: UserArg,
        /// A session to end (its id, as `sessions list` shows it); repeat it for more.
        #[arg(long = "session", value_name = "ID", display_order = 0)]
        sessions: Vec<String>,
    },
}

/// `authd admin service-accounts …`.
#[derive(Debug, Clone, Subcommand)]
pub enum ServiceAccountsAction {
    /// Create a service account. With --secret a client secret is made and printed
    /// once (never again: keep it); --mtls-identity and --jwt bind a certificate
    /// identity or an external issuer's subject.
    #[command(after_help = EXIT_STATUS)]
    Create {
        /// Its name, the client_id of its grants (1 to 64 of a-z 0-9 . _ -).
        #[arg(value_name = "NAME")]
        name: String,
        /// An audience its tokens may carry; repeat it for more.
        #[arg(long = "audience", value_name = "AUDIENCE", display_order = 0)]
        audiences: Vec<String>,
        /// A scope its tokens may carry; repeat it for more.
        #[arg(long = "scope", value_name = "SCOPE", display_order = 0)]
        scopes: Vec<String>,
        /// Make a client secret (printed once).
        #[arg(long, display_order = 0)]
        secret: bool,
        /// A client certificate identity (SPIFFE URI or DNS name) that proves it under
        /// mutual TLS; repeat it for more.
        #[arg(long = "mtls-identity", value_name = "IDENTITY", display_order = 0)]
        mtls_identities: Vec<String>,
        /// An external issuer's tokens whose sub is SUBJECT prove it: ISSUER_URL=SUBJECT
        /// (e.g. https://kubernetes.default.svc=system:serviceaccount:shop:orders);
        /// repeat it for more.
        #[arg(long = "jwt", value_name = "ISSUER_URL=SUBJECT", display_order = 0)]
        jwt: Vec<String>,
    },
    /// List service accounts in name order (every page).
    #[command(after_help = EXIT_STATUS)]
    List,
    /// Show one service account: id, name, audiences, scopes, disabled, credentials
    /// (never a secret).
    #[command(after_help = EXIT_STATUS)]
    Show {
        #[command(flatten)]
        account: ServiceAccountArg,
    },
    /// Disable a service account: its grants fail and its tokens are refused on every
    /// replica within AUTHD_REVOCATION_DELAY.
    #[command(after_help = EXIT_STATUS)]
    Disable {
        #[command(flatten)]
        account: ServiceAccountArg,
        /// Why, for the audit trail and `show` (1 to 512 characters).
        #[arg(long, value_name = "TEXT", display_order = 0)]
        reason: String,
    },
    /// Delete a service account and its credentials, for good; its tokens are refused
    /// as a disabled account's. Needs --yes.
    #[command(after_help = EXIT_STATUS)]
    Delete {
        #[command(flatten)]
        account: ServiceAccountArg,
        /// Yes, delete it: without this nothing is deleted.
        #[arg(long, display_order = 0)]
        yes: bool,
    },
    /// Add a new client secret (printed once) beside the one in use: roll it out,
    /// then remove the old one with --revoke, or with `remove-credential`. An account
    /// holds two secrets at most.
    #[command(after_help = EXIT_STATUS)]
    RotateSecret {
        #[command(flatten)]
        account: ServiceAccountArg,
        /// Remove this credential (the old secret's id, as `show` lists it) once the
        /// new one is added: its tokens are refused from then on.
        #[arg(long, value_name = "CREDENTIAL_ID", display_order = 0)]
        revoke: Option<String>,
    },
    /// Remove a credential (its id, as `show` lists it): it proves nothing any more,
    /// and the tokens issued for it are refused within AUTHD_REVOCATION_DELAY.
    #[command(after_help = EXIT_STATUS)]
    RemoveCredential {
        #[command(flatten)]
        account: ServiceAccountArg,
        /// The credential's id.
        #[arg(long, value_name = "CREDENTIAL_ID", display_order = 0)]
        credential: String,
    },
}

/// Which service account: its name, or `--id`.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct ServiceAccountArg {
    /// The account's name (case-insensitive).
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// The account's id instead of its name.
    #[arg(long, value_name = "ID", display_order = 0)]
    pub id: Option<String>,
}

/// Which account: a username, or `--id`.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct UserArg {
    /// The account's username (case-insensitive).
    #[arg(value_name = "USERNAME")]
    pub username: Option<String>,
    /// The account's id instead of its username.
    #[arg(long, value_name = "ID", display_order = 0)]
    pub id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Command};

    fn admin(args: &[&str]) -> Result<AdminCommand, String> {
        let args: Vec<&str> = std::iter::once("admin")
            .chain(args.iter().copied())
            .collect();
        match Cli::parse_for_test(&args)?.command {
            Some(Command::Admin(admin)) => Ok(admin),
            other => panic!("not the admin command: {other:?}"),
        }
    }

    #[test]
    fn a_user_is_named_by_username_or_by_id_never_both() {
        let user = |args: &[&str]| -> Result<_, String> {
            match admin(args)?.action {
                AdminAction::Users(UsersAction::Get { user }) => Ok((user.username, user.id)),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            user(&["users", "get", "alice"]).unwrap(),
            (Some("alice".into()), None)
        );
        assert_eq!(
            user(&["users", "get", "--id", "0190"]).unwrap(),
            (None, Some("0190".into()))
        );
        assert!(user(&["users", "get"]).is_err());
        assert!(user(&["users", "get", "alice", "--id", "0190"]).is_err());
    }

    #[test]
    fn the_options_are_checked_and_accepted_anywhere_after_admin() {
        let parsed = admin(&[
            "--addr",
            "127.0.0.1:50053",
            "users",
            "list",
            "--json",
            "--timeout",
            "2s",
            "--enabled",
        ])
        .unwrap();
        assert_eq!(parsed.connection.addr.as_deref(), Some("127.0.0.1:50053"));
        assert!(parsed.connection.json);
        assert_eq!(parsed.connection.timeout, Duration::from_secs(2));
        assert_eq!(
            admin(&["users", "list"]).unwrap().connection.timeout,
            Duration::from_secs(10)
        );
        assert!(admin(&["users", "list", "--disabled", "--enabled"]).is_err());
        assert!(admin(&["users", "list", "--page-size", "1001"]).is_err());
        assert!(
            admin(&["users", "disable", "alice"]).is_err(),
            "--reason is required"
        );
        assert!(admin(&["users", "get", "alice", "--tls-cert", "c.pem"]).is_err());
        // No option takes the key itself.
        assert!(admin(&["users", "list", "--key", "k"]).is_err());
        let ended = admin(&["sessions", "end", "bob", "--session", "a", "--session", "b"]);
        match ended.unwrap().action {
            AdminAction::Sessions(SessionsAction::End { sessions, .. }) => {
                assert_eq!(sessions, ["a", "b"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_key_comes_from_the_file_or_the_variable_and_is_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "file-k3y-0123456789abcdef\n").unwrap();
        let connection = |key_file: Option<PathBuf>| {
            let mut parsed = admin(&["users", "list"]).unwrap().connection;
            parsed.key_file = key_file;
            parsed
        };
        let var = Some(OsString::from("var-k3y-0123456789abcdef"));
        // The file, when given, wins over the variable.
        let key = connection(Some(file.clone()))
            .key_from(var.clone())
            .unwrap();
        assert_eq!(key.expose(), "file-k3y-0123456789abcdef");
        let key = connection(None).key_from(var).unwrap();
        assert_eq!(key.expose(), "var-k3y-0123456789abcdef");
        let none = connection(None).key_from(None).unwrap_err();
        assert!(
            none.contains("AUTHD_ADMIN_KEY") && none.contains("--key-file"),
            "{none}"
        );
        let missing = connection(Some(dir.path().join("missing")))
            .key_from(None)
            .unwrap_err();
        assert!(missing.starts_with("--key-file ") && missing.contains("cannot read"));
        std::fs::write(&file, "bad k3y\n").unwrap();
        let bad = connection(Some(file)).key_from(None).unwrap_err();
        assert!(!bad.contains("k3y"), "{bad}");
        let bad = connection(None)
            .key_from(Some(OsString::from("bad k3y")))
            .unwrap_err();
        assert!(
            bad.starts_with("AUTHD_ADMIN_KEY: ") && !bad.contains("k3y"),
            "{bad}"
        );
    }
}
