//! AVX2 backend: eight jobs side by side, one job per 32-bit lane of each
//! `__m256i`.
//!
//! This is the path for x86-64 servers without the SHA extensions. SHA-256 has
//! no instruction-level parallelism to speak of inside one compression, but
//! eight independent compressions map one-to-one onto the eight lanes: every
//! state word, schedule word and temporary is one vector holding that word for
//! the eight jobs. AVX2 has no vector rotate, so each rotation is two shifts
//! and an XOR; the shifts (two ports on recent cores) and the sheer count of
//! vector ALU operations per round are what bound this kernel.
//!
//! Words 8..16 of every block are the fixed padding; they are written as
//! constants, so the compiler folds their `W + K` and the parts of the
//! message schedule that only involve them.

use core::arch::x86_64::{
    __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_set1_epi32, _mm256_setzero_si256,
    _mm256_slli_epi32, _mm256_srli_epi32, _mm256_xor_si256,
};

use crate::prep::{Chain, FIXED_TAIL, K};

/// Jobs per kernel call.
pub(crate) const LANES: usize = 8;

/// Whether this CPU runs the kernels of this module.
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Eight jobs' state, word-major: `inner[w][lane]` is word `w` of that lane's
/// inner mid-state (so each row is one vector).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Lanes {
    inner: [[u32; LANES]; 8],
    outer: [[u32; LANES]; 8],
    u: [[u32; LANES]; 8],
    t: [[u32; LANES]; 8],
}

