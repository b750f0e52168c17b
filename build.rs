//! Compiles `proto/` with protox (a pure-Rust protobuf compiler, so no system `protoc`)
//! into tonic client and server code, and writes the encoded descriptor set that
//! server reflection serves.

use prost::Message;
use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/auth/v1/auth.proto"];
    println!("cargo:rerun-if-changed=proto");

    let fds = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // `compile_fds` generates code but does not write the descriptor set: reflection needs it.
    fs::write(out_dir.join("auth_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
