//! authd: a gRPC authentication service.
//!
//! It serves `auth.v1.AuthService` (Register, Login, ValidateToken, and the session
//! lifecycle: Refresh, Logout, ChangePassword), the standard
//! `grpc.health.v1.Health` service and server reflection. Passwords are stored as
//! PBKDF2-SHA256 PHC strings; tokens are stateless JWTs signed with Ed25519 (their
//! public keys published as a JWKS document) or HMAC-SHA256.
//!
//! # Layout
//!
//! A request passes each box once, top to bottom; nothing calls back up the stack,
//! and the imports run the same way: a module imports only modules below it in
//! this map, and every layer and the handler stand on the bottom floor, never on
//! each other. No two modules import each other.
//!
//! ```text
//! transport            accept loop and per-connection bounds (hyper, HTTP/2), TLS and
//!                      mutual TLS (rustls, files reloaded live)
//! web                  one port, three protocols: gRPC passed on, gRPC-Web (tonic-web)
//!                      and Connect's JSON translated to gRPC in front of the layers;
//!                      CORS, the plain-HTTP fallback
//!   layers             the request path's tower layers, outermost first:
//!     trace            request id, one log event and the request metrics per request
//!     pushback         refusals with a retry hint held on a timer before their answer
//!     access           mutual TLS allow-list: identity per method (PERMISSION_DENIED)
//!   layers::ratelimit  the rate limits: asks the limiter, refuses at once, never
//!                      queues (health and reflection exempt)
//!   layers::admission  the one decision on load: admitted when it can be answered
//!                      before its deadline, at the pace measured (layers::pace);
//!                      whole request first, memory bounds, drain (reject, never
//!                      queue what cannot be served in time)
//!   ratelimit          the limiter the rate-limit layer asks: rules, keys, per-rule
//!                      sliding windows on Redis or in process; Envoy's rate limit
//!                      service on the same limiter
//!   codec              protobuf decoding; malformed -> INVALID_ARGUMENT, generic
//!   handlers           one per service a client calls, none importing another:
//!     grpc             proto <-> domain, for auth.v1.AuthService
//!     extauthz         external authorization: Envoy's Check (gRPC) and HTTP
//!                      forward-auth, verified as ValidateToken, identity headers
//!     admin            auth.admin.v1.AdminService on its own listener: admin keys and
//!                      roles, its rate limit, proto <-> domain, audited
//!   oidc               the standard HTTP endpoints on the gRPC port: OIDC discovery,
//!                      the JWKS, RFC 7662 introspection, RFC 7009 revocation
//!   events             account events out of the store's outbox: WatchEvents
//!                      streams, retention, webhook delivery
//!   accounts           the register / login / validate / session use cases
//!     audit            the audit trail: one event per security outcome on `authd::audit`
//!     throttle         the login throttle: attempts reserved before hashing, per
//!                      client and per account, in process or on Redis
//!     blocklist        common passwords (bundled, plus an organization's file) and the
//!                      username, refused before hashing
//!     revocation       ended sessions and per-user cutoffs in memory, for ValidateToken
//!     store            SQLite (reader pool + one batching writer) or PostgreSQL (pool)
//!     refresh          refresh tokens (random, rotated, stored as a digest)
//!     second_factor    TOTP codes, recovery codes, Login's challenges, and the data
//!                      keys that seal TOTP secrets at rest
//!     password         the policy of new hashes (PBKDF2, or Argon2id within a memory
//!                      budget), on a pool of hashing threads behind a first-in,
//!                      first-out queue; `authd hash-bench`
//!       password::foreign  hashes made by other systems, verified as they are
//!     priority         the OS scheduling priority of the runtime's and the hashing threads
//!     token            JWT EdDSA / HS256 with a key ring (kid -> key), the key file,
//!                      the JWKS document
//!     issuers          external JWT issuers (Kubernetes service-account tokens): their
//!                      keys from their discovery documents, cached, and their tokens
//!                      checked as service accounts' credentials
//!     credentials      `Username` and `Password`, parsed and normalized at the edge
//! ```
//!
//! The bottom floor, which every module above may import and which imports nothing
//! above it:
//! - `rpc`: which RPC a path is, the exempt rule, the request extensions (request
//!   id, deadline, user id, client certificate identity), the `grpc-timeout` header
//!   and who sent a request.
//! - `error`: the domain error (with the kinds it names itself: the throttle's scope,
//!   the token errors), and its one mapping to a gRPC `Status`.
//! - `middleware`: the Layer/Service shell the layers share.
//! - `metrics`: the Prometheus registry of one application, its metrics, and the
//!   router of the plain-HTTP port (`GET /metrics`).
//! - `otel`: the OpenTelemetry traces of one application: the server span the
//!   trace layer starts, and the child spans (rate limit, hash queue and hash,
//!   store operations, tokens) started from the request's context.
//! - `redis`: the process's one Redis connection, whether it answers (one flag for
//!   the rate limiter and the login throttle, and the prober that brings it back),
//!   the one failure of a call and its timeout, and the failure mode.
//! - `secret`: secret-bearing settings: URLs printed with their passwords hidden, and
//!   the value parser whose errors never quote a secret.
//! - `clock`: the one clock of every rule that depends on the time, faked in tests.
//! - `named_keys`: files of named keys stored as digests (admin keys, introspection
//!   clients) and the constant-time check of a presented key.
//! - `watched`: a file re-read while serving (the token key file, the rate limit
//!   rules file): its content's digest, a change put in force, a bad one refused once.
//!
//! Around the request path, above it all (each importing only those after it and
//! the request path):
//! - [`app`]: [`app::Application`] builds each component from its configuration
//!   group (the core, each port, each background task), binds, and runs until shut
//!   down, every task under one supervisor; `main.rs`, the integration tests and
//!   authbench's tests start the service through it.
//! - `health`: readiness from store probes and real request failures; liveness; and
//!   `health::check`, `authd health`, the client side: one check, an exit status.
//! - `admin_client`: `authd admin`, the admin API's command-line client: users and
//!   sessions listed, shown, disabled, enabled, deleted and ended, a password set,
//!   second factors removed;
//!   tables or JSON, and exit statuses scripts can rely on.
//! - `telemetry`: the `tracing` subscriber (text or JSON lines).
//! - [`config`]: the command line and the one `Config` (flags and `AUTHD_*` environment
//!   variables), one group of options per component, each building its component's settings.
//! - `client`: the client side of a connection to a running authd, for the commands
//!   that call one: the address, the TLS client options, a timeout told apart, errors
//!   in one line. It imports nothing of the crate.
//!
//! The public surface is [`app`], [`config`], [`pb`] and the few items re-exported
//! below for `main.rs` and the tests; every module is private. Unit tests check
//! that this map names every module, and each folder's module docs every file in it;
//! that the imports run down this map; and that no two files of a folder import
//! each other.
//!
//! The load generator is a package of its own (`authbench/`), a gRPC client of authd
//! and nothing more.
#![forbid(unsafe_code)]

