//! Published PBKDF2-HMAC-SHA256 vectors, edge cases and the backend detection,
//! on every backend this CPU supports.

use pbkdf2_lanes::{
    AVX512_LANES, AVX512_MIN_JOBS, Backend, Engine, Error, Job, SHA_NI_STREAMS, pbkdf2_sha256,
};

/// Every engine this CPU can run: each backend, SHA-NI at every interleave,
/// AVX-512 at both widths, and the detected engine.
fn engines() -> Vec<Engine> {
    let mut v: Vec<Engine> = Backend::ALL
        .into_iter()
        .filter_map(Engine::with_backend)
        .collect();
    v.extend((1..=8).filter_map(Engine::with_sha_ni_streams));
    v.extend([16, 32].into_iter().filter_map(Engine::with_avx512_lanes));
    v.push(Engine::detect());
    v
}

fn hex(s: &str) -> [u8; 32] {
    let b: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    b[..32].try_into().unwrap()
}

/// (password, salt, rounds, first 32 bytes of DK)
const VECTORS: &[(&[u8], &[u8], u32, &str)] = &[
    // The widely cited PBKDF2-HMAC-SHA256 vectors (RFC 6070's inputs).
    (
        b"password",
        b"salt",
        1,
        "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b",
    ),
    (
        b"password",
        b"salt",
        2,
        "ae4d0c95af6b46d32d0adff928f06dd02a303f8ef3c251dfd6e2d85a95474c43",
    ),
    (
        b"password",
        b"salt",
        4096,
        "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a",
    ),
    (
        b"passwordPASSWORDpassword",
        b"saltSALTsaltSALTsaltSALTsaltSALTsalt",
        4096,
        "348c89dbcbd32b2f32d814b8116e84cf2b17347ebc1800181c4e2a1fb8dd53e1",
    ),
    // RFC 7914 section 11 (dkLen 64 there; T1 is its first 32 bytes).
    (
        b"passwd",
        b"salt",
        1,
        "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc",
    ),
    (
        b"Password",
        b"NaCl",
        80000,
        "4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56",
    ),
];

/// The fast kernels exist for x86-64 only.
#[cfg(target_arch = "x86_64")]
#[test]
fn fast_paths_are_detected_when_the_cpu_has_them() {
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
        return;
    };
    let Some(flags) = cpuinfo.lines().find(|l| l.starts_with("flags")) else {
        return;
    };
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let sha_ni = has("sha_ni") && has("ssse3") && has("sse4_1");
    if has("avx512f") {
        assert!(
            Backend::Avx512.is_supported(),
            "cpuinfo has avx512f but the backend is not detected"
        );
        let detected = Engine::detect();
        assert_eq!(detected.backend(), Backend::Avx512);
        assert_eq!(detected.lanes(), AVX512_LANES);
        // Small batches go to SHA-NI when the CPU has it.
        let small = if sha_ni {
            Backend::ShaNi
        } else {
            Backend::Avx512
        };
        assert_eq!(detected.backend_for(1), small);
        assert_eq!(detected.backend_for(AVX512_MIN_JOBS - 1), small);
        assert_eq!(detected.backend_for(AVX512_MIN_JOBS), Backend::Avx512);
        assert_eq!(detected.backend_for(1000), Backend::Avx512);
    }
    if sha_ni {
        assert!(
            Backend::ShaNi.is_supported(),
            "cpuinfo has sha_ni but the backend is not detected"
        );
        if !has("avx512f") {
            assert_eq!(Engine::detect().backend(), Backend::ShaNi);
            assert_eq!(Engine::detect().lanes(), SHA_NI_STREAMS);
        }
        let forced = Engine::with_backend(Backend::ShaNi).unwrap();
        assert_eq!(forced.lanes(), SHA_NI_STREAMS);
    }
    if has("avx2") {
        assert!(
            Backend::Avx2.is_supported(),
            "cpuinfo has avx2 but the backend is not detected"
        );
        assert_eq!(Engine::with_backend(Backend::Avx2).unwrap().lanes(), 8);
    }
    assert!(Backend::Portable.is_supported());
}

/// Unoptimised (a plain `cargo test` of this package) the AVX2 kernel takes
/// about 0.4 ms per round, so the 80,000-round vector runs on the detected
/// backend only; the benchmark cross-checks every backend at 10,000 and
/// 600,000 rounds against the `pbkdf2` crate.
const DEBUG_ROUND_LIMIT: u32 = 4096;

