//! SHA-NI backend: 1 to 8 independent jobs ("streams") advanced together on
//! the x86 SHA extensions.
//!
//! One SHA-256 compression is a chain of 32 dependent `sha256rnds2`
//! instructions, so a single stream is bound by that instruction's latency
//! and leaves the SHA unit idle most of the time. Independent jobs have no
//! data dependency on each other: the kernel below is written quad of rounds
//! by quad of rounds, each quad issued for every stream in turn, so the
//! out-of-order core overlaps the streams' chains until the SHA unit's
//! throughput, not its latency, is the limit.
//!
//! The state stays in the extension's register layout (ABEF, CDGH) for the
//! whole loop; the message words of the next block are regrouped from it with
//! two shuffles per register. Words 8..16 of every block are the fixed padding,
//! so the first 16 rounds need no schedule work for them and their `W + K`
//! (and one `sha256msg1` of two constant groups) are compile-time constants.

use core::arch::x86_64::{
    __m128i, _mm_add_epi32, _mm_alignr_epi8, _mm_extract_epi32, _mm_set_epi32, _mm_setzero_si128,
    _mm_sha256msg1_epu32, _mm_sha256msg2_epu32, _mm_sha256rnds2_epu32, _mm_shuffle_epi32,
    _mm_unpackhi_epi64, _mm_unpacklo_epi64, _mm_xor_si128,
};

use crate::prep::{Chain, FIXED_TAIL, K};

/// The widest interleave compiled.
pub(crate) const MAX_STREAMS: usize = 8;

/// Whether this CPU runs the kernels of this module.
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("sha")
        && std::is_x86_feature_detected!("sse2")
        && std::is_x86_feature_detected!("ssse3")
        && std::is_x86_feature_detected!("sse4.1")
}

/// A SHA-256 state in the layout of the SHA extensions: lanes 3..0 of `abef`
/// hold A, B, E, F and those of `cdgh` hold C, D, G, H.
#[derive(Clone, Copy)]
struct Pair {
    abef: __m128i,
    cdgh: __m128i,
}

impl Pair {
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn zero() -> Self {
        Pair {
            abef: _mm_setzero_si128(),
            cdgh: _mm_setzero_si128(),
        }
    }

    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn pack(s: &[u32; 8]) -> Self {
        let w = s.map(|x| x as i32);
        Pair {
            abef: _mm_set_epi32(w[0], w[1], w[4], w[5]),
            cdgh: _mm_set_epi32(w[2], w[3], w[6], w[7]),
        }
    }

    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn unpack(self) -> [u32; 8] {
        let (x, y) = (self.abef, self.cdgh);
        [
            _mm_extract_epi32::<3>(x),
            _mm_extract_epi32::<2>(x),
            _mm_extract_epi32::<3>(y),
            _mm_extract_epi32::<2>(y),
            _mm_extract_epi32::<1>(x),
            _mm_extract_epi32::<0>(x),
            _mm_extract_epi32::<1>(y),
            _mm_extract_epi32::<0>(y),
        ]
        .map(|w| w as u32)
    }
}

const fn small_sigma0(x: u32) -> u32 {
    x.rotate_right(7) ^ x.rotate_right(18) ^ (x >> 3)
}

const fn add4(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
    [
        a[0].wrapping_add(b[0]),
        a[1].wrapping_add(b[1]),
        a[2].wrapping_add(b[2]),
        a[3].wrapping_add(b[3]),
    ]
}

const fn k_group(q: usize) -> [u32; 4] {
    [K[4 * q], K[4 * q + 1], K[4 * q + 2], K[4 * q + 3]]
}

/// Message words 8..12 and 12..16 of the fixed-layout block.
const G2: [u32; 4] = [FIXED_TAIL[0], FIXED_TAIL[1], FIXED_TAIL[2], FIXED_TAIL[3]];
const G3: [u32; 4] = [FIXED_TAIL[4], FIXED_TAIL[5], FIXED_TAIL[6], FIXED_TAIL[7]];
/// `W + K` of rounds 8..16.
const WK2: [u32; 4] = add4(G2, k_group(2));
const WK3: [u32; 4] = add4(G3, k_group(3));
/// `sha256msg1(G2, G3)`: `W[i] + σ0(W[i + 1])` for i = 8..12.
const MSG1_G2_G3: [u32; 4] = [
    G2[0].wrapping_add(small_sigma0(G2[1])),
    G2[1].wrapping_add(small_sigma0(G2[2])),
    G2[2].wrapping_add(small_sigma0(G2[3])),
    G2[3].wrapping_add(small_sigma0(G3[0])),
];

/// Four words as a vector, word 0 in lane 0 (the message layout).
#[inline]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn vec4(w: [u32; 4]) -> __m128i {
    _mm_set_epi32(w[3] as i32, w[2] as i32, w[1] as i32, w[0] as i32)
}

/// Four rounds: two `sha256rnds2`, the second on the upper half of `wk`.
#[inline]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn rounds4(s: &mut Pair, wk: __m128i) {
    s.cdgh = _mm_sha256rnds2_epu32(s.cdgh, s.abef, wk);
    s.abef = _mm_sha256rnds2_epu32(s.abef, s.cdgh, _mm_shuffle_epi32::<0x0E>(wk));
}

