//! Test setup shared by the unit tests of the pool (`pool`) and of its threads
//! (`worker`): a small pool, a derivation and its reference output, a held thread;
//! and by those of `foreign` and the hasher: the foreign hashes' fixtures.
//!
//! Compiled for tests only; it holds no tests of its own.

use super::{
    HashPool,
    work::{Derivation, PoolError},
};
use crate::metrics::Metrics;
use pbkdf2_lanes::Engine;

pub(super) fn pool(threads: usize, metrics: &Metrics) -> HashPool {
    HashPool::new(threads, 0, Engine::detect(), metrics).unwrap()
}

pub(super) fn job(password: &[u8], rounds: u32) -> Derivation {
    Derivation {
        password: password.to_vec(),
        salt: b"salt".to_vec(),
        rounds,
    }
}

pub(super) fn reference(password: &[u8], rounds: u32) -> [u8; 32] {
    let mut expected = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<pbkdf2::sha2::Sha256>(password, b"salt", rounds, &mut expected);
    expected
}

/// Holds `pool`'s only thread with a job that runs until the sender is used or
/// dropped; returns once the job runs.
pub(super) async fn occupy_the_thread(
    pool: &HashPool,
) -> (
    tokio::task::JoinHandle<Result<(), PoolError>>,
    std::sync::mpsc::Sender<()>,
) {
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let busy = tokio::spawn({
        let pool = pool.clone();
        async move {
            pool.run(None, move || {
                started_tx.send(()).unwrap();
                let _ = release_rx.recv();
            })
            .await
        }
    });
    tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
        .await
        .unwrap();
    (busy, release_tx)
}

/// The records of tests/fixtures/foreign-hashes/foreign-hashes.jsonl, made by the
/// reference implementations (generate.py beside it).
pub(super) fn fixtures() -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/foreign-hashes/foreign-hashes.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}
