//! Compiles `proto/` with protox (a pure-Rust protobuf compiler, so no system `protoc`)
//! into tonic client and server code, and writes the encoded descriptor set that
//! server reflection serves.
//!
//! The server is generated on authd's own codec (`crate::codec::RequestCodec`), which
//! answers a request that does not decode with INVALID_ARGUMENT and a generic message.
//! The client keeps prost's codec, for which an undecodable response is the server's
//! fault (INTERNAL): it is generated in a second pass, into `client/`, reusing the
//! message types of the first.
//!
//! Envoy's external authorization API (`envoy.service.auth.v3.Authorization`) is
//! compiled from the protos the `envoy-types` package ships (its message types are
//! used as they are): only the server is generated here, on authd's codec, and the
//! descriptor set of `external_auth.proto` and everything it imports is written for
//! reflection. The package's folder is found in Cargo's registry (by the version
//! Cargo.lock pins), or named by `AUTHD_ENVOY_PROTOS` (a vendored copy).
//!
//! It also builds the bundled password blocklist: `data/common-passwords.txt.gz` (see
//! `data/README.md`) decompressed, every entry folded as `src/blocklist.rs` folds
//! passwords (NFKC, then Unicode lowercase), sorted, deduplicated and written as an
//! `fst::Set` to `OUT_DIR/common-passwords.fst`, which the binary embeds and searches
//! in place. A test in `src/blocklist.rs` checks that both foldings agree.

use prost::Message;
use std::{
    env, fs,
    io::Read as _,
    path::{Path, PathBuf},
};
use unicode_normalization::UnicodeNormalization as _;

/// The bundled list of common passwords, one a line (see data/README.md).
const COMMON_PASSWORDS: &str = "data/common-passwords.txt.gz";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // Each API has its own descriptor set, so the gRPC port's reflection never
    // lists the admin service (served only on the admin listener).
    compile(
        &out_dir,
        "proto/auth/v1/auth.proto",
        ".auth.v1",
        "crate::pb",
        "auth",
    )?;
    compile(
        &out_dir,
        "proto/auth/admin/v1/admin.proto",
        ".auth.admin.v1",
        "crate::pb::admin",
        "admin",
    )?;

    envoy_apis(&out_dir)?;

    println!("cargo:rerun-if-changed={COMMON_PASSWORDS}");
    common_passwords(
        Path::new(COMMON_PASSWORDS),
        &out_dir.join("common-passwords.fst"),
    )?;
    Ok(())
}

/// Compiles `proto` (package `package`, whose Rust module is `module`) into the
/// server on authd's codec, the client on prost's, and the descriptor set
/// `{name}_descriptor.bin` that reflection serves.
fn compile(
    out_dir: &Path,
    proto: &str,
    package: &str,
    module: &str,
    name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile([proto], ["proto"])?;
    // `compile_fds` generates code but does not write the descriptor set: reflection needs it.
    fs::write(
        out_dir.join(format!("{name}_descriptor.bin")),
        fds.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .codec_path("crate::codec::RequestCodec")
        .compile_fds(fds.clone())?;

    let client_dir = out_dir.join("client");
    fs::create_dir_all(&client_dir)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .extern_path(package, module)
        .out_dir(client_dir)
        .compile_fds(fds)?;
    Ok(())
}

/// Envoy's APIs that authd serves, from the protos the envoy-types package ships:
/// the external authorization service (its server on authd's codec, over
/// envoy-types' messages, and `extauthz_descriptor.bin` for reflection) and the rate
/// limit service (`envoy_descriptor.bin` for reflection).
fn envoy_apis(out_dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "envoy/service/auth/v3/external_auth.proto";
    const RATE_LIMIT_PROTO: &str = "envoy/service/ratelimit/v3/rls.proto";
    const PACKAGE: &str = ".envoy.service.auth.v3";
    let root = envoy_protos()?;
    let includes = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec",
        "opentelemetry-proto",
        "client_model",
    ]
    .map(|dir| root.join(dir));
    // The rate limit service: its server is written by hand on envoy-types'
    // messages (`ratelimit::service`); reflection needs its descriptors.
    let rls = protox::compile([RATE_LIMIT_PROTO], &includes)?;
    fs::write(out_dir.join("envoy_descriptor.bin"), rls.encode_to_vec())?;
    let fds = protox::compile([PROTO], includes)?;
    fs::write(out_dir.join("extauthz_descriptor.bin"), fds.encode_to_vec())?;
    // Only the service's own file: its messages are envoy-types' (extern), so the
    // code generated is the server alone.
    let mut own = fds.clone();
    own.file.retain(|file| file.name() == PROTO);
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .codec_path("crate::codec::RequestCodec")
        // The two messages of the call are authd's own, reading and writing only
        // what a decision needs (`handlers::extauthz::wire`); the rest are envoy-types'.
        .extern_path(
            ".envoy.service.auth.v3.CheckRequest",
            "crate::handlers::extauthz::wire::CheckRequest",
        )
        .extern_path(
            ".envoy.service.auth.v3.CheckResponse",
            "crate::handlers::extauthz::wire::CheckResponse",
        )
        .extern_path(PACKAGE, "::envoy_types::pb::envoy::service::auth::v3")
        .compile_fds(own)?;
    Ok(())
}

/// The `proto/` folder of the envoy-types package this build uses.
fn envoy_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=AUTHD_ENVOY_PROTOS");
    if let Some(dir) = env::var_os("AUTHD_ENVOY_PROTOS") {
        return Ok(dir.into());
    }
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = fs::read_to_string("Cargo.lock")?;
    let version = lock
        .split("[[package]]")
        .filter(|entry| entry.contains("\nname = \"envoy-types\"\n"))
        .find_map(|entry| {
            let line = entry.lines().find(|l| l.starts_with("version = "))?;
            Some(
                line.trim_start_matches("version = ")
                    .trim_matches('"')
                    .to_owned(),
            )
        })
        .ok_or("Cargo.lock pins no envoy-types")?;
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let package = format!("envoy-types-{version}");
    let registries = fs::read_dir(cargo_home.join("registry").join("src"))?;
    for registry in registries.flatten() {
        let proto = registry.path().join(&package).join("proto");
        if proto.is_dir() {
            return Ok(proto);
        }
    }
    Err(format!(
        "{package} is not in {}/registry/src: set AUTHD_ENVOY_PROTOS to its proto/ folder",
        cargo_home.display()
    )
    .into())
}

/// Writes the folded, deduplicated entries of the gzipped list at `list` as an
/// `fst::Set` to `out`.
fn common_passwords(list: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let named = |e: std::io::Error| format!("{}: {e}", list.display());
    let mut text = String::new();
    flate2::read::GzDecoder::new(fs::File::open(list).map_err(named)?)
        .read_to_string(&mut text)
        .map_err(named)?;
    let mut entries: Vec<String> = text
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty())
        // Exactly as `blocklist::fold`.
        .map(|line| line.nfkc().collect::<String>().to_lowercase())
        .collect();
    entries.sort_unstable();
    entries.dedup();
    let mut set = fst::SetBuilder::new(std::io::BufWriter::new(fs::File::create(out)?))?;
    set.extend_iter(&entries)?;
    set.finish()?;
    Ok(())
}
