//! Every backend against the `pbkdf2` crate: random passwords (0 to 1,024
//! bytes), salts (0 to 300 bytes), round counts and batch sizes (1 to 20,
//! beyond every lane count but AVX-512's; 1 to 40 for AVX-512), with mixed
//! round counts in a batch.
//!
//! Round counts stay small: the suite runs unoptimised in a plain `cargo test`
//! of this package, where the AVX2 kernel costs about 0.4 ms per round.

use pbkdf2_lanes::{Backend, Engine, Job};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

fn reference(job: &Job<'_>) -> [u8; 32] {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha2::Sha256>(job.password, job.salt, job.rounds, &mut out);
    out
}

type Owned = (Vec<u8>, Vec<u8>, u32);

fn check(engine: Engine, owned: &[Owned]) -> Result<(), TestCaseError> {
    let jobs: Vec<Job> = owned.iter().map(|(p, s, c)| Job::new(p, s, *c)).collect();
    let got = engine.derive_vec(&jobs).unwrap();
    for (i, job) in jobs.iter().enumerate() {
        prop_assert_eq!(
            got[i],
            reference(job),
            "{:?}, job {} of {}: {:?}",
            engine,
            i,
            jobs.len(),
            job
        );
    }
    Ok(())
}

/// Mostly short inputs, some longer than a block, a few up to 1,024 bytes.
fn bytes(short: usize, long: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => vec(any::<u8>(), 0..=short),
        3 => vec(any::<u8>(), 56..=130),
        1 => vec(any::<u8>(), 0..=long),
    ]
}