#[test]
fn published_vectors_one_by_one_on_every_backend() {
    for engine in engines() {
        for &(p, s, c, dk) in VECTORS.iter().filter(|v| v.2 <= 2) {
            let got = engine.derive_vec(&[Job::new(p, s, c)]).unwrap();
            assert_eq!(got, [hex(dk)], "{engine:?} {c} rounds");
        }
    }
}

#[test]
fn published_vectors_as_one_batch_on_every_backend() {
    let vectors: Vec<_> = VECTORS
        .iter()
        .filter(|v| v.2 <= DEBUG_ROUND_LIMIT)
        .collect();
    let jobs: Vec<Job> = vectors
        .iter()
        .map(|&&(p, s, c, _)| Job::new(p, s, c))
        .collect();
    let want: Vec<[u8; 32]> = vectors.iter().map(|v| hex(v.3)).collect();
    for engine in engines() {
        assert_eq!(engine.derive_vec(&jobs).unwrap(), want, "{engine:?}");
    }
}

#[test]
fn published_vectors_on_the_detected_backend() {
    let engine = Engine::detect();
    for &(p, s, c, dk) in VECTORS {
        assert_eq!(
            engine.derive_vec(&[Job::new(p, s, c)]).unwrap(),
            [hex(dk)],
            "{engine:?} {c} rounds"
        );
    }
}

#[test]
fn free_function() {
    let (p, s, c, dk) = VECTORS[2];
    assert_eq!(pbkdf2_sha256(p, s, c).unwrap(), hex(dk));
    assert_eq!(pbkdf2_sha256(p, s, 0), Err(Error::ZeroRounds { job: 0 }));
}

#[test]
fn empty_batch() {
    for engine in engines() {
        assert_eq!(engine.derive_vec(&[]).unwrap(), Vec::<[u8; 32]>::new());
        engine.derive(&[], &mut []).unwrap();
    }
}

#[test]
fn errors_write_nothing() {
    let jobs = [Job::new(b"a", b"b", 3), Job::new(b"c", b"d", 0)];
    for engine in engines() {
        let mut out = [[7u8; 32]; 2];
        assert_eq!(
            engine.derive(&jobs, &mut out),
            Err(Error::ZeroRounds { job: 1 })
        );
        assert_eq!(out, [[7u8; 32]; 2]);
        let mut short = [[7u8; 32]; 1];
        assert_eq!(
            engine.derive(&jobs[..1], &mut []),
            Err(Error::OutputLength {
                jobs: 1,
                outputs: 0
            })
        );
        assert_eq!(
            engine.derive(&[], &mut short),
            Err(Error::OutputLength {
                jobs: 0,
                outputs: 1
            })
        );
        assert_eq!(short, [[7u8; 32]; 1]);
    }
}

#[test]
fn forcing_and_naming() {
    assert_eq!(Backend::Avx512.name(), "avx512");
    assert_eq!(Backend::ShaNi.name(), "sha-ni");
    assert_eq!(Backend::Avx2.name(), "avx2");
    assert_eq!(Backend::Portable.name(), "portable");
    for b in Backend::ALL {
        match Engine::with_backend(b) {
            Some(e) => {
                assert!(b.is_supported());
                assert_eq!(e.backend(), b);
                // A forced backend runs every batch size itself.
                for jobs in [0, 1, 5, 100] {
                    assert_eq!(e.backend_for(jobs), b);
                }
            }
            None => assert!(!b.is_supported()),
        }
    }
    assert_eq!(Engine::with_backend(Backend::Portable).unwrap().lanes(), 1);
    assert_eq!(Engine::with_sha_ni_streams(0), None);
    assert_eq!(Engine::with_sha_ni_streams(9), None);
    if let Some(e) = Engine::with_sha_ni_streams(3) {
        assert_eq!((e.backend(), e.lanes()), (Backend::ShaNi, 3));
    }
    for lanes in [0, 1, 8, 15, 17, 31, 33, 48, 64] {
        assert_eq!(Engine::with_avx512_lanes(lanes), None);
    }
    for lanes in [16, 32] {
        assert_eq!(
            Engine::with_avx512_lanes(lanes).map(|e| (e.backend(), e.lanes())),
            Backend::Avx512
                .is_supported()
                .then_some((Backend::Avx512, lanes))
        );
    }
}