#[inline]
#[target_feature(enable = "avx2")]
fn load(rows: &[[u32; LANES]; 8]) -> [__m256i; 8] {
    // SAFETY: both types are 256 bytes of plain integer data with no invalid
    // bit patterns; `transmute` copies the value, so alignment is not needed.
    unsafe { core::mem::transmute::<[[u32; LANES]; 8], [__m256i; 8]>(*rows) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store(rows: &mut [[u32; LANES]; 8], v: [__m256i; 8]) {
    // SAFETY: as in `load`, the reverse direction.
    *rows = unsafe { core::mem::transmute::<[__m256i; 8], [[u32; LANES]; 8]>(v) };
}

// Macros rather than helper functions: the kernel then costs no extra calls
// when the crate is built without optimisation (tests).
macro_rules! add {
    ($a:expr, $b:expr) => {
        _mm256_add_epi32($a, $b)
    };
}

macro_rules! xor {
    ($a:expr, $b:expr) => {
        _mm256_xor_si256($a, $b)
    };
}

/// `rotr(x, n)`, written with its two shifts (`$l` = 32 - `$r`).
macro_rules! rotr {
    ($x:expr, $r:literal, $l:literal) => {
        _mm256_xor_si256(_mm256_srli_epi32::<$r>($x), _mm256_slli_epi32::<$l>($x))
    };
}

#[inline]
#[target_feature(enable = "avx2")]
fn big_sigma0(a: __m256i) -> __m256i {
    xor!(xor!(rotr!(a, 2, 30), rotr!(a, 13, 19)), rotr!(a, 22, 10))
}

#[inline]
#[target_feature(enable = "avx2")]
fn big_sigma1(e: __m256i) -> __m256i {
    xor!(xor!(rotr!(e, 6, 26), rotr!(e, 11, 21)), rotr!(e, 25, 7))
}

#[inline]
#[target_feature(enable = "avx2")]
fn small_sigma0(x: __m256i) -> __m256i {
    xor!(
        xor!(rotr!(x, 7, 25), rotr!(x, 18, 14)),
        _mm256_srli_epi32::<3>(x)
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn small_sigma1(x: __m256i) -> __m256i {
    xor!(
        xor!(rotr!(x, 17, 15), rotr!(x, 19, 13)),
        _mm256_srli_epi32::<10>(x)
    )
}

/// One compression per lane of the fixed-layout block `msg || padding`,
/// starting from `mid`; the 64 rounds are fully unrolled.
// The last rounds' writes to the schedule ring and to `bc` are dead; the
// macro is uniform on purpose and the compiler drops them.
#[allow(unused_assignments)]
#[inline(never)]
#[target_feature(enable = "avx2")]
fn compress8(mid: &[__m256i; 8], msg: &[__m256i; 8]) -> [__m256i; 8] {
    let mut w = [_mm256_setzero_si256(); 16];
    w[..8].copy_from_slice(msg);
    for (w, tail) in w[8..].iter_mut().zip(FIXED_TAIL) {
        *w = _mm256_set1_epi32(tail as i32);
    }
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *mid;
    // Maj(a, b, c) = ((a ^ b) & (b ^ c)) ^ b, and this round's b ^ c is the
    // previous round's a ^ b.
    let mut bc = xor!(b, c);
    macro_rules! round {
        ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident, $g:ident, $h:ident, $t:expr) => {{
            let t: usize = $t;
            let wt = if t < 16 {
                w[t]
            } else {
                let x = add!(
                    add!(small_sigma1(w[t.wrapping_sub(2) & 15]), w[t.wrapping_sub(7) & 15]),
                    add!(small_sigma0(w[t.wrapping_sub(15) & 15]), w[t & 15])
                );
                w[t & 15] = x;
                x
            };
            let kw = add!(_mm256_set1_epi32(K[t] as i32), wt);
            let ch = xor!(_mm256_and_si256(xor!($f, $g), $e), $g);
            let t1 = add!(add!($h, big_sigma1($e)), add!(ch, kw));
            $d = add!($d, t1);
            let ab = xor!($a, $b);
            let maj = xor!(_mm256_and_si256(ab, bc), $b);
            bc = ab;
            $h = add!(t1, add!(big_sigma0($a), maj));
        }};
    }
    macro_rules! rounds8 {
        ($base:expr) => {
            round!(a, b, c, d, e, f, g, h, $base);
            round!(h, a, b, c, d, e, f, g, $base + 1);
            round!(g, h, a, b, c, d, e, f, $base + 2);
            round!(f, g, h, a, b, c, d, e, $base + 3);
            round!(e, f, g, h, a, b, c, d, $base + 4);
            round!(d, e, f, g, h, a, b, c, $base + 5);
            round!(c, d, e, f, g, h, a, b, $base + 6);
            round!(b, c, d, e, f, g, h, a, $base + 7);
        };
    }
    rounds8!(0);
    rounds8!(8);
    rounds8!(16);
    rounds8!(24);
    rounds8!(32);
    rounds8!(40);
    rounds8!(48);
    rounds8!(56);
    [
        add!(a, mid[0]),
        add!(b, mid[1]),
        add!(c, mid[2]),
        add!(d, mid[3]),
        add!(e, mid[4]),
        add!(f, mid[5]),
        add!(g, mid[6]),
        add!(h, mid[7]),
    ]
}

/// `iters` PBKDF2 rounds (two compressions each) on all eight lanes.
#[target_feature(enable = "avx2")]
fn run(st: &mut Lanes, iters: u32) {
    let inner = load(&st.inner);
    let outer = load(&st.outer);
    let mut u = load(&st.u);
    let mut t = load(&st.t);
    for _ in 0..iters {
        let h = compress8(&inner, &u);
        u = compress8(&outer, &h);
        for (t, u) in t.iter_mut().zip(&u) {
            *t = xor!(*t, *u);
        }
    }
    store(&mut st.u, u);
    store(&mut st.t, t);
}

/// Runs `iters` rounds on every chain (1 to [`LANES`]); each chain's `u`
/// and `t` are updated and its `left` is not touched. Lanes past the chains
/// compute on zeros (that costs nothing extra: the eight lanes are one
/// vector) and are ignored; chains past the eighth are not run.
///
/// # Safety
/// [`available`] must have returned true on this CPU.
pub(crate) unsafe fn run_chains(chains: &mut [Chain], iters: u32) {
    let mut st = Lanes {
        inner: [[0; LANES]; 8],
        outer: [[0; LANES]; 8],
        u: [[0; LANES]; 8],
        t: [[0; LANES]; 8],
    };
    let n = chains.len().min(LANES);
    for (lane, c) in chains[..n].iter().enumerate() {
        for w in 0..8 {
            st.inner[w][lane] = c.inner[w];
            st.outer[w][lane] = c.outer[w];
            st.u[w][lane] = c.u[w];
            st.t[w][lane] = c.t[w];
        }
    }
    // SAFETY: this function's caller guarantees `available()` (AVX2).
    unsafe { run(&mut st, iters) };
    for (lane, c) in chains[..n].iter_mut().enumerate() {
        c.u = core::array::from_fn(|w| st.u[w][lane]);
        c.t = core::array::from_fn(|w| st.t[w][lane]);
    }
}
