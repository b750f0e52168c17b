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

    envoy_descriptors(&out_dir)?;

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

/// Envoy's APIs that authd serves: their files and every file they import come
/// from the descriptor set that the `envoy-types` crate ships beside its generated
/// code (`src/generated/types.bin`), so reflection describes exactly the types the
/// crate encodes. The crate's version is read from Cargo.lock and its sources found
/// where Cargo unpacks them (`$CARGO_HOME/registry/src/*/envoy-types-VERSION`).
const ENVOY_APIS: &[&str] = &["envoy/service/ratelimit/v3/rls.proto"];

/// Writes `envoy_descriptor.bin`: the files of [`ENVOY_APIS`] and their imports.
fn envoy_descriptors(out_dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = fs::read_to_string("Cargo.lock")?;
    let version = lock
        .split("[[package]]")
        .find_map(|entry| {
            let mut lines = entry.lines().map(str::trim);
            lines.find(|l| *l == "name = \"envoy-types\"")?;
            let version = lines.find_map(|l| l.strip_prefix("version = "))?;
            Some(version.trim_matches('"').to_owned())
        })
        .ok_or("Cargo.lock names no envoy-types package")?;
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registries = fs::read_dir(cargo_home.join("registry/src"))?;
    let file = registries
        .filter_map(Result::ok)
        .map(|r| {
            r.path()
                .join(format!("envoy-types-{version}/src/generated/types.bin"))
        })
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "envoy-types {version}'s types.bin not found under {}",
                cargo_home.display()
            )
        })?;
    println!("cargo:rerun-if-changed={}", file.display());
    let all = prost_types::FileDescriptorSet::decode(fs::read(&file)?.as_slice())?;
    let by_name: std::collections::HashMap<&str, &prost_types::FileDescriptorProto> =
        all.file.iter().map(|f| (f.name(), f)).collect();
    // Imports first, as protoc orders a set, each file once.
    fn visit<'a>(
        name: &'a str,
        by_name: &std::collections::HashMap<&str, &'a prost_types::FileDescriptorProto>,
        seen: &mut std::collections::HashSet<&'a str>,
        out: &mut Vec<prost_types::FileDescriptorProto>,
    ) -> Result<(), String> {
        let file = by_name
            .get(name)
            .ok_or_else(|| format!("{name} is not in envoy-types"))?;
        if !seen.insert(file.name()) {
            return Ok(());
        }
        for import in &file.dependency {
            visit(import, by_name, seen, out)?;
        }
        let mut file = (*file).clone();
        // Comments are not needed to call the API, and would make the binary larger.
        file.source_code_info = None;
        out.push(file);
        Ok(())
    }
    let (mut seen, mut files) = (Default::default(), Vec::new());
    for api in ENVOY_APIS {
        visit(api, &by_name, &mut seen, &mut files)?;
    }
    let set = prost_types::FileDescriptorSet { file: files };
    fs::write(out_dir.join("envoy_descriptor.bin"), set.encode_to_vec())?;
    Ok(())
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
