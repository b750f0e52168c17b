//! Compiles authd's wire contract (`../proto`) into a gRPC client with protox (a
//! pure-Rust protobuf compiler, so no system `protoc`): the only way authbench
//! knows authd.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto");
    // The admin API too: the service-account scenarios create their accounts with it.
    let fds = protox::compile(
        ["auth/v1/auth.proto", "auth/admin/v1/admin.proto"],
        ["../proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