pub(crate) mod accounts;
pub(crate) mod admin_client;
pub mod app;
pub(crate) mod audit;
pub(crate) mod blocklist;
pub(crate) mod client;
pub(crate) mod clock;
pub(crate) mod codec;
pub mod config;
pub(crate) mod credentials;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod handlers;
pub(crate) mod health;
pub(crate) mod issuers;
pub(crate) mod layers;
pub(crate) mod metrics;
pub(crate) mod middleware;
pub(crate) mod named_keys;
pub(crate) mod oidc;
pub(crate) mod otel;
pub(crate) mod password;
pub(crate) mod priority;
pub(crate) mod ratelimit;
pub(crate) mod redis;
pub(crate) mod refresh;
pub(crate) mod revocation;
pub(crate) mod rpc;
pub(crate) mod second_factor;
pub(crate) mod secret;
pub(crate) mod store;
pub(crate) mod telemetry;
pub(crate) mod throttle;
pub(crate) mod token;
pub(crate) mod transport;
pub(crate) mod watched;
pub(crate) mod web;

// The public surface beyond the application, its configuration and the wire types:
// what `main.rs`, the integration tests and authbench's tests use, and no more.
pub use admin_client::run as admin_command;
pub use client::ClientTls;
pub use clock::ManualClock;
pub use credentials::Password;
pub use health::check as health_check;
pub use password::{bench as hash_bench, hash_now};
pub use priority::{Policy as ThreadPolicy, lower_with_policy};
pub use ratelimit::{Backend as RateLimitBackend, RegisterLimit};
pub use redis::FailureMode;
pub use second_factor::DataKeys;
pub use telemetry::init as init_logging;
pub use token::{Algorithm as KeyAlgorithm, KeyRing, MAX_TTL, generate_key_entry};