fn batch(max_rounds: u32) -> impl Strategy<Value = Vec<Owned>> {
    vec((bytes(70, 1024), bytes(40, 300), 1..=max_rounds), 1..=20)
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn engine(backend: Backend) -> Engine {
    Engine::with_backend(backend).unwrap_or_else(|| panic!("{backend} is not supported here"))
}

proptest! {
    #![proptest_config(config(48))]
    #[test]
    fn portable_matches_the_pbkdf2_crate(jobs in batch(40)) {
        check(engine(Backend::Portable), &jobs)?;
    }
}

proptest! {
    #![proptest_config(config(24))]
    #[test]
    fn sha_ni_matches_the_pbkdf2_crate_at_every_interleave(jobs in batch(40)) {
        if Backend::ShaNi.is_supported() {
            for streams in 1..=8 {
                check(Engine::with_sha_ni_streams(streams).unwrap(), &jobs)?;
            }
            check(engine(Backend::ShaNi), &jobs)?;
        }
    }
}

proptest! {
    #![proptest_config(config(24))]
    #[test]
    fn avx2_matches_the_pbkdf2_crate(jobs in batch(8)) {
        if Backend::Avx2.is_supported() {
            check(engine(Backend::Avx2), &jobs)?;
        }
    }
}

/// Every batch size from 1 to 20 (so 1 to 2.5 times the widest kernel), with
/// round counts that differ inside each batch and lanes that refill.
#[test]
fn every_batch_size_with_mixed_rounds_on_every_backend() {
    let mut engines: Vec<Engine> = Backend::ALL
        .into_iter()
        .filter_map(Engine::with_backend)
        .collect();
    engines.extend((1..=8).filter_map(Engine::with_sha_ni_streams));
    engines.push(Engine::detect().with_costs(&Engine::detect().measure(50)));
    for n in 1..=20u32 {
        let owned: Vec<Owned> = (0..n)
            .map(|i| {
                let password = vec![i as u8; (i as usize * 37) % 150];
                let salt = vec![0xa5 ^ i as u8; (i as usize * 11) % 70];
                (password, salt, 1 + (i * 7 + n) % 13)
            })
            .collect();
        for &engine in &engines {
            check(engine, &owned).unwrap();
        }
    }
}

/// One long job among short ones: the short ones finish and refill (or
/// narrow) while the long one keeps running.
#[test]
fn one_long_job_among_short_ones() {
    let mut owned: Vec<Owned> = (0..11u8)
        .map(|i| (vec![i; 9], vec![i; 16], 1 + u32::from(i % 3)))
        .collect();
    owned.insert(3, (b"long".to_vec(), b"tail".to_vec(), 700));
    for backend in Backend::ALL {
        if let Some(engine) = Engine::with_backend(backend) {
            check(engine, &owned).unwrap();
        }
    }
    for engine in (1..=4).filter_map(Engine::with_sha_ni_streams) {
        check(engine, &owned).unwrap();
    }
}

/// Password lengths around the block size and the key-hashing rule, salt
/// lengths around the padding boundaries of U1's first compression.
#[test]
fn block_boundaries() {
    let mut owned = Vec::new();
    for len in [
        0usize, 1, 31, 32, 33, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129,
    ] {
        owned.push((vec![0x42; len], b"salt".to_vec(), 3));
        owned.push((b"password".to_vec(), vec![0x17; len], 2));
    }
    for backend in Backend::ALL {
        if let Some(engine) = Engine::with_backend(backend) {
            check(engine, &owned).unwrap();
        }
    }
}

/// The AVX-512 engines, when this CPU runs them: one vector, two interleaved,
/// and the detected engine (which hands small batches, and the last jobs of
/// larger ones, to SHA-NI when the CPU has it). `None`, with a note, without
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
fn avx512_engines() -> Option<Vec<Engine>> {
    if !std::is_x86_feature_detected!("avx512f") {
        eprintln!("note: this CPU has no AVX-512F; the AVX-512 backend is not tested");
        assert!(!Backend::Avx512.is_supported());
        return None;
    }
    let mut engines: Vec<Engine> = [16, 32]
        .into_iter()
        .map(|lanes| Engine::with_avx512_lanes(lanes).expect("the CPU has AVX-512F"))
        .collect();
    engines.push(engine(Backend::Avx512));
    assert_eq!(Engine::detect().backend(), Backend::Avx512);
    engines.push(Engine::detect());
    Some(engines)
}

/// Also compares with the portable path, job by job.
#[cfg(target_arch = "x86_64")]
fn check_with_portable(engine: Engine, owned: &[Owned]) {
    check(engine, owned).unwrap();
    let jobs: Vec<Job> = owned.iter().map(|(p, s, c)| Job::new(p, s, *c)).collect();
    assert_eq!(
        engine.derive_vec(&jobs).unwrap(),
        engine_portable().derive_vec(&jobs).unwrap(),
        "{engine:?}, {} jobs",
        jobs.len()
    );
}

#[cfg(target_arch = "x86_64")]
fn engine_portable() -> Engine {
    engine(Backend::Portable)
}

#[cfg(target_arch = "x86_64")]
proptest! {
    #![proptest_config(config(24))]
    #[test]
    fn avx512_matches_the_pbkdf2_crate(
        jobs in vec((bytes(70, 1024), bytes(40, 300), 1..=12u32), 1..=40)
    ) {
        if let Some(engines) = avx512_engines() {
            for engine in engines {
                check(engine, &jobs)?;
            }
        }
    }
}

/// Every batch size from 1 to 40 (one vector, two, and past both), with round
/// counts that differ inside each batch (1 round among them, so jobs finish at
/// different times and lanes refill), passwords longer than the block and long
/// salts; then the same sizes with one round count for the whole batch.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_every_batch_size_to_40() {
    let Some(engines) = avx512_engines() else {
        return;
    };
    for n in 1..=40u32 {
        let mixed: Vec<Owned> = (0..n)
            .map(|i| {
                let password = vec![0x5a ^ i as u8; (i as usize * 37) % 150];
                let salt = vec![0xa5 ^ i as u8; (i as usize * 53 + n as usize) % 300];
                let rounds = [1, 7, 2, 19, 4, 1, 11, 3][(i + n) as usize % 8];
                (password, salt, rounds)
            })
            .collect();
        let even: Vec<Owned> = (0..n)
            .map(|i| (format!("pw {i}").into_bytes(), b"salt".to_vec(), 6))
            .collect();
        for &engine in &engines {
            check_with_portable(engine, &mixed);
            check_with_portable(engine, &even);
        }
    }
}

/// A long job in the second vector while the others finish early and refill,
/// and one in the first while the second vector empties.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_long_jobs_in_either_vector() {
    let Some(engines) = avx512_engines() else {
        return;
    };
    for long in [0, 5, 15, 16, 20, 31, 32, 36] {
        let owned: Vec<Owned> = (0..37u8)
            .map(|i| {
                let rounds = if usize::from(i) == long {
                    300
                } else {
                    1 + u32::from(i % 4)
                };
                (vec![i; 70], vec![i; 130], rounds)
            })
            .collect();
        for &engine in &engines {
            check_with_portable(engine, &owned);
        }
    }
}