/// The next four schedule words from the last sixteen (`w0` oldest).
#[inline]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn next_group(w0: __m128i, w1: __m128i, w2: __m128i, w3: __m128i) -> __m128i {
    let t = _mm_add_epi32(_mm_sha256msg1_epu32(w0, w1), _mm_alignr_epi8::<4>(w3, w2));
    _mm_sha256msg2_epu32(t, w3)
}

/// Words 0..4 and 4..8 of the block that carries the digest `d`.
#[inline]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn message(d: Pair) -> [__m128i; 2] {
    [
        _mm_shuffle_epi32::<0xB1>(_mm_unpackhi_epi64(d.abef, d.cdgh)),
        _mm_shuffle_epi32::<0xB1>(_mm_unpacklo_epi64(d.abef, d.cdgh)),
    ]
}

/// One compression per stream of the fixed-layout block `msg || padding`,
/// starting from `mid`.
#[inline]
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn compress<const N: usize>(mid: &[Pair; N], msg: &[[__m128i; 2]; N]) -> [Pair; N] {
    let mut st = *mid;
    let mut w = [[_mm_setzero_si128(); 4]; N];
    for s in 0..N {
        w[s] = [msg[s][0], msg[s][1], vec4(G2), vec4(G3)];
    }
    for s in 0..N {
        rounds4(&mut st[s], _mm_add_epi32(w[s][0], vec4(k_group(0))));
    }
    for s in 0..N {
        rounds4(&mut st[s], _mm_add_epi32(w[s][1], vec4(k_group(1))));
    }
    for s in st.iter_mut() {
        rounds4(s, vec4(WK2));
    }
    for s in st.iter_mut() {
        rounds4(s, vec4(WK3));
    }
    // Quad q computes schedule group q into ring slot q % 4.
    macro_rules! quad {
        ($q:literal) => {
            for s in 0..N {
                let g = next_group(
                    w[s][$q % 4],
                    w[s][($q + 1) % 4],
                    w[s][($q + 2) % 4],
                    w[s][($q + 3) % 4],
                );
                w[s][$q % 4] = g;
                rounds4(&mut st[s], _mm_add_epi32(g, vec4(k_group($q))));
            }
        };
    }
    quad!(4);
    quad!(5);
    // Group 6 would take sha256msg1 of the two constant groups.
    for s in 0..N {
        let t = _mm_add_epi32(vec4(MSG1_G2_G3), _mm_alignr_epi8::<4>(w[s][1], w[s][0]));
        let g = _mm_sha256msg2_epu32(t, w[s][1]);
        w[s][2] = g;
        rounds4(&mut st[s], _mm_add_epi32(g, vec4(k_group(6))));
    }
    quad!(7);
    quad!(8);
    quad!(9);
    quad!(10);
    quad!(11);
    quad!(12);
    quad!(13);
    quad!(14);
    quad!(15);
    for s in 0..N {
        st[s].abef = _mm_add_epi32(st[s].abef, mid[s].abef);
        st[s].cdgh = _mm_add_epi32(st[s].cdgh, mid[s].cdgh);
    }
    st
}

/// `iters` PBKDF2 rounds (two compressions each) on every stream. The
/// chains' plain words are converted to [`Pair`] layout on entry and back on
/// exit.
#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
fn run<const N: usize>(streams: &mut [Chain; N], iters: u32) {
    let mut inner = [Pair::zero(); N];
    let mut outer = [Pair::zero(); N];
    let mut u = [Pair::zero(); N];
    let mut t = [Pair::zero(); N];
    for s in 0..N {
        inner[s] = Pair::pack(&streams[s].inner);
        outer[s] = Pair::pack(&streams[s].outer);
        u[s] = Pair::pack(&streams[s].u);
        t[s] = Pair::pack(&streams[s].t);
    }
    let mut m = [[_mm_setzero_si128(); 2]; N];
    for _ in 0..iters {
        for s in 0..N {
            m[s] = message(u[s]);
        }
        let h = compress(&inner, &m);
        for s in 0..N {
            m[s] = message(h[s]);
        }
        u = compress(&outer, &m);
        for s in 0..N {
            t[s].abef = _mm_xor_si128(t[s].abef, u[s].abef);
            t[s].cdgh = _mm_xor_si128(t[s].cdgh, u[s].cdgh);
        }
    }
    for s in 0..N {
        streams[s].u = u[s].unpack();
        streams[s].t = t[s].unpack();
    }
}

/// Runs `iters` rounds on every chain (1 to [`MAX_STREAMS`] of them), with
/// the kernel of that many streams; each chain's `u` and `t` are updated and
/// its `left` is not touched. More chains than [`MAX_STREAMS`] are not run.
///
/// # Safety
/// [`available`] must have returned true on this CPU.
pub(crate) unsafe fn run_chains(chains: &mut [Chain], iters: u32) {
    macro_rules! width {
        ($($n:literal)*) => {
            match chains.len() {
                $($n => {
                    if let Some(s) = chains.first_chunk_mut::<$n>() {
                        // SAFETY: the caller guarantees `available()`: the SHA,
                        // SSE2, SSSE3 and SSE4.1 features `run` is compiled for.
                        unsafe { run(s, iters) }
                    }
                })*
                _ => {}
            }
        };
    }
    width!(1 2 3 4 5 6 7 8);
}