/// Code generated from `proto/auth/v1/auth.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("auth.v1");
    // The client, generated apart on prost's own codec (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/client/auth.v1.rs"));

    /// The encoded descriptor set of `auth.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("auth_descriptor");

    /// Envoy's external authorization service, `envoy.service.auth.v3.Authorization`:
    /// its server, generated on authd's codec over the call's own two messages
    /// (`handlers::extauthz::wire`, Envoy's wire format with only what a decision reads) and
    /// envoy-types' others (see build.rs). Clients use envoy-types' messages.
    pub(crate) mod envoy_auth {
        #![allow(clippy::all, missing_docs)]
        include!(concat!(env!("OUT_DIR"), "/envoy.service.auth.v3.rs"));

        /// The encoded descriptor set of `envoy/service/auth/v3/external_auth.proto`
        /// and its imports, served by reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("extauthz_descriptor");
    }

    /// The admin API, `auth.admin.v1` (served only on the admin listener).
    pub mod admin {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("auth.admin.v1");
        include!(concat!(env!("OUT_DIR"), "/client/auth.admin.v1.rs"));

        /// The encoded descriptor set of `auth.admin.v1`, served by the admin
        /// listener's reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("admin_descriptor");
    }

    /// Envoy's APIs that authd serves (their types are the `envoy-types` crate's).
    pub mod envoy {
        /// The encoded descriptor set of `envoy.service.ratelimit.v3` and every file
        /// it imports, served by reflection (see build.rs).
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("envoy_descriptor");
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The `//!` lines of a file: its module docs.
    fn module_docs(path: &Path) -> String {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether `text` names the module `name`: in code quotes (`` `name` ``, or a
    /// path through it, `` `name::…` ``) or as the first word of a line of a map
    /// (`name  what it does`, `parent::name  …`), not merely as a word in a sentence.
    fn names(text: &str, name: &str) -> bool {
        let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let quoted = text.match_indices(name).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            (before == Some('`') || text[..at].ends_with("::"))
                && !after.is_some_and(is_ident)
                && (after == Some('`') || text[at + name.len()..].starts_with("::"))
        });
        let mapped = text.lines().any(|line| {
            let first = line.split_whitespace().next().unwrap_or_default();
            first == name || first.rsplit("::").next() == Some(name)
        });
        quoted || mapped
    }

    /// The modules of the folder `dir`: its `.rs` files (but `skip`) and folders.
    fn modules_in(dir: &Path, skip: &[&str]) -> Vec<(String, std::path::PathBuf)> {
        let mut modules: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter_map(|path| {
                let name = if path.is_dir() {
                    path.file_name()?.to_str()?.to_owned()
                } else {
                    path.extension().filter(|e| *e == "rs")?;
                    path.file_stem()?.to_str()?.to_owned()
                };
                (!skip.contains(&name.as_str())).then_some((name, path))
            })
            .collect();
        modules.sort();
        modules
    }

    /// The crate docs' Layout names every top-level module, and each folder's own
    /// module docs name every file in it, so the map a newcomer reads first cannot
    /// fall behind the code: a module added without its line fails here.
    #[test]
    fn the_layout_names_every_module() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let crate_docs = module_docs(&src.join("lib.rs"));
        let mut missing = Vec::new();
        for (name, path) in modules_in(&src, &["lib", "main"]) {
            if !names(&crate_docs, &name) {
                missing.push(format!("src/lib.rs does not name `{name}`"));
            }
            if path.is_dir() {
                let folder_docs = module_docs(&path.join("mod.rs"));
                for (file, _) in modules_in(&path, &["mod"]) {
                    if !names(&folder_docs, &file) {
                        missing.push(format!("src/{name}/mod.rs does not name `{file}`"));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// The code of `path`: not its comments, not its unit tests.
    fn code_of(path: &Path) -> String {
        let text = std::fs::read_to_string(path).unwrap();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        let code: Vec<&str> = (code.lines())
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        code.join("\n")
    }

    /// The first names of the paths that `code` starts with `prefix` (such as
    /// `crate::` or `super::`), in paths (`crate::a::b`) and in brace lists
    /// (`crate::{a, b::{c, d}}`, over any number of lines).
    fn names_after(code: &str, prefix: &str) -> std::collections::BTreeSet<String> {
        let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let ident = |s: &str| -> String {
            (s.trim_start().chars())
                .take_while(|c| is_ident(*c))
                .collect()
        };
        let mut found = std::collections::BTreeSet::new();
        for (at, _) in code.match_indices(prefix) {
            // `prefix` itself, not the end of a longer name (`self::super::` is fine).
            if code[..at].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let Some(list) = rest.strip_prefix('{') else {
                found.insert(ident(rest));
                continue;
            };
            // The items of the list at its own depth: each one's first name.
            let (mut depth, mut item) = (1, String::new());
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 1 => break,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        found.insert(ident(&item));
                        item.clear();
                    }
                    c if depth == 1 => item.push(c),
                    _ => {}
                }
            }
            found.insert(ident(&item));
        }
        found.retain(|name| !name.is_empty() && name != "self");
        found
    }

    /// The top-level modules that `path`'s code names through `crate::`.
    fn imports_of(path: &Path) -> std::collections::BTreeSet<String> {
        let mut found = names_after(&code_of(path), "crate::");
        found.remove("pb");
        found
    }

    /// The `.rs` files of `path`: itself, or every file under the folder.
    fn files(path: &Path) -> Vec<std::path::PathBuf> {
        if path.is_dir() {
            std::fs::read_dir(path)
                .unwrap()
                .flat_map(|e| files(&e.unwrap().path()))
                .collect()
        } else {
            vec![path.to_owned()]
        }
    }

    /// Modules and the modules each one imports.
    type Graph = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;

    /// Every top-level module and the modules it imports (its files' imports, all
    /// but itself).
    fn import_graph() -> Graph {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        modules_in(&src, &["lib", "main"])
            .into_iter()
            .map(|(name, path)| {
                let mut imports: std::collections::BTreeSet<String> =
                    files(&path).iter().flat_map(|f| imports_of(f)).collect();
                imports.remove(&name);
                (name, imports)
            })
            .collect()
    }

    /// The Layout's promise, checked on the code: no two modules import each other
    /// (no cycle at all), and the bottom floor imports nothing above it.
    #[test]
    fn the_imports_run_down_the_layout() {
        const FLOOR: [&str; 9] = [
            "rpc",
            "error",
            "middleware",
            "metrics",
            "otel",
            "redis",
            "secret",
            "clock",
            "watched",
        ];
        let graph = import_graph();
        let mut wrong = Vec::new();
        for (module, imports) in &graph {
            if FLOOR.contains(&module.as_str()) {
                for import in imports.iter().filter(|i| !FLOOR.contains(&i.as_str())) {
                    wrong.push(format!("`{module}` (bottom floor) imports `{import}`"));
                }
            }
            assert!(
                imports.iter().all(|i| graph.contains_key(i)),
                "`{module}` imports a module that is not a file: {imports:?}"
            );
        }
        wrong.extend(cycles(&graph));
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Every import cycle of `graph`, each as the path that closes it.
    fn cycles(graph: &Graph) -> Vec<String> {
        // Depth-first: a module met again while still on the path closes a cycle.
        fn visit<'a>(
            graph: &'a Graph,
            module: &'a str,
            path: &mut Vec<&'a str>,
            done: &mut std::collections::BTreeSet<&'a str>,
            found: &mut Vec<String>,
        ) {
            if let Some(at) = path.iter().position(|m| *m == module) {
                found.push(format!(
                    "an import cycle: {} -> {module}",
                    path[at..].join(" -> ")
                ));
                return;
            }
            if !done.insert(module) {
                return;
            }
            path.push(module);
            for import in &graph[module] {
                visit(graph, import, path, done, found);
            }
            path.pop();
        }
        let (mut done, mut found) = (std::collections::BTreeSet::new(), Vec::new());
        for module in graph.keys() {
            visit(graph, module, &mut Vec::new(), &mut done, &mut found);
        }
        found
    }

    /// The files (and subfolders) of the folder `dir`, module `crate::{path}`, and the
    /// siblings each one imports: through `crate::{path}::name`, or `super::name` from
    /// a file directly in the folder. (What the folder's `mod.rs` declares and
    /// re-exports is its own; an item reached through a re-export is not followed.)
    fn folder_graph(dir: &Path, path: &str) -> Graph {
        let siblings = modules_in(dir, &["mod"]);
        let names: std::collections::BTreeSet<String> =
            siblings.iter().map(|(name, _)| name.clone()).collect();
        siblings
            .iter()
            .map(|(name, at)| {
                let mut imports = std::collections::BTreeSet::new();
                for file in files(at) {
                    let code = code_of(&file);
                    imports.extend(names_after(&code, &format!("crate::{path}::")));
                    if file == *at {
                        imports.extend(names_after(&code, "super::"));
                    }
                }
                imports.retain(|i| names.contains(i) && i != name);
                (name.clone(), imports)
            })
            .collect()
    }

    /// Every folder under `dir` (module `crate::{path}`), itself included, with
    /// its module path.
    fn folders(dir: &Path, path: &str) -> Vec<(std::path::PathBuf, String)> {
        let mut all = vec![(dir.to_owned(), path.to_owned())];
        for (name, at) in modules_in(dir, &["mod"]) {
            if at.is_dir() {
                all.extend(folders(&at, &format!("{path}::{name}")));
            }
        }
        all
    }

    /// The same promise inside each folder: no two files of a folder (at any depth)
    /// import each other, directly or around a longer cycle.
    #[test]
    fn no_files_of_a_folder_import_each_other() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut wrong = Vec::new();
        for (top, dir) in modules_in(&src, &["lib", "main"]) {
            if !dir.is_dir() {
                continue;
            }
            for (dir, path) in folders(&dir, &top) {
                for cycle in cycles(&folder_graph(&dir, &path)) {
                    wrong.push(format!("src/{}: {cycle}", path.replace("::", "/")));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_module_is_named_in_code_quotes_or_at_the_head_of_a_map_line() {
        assert!(names("- `token`: keys", "token"));
        assert!(names("see `token::jwks` for", "jwks"));
        assert!(names("see `token::jwks` for", "token"));
        assert!(names(
            "  layers::admission  whole request first",
            "admission"
        ));
        assert!(names("  store   SQLite or PostgreSQL", "store"));
        assert!(!names("tokens and `token_ttl`", "token"));
        assert!(!names("the token is signed", "token"));
    }
}
