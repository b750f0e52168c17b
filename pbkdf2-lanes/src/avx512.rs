//! AVX-512 backend: sixteen jobs per `__m512i`, one job per 32-bit lane, and
//! two such vectors (32 jobs) interleaved round by round.
//!
//! As in the AVX2 kernel, every state word, schedule word and temporary is one
//! vector holding that word for sixteen jobs. AVX-512F removes most of AVX2's
//! instruction count: a rotation is one `vprord` instead of two shifts and an
//! XOR, and `vpternlogd` computes any function of three inputs, so Ch, Maj and
//! each Σ/σ (the XOR of three rotations or shifts) are one instruction each.
//! A round is 6 rotations, 4 ternary-logic operations and 7 additions, a
//! schedule word 4 rotations or shifts, 2 ternary-logic operations and 3
//! additions: about 1,560 vector operations per 16-lane compression.
//!
//! Within a round, the additions are ordered so that the chain from `e` to the
//! next `e` is short: `h + (K + W)` does not depend on this round's `e` and is
//! added first, then Ch (one operation after `e`), then Σ1 (two after); with
//! one vector, `d` is added early too, so `e' = (d + h + K + W + Ch) + Σ1` is
//! three operations after `e` (one more addition per round). Empty `asm!`
//! statements keep the compiler from regrouping the sums.
//!
//! What bounds it, as measured on AMD Zen 5: one vector is bound by that chain
//! (a rotation, the ternary logic and an addition take about 7 cycles in a
//! row there, so 64 rounds need some 470 cycles; the kernel takes about 700,
//! 2.4 operations per cycle). Two vectors interleaved give the core a second,
//! independent chain and bring the kernel near the vector units' throughput:
//! about 3.3 operations per cycle, of 4 (four pipes, of which two rotate or
//! shift); with them, the early `d` addition costs more than it saves. On an
//! Intel Xeon (family 6 model 167), which issues 512-bit integer operations on
//! two ports, those ports bound both widths: 1.71 operations per cycle with one
//! vector, 1.84 with two, of 2 (the crate's README has the figures).
//!
//! Two vectors need more than the 32 vector registers: some of the state and
//! schedule lives on the stack. The kernel keeps a 64-byte aligned object in
//! its frame so that the frame, and every 64-byte spill, is aligned (a
//! variant whose spills straddled cache lines ran three times slower).
//!
//! Words 8..16 of every block are the fixed padding; they are written as
//! constants, so the compiler folds their `W + K` and the parts of the
//! message schedule that only involve them.

use core::arch::x86_64::{
    __m512i, _mm512_add_epi32, _mm512_ror_epi32, _mm512_set1_epi32, _mm512_setzero_si512,
    _mm512_srli_epi32, _mm512_ternarylogic_epi32, _mm512_xor_si512,
};

use crate::prep::{Chain, FIXED_TAIL, K};

/// Jobs per vector.
pub(crate) const VECTOR: usize = 16;
/// The most vectors interleaved in one kernel.
pub(crate) const MAX_VECTORS: usize = 2;
/// The most jobs in flight: two vectors.
pub(crate) const MAX_LANES: usize = VECTOR * MAX_VECTORS;

/// Whether this CPU runs the kernels of this module (everything they use is
/// AVX-512 Foundation).
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
}

/// One state word of up to 32 jobs: `row[v][i]` is lane `i` of vector `v`.
type Row = [[u32; VECTOR]; MAX_VECTORS];

/// The resident jobs' state, word-major: `inner[w]` holds word `w` of every
/// lane's inner mid-state. Lanes `0..n` hold the `n` resident chains in
/// order, so a kernel on the first `v` vectors runs lanes `0..16 v`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Lanes {
    inner: [Row; 8],
    outer: [Row; 8],
    u: [Row; 8],
    t: [Row; 8],
}

impl Lanes {
    fn put(&mut self, lane: usize, c: &Chain) {
        let (v, i) = (lane / VECTOR, lane % VECTOR);
        for w in 0..8 {
            self.inner[w][v][i] = c.inner[w];
            self.outer[w][v][i] = c.outer[w];
            self.u[w][v][i] = c.u[w];
            self.t[w][v][i] = c.t[w];
        }
    }
}

/// Vector `v` of each of the eight rows.
#[inline]
#[target_feature(enable = "avx512f")]
fn load(rows: &[Row; 8], v: usize) -> [__m512i; 8] {
    let mut out = [_mm512_setzero_si512(); 8];
    for (out, row) in out.iter_mut().zip(rows) {
        // SAFETY: both types are 64 bytes of plain integer data with no
        // invalid bit patterns; `transmute` copies the value, so alignment is
        // not needed.
        *out = unsafe { core::mem::transmute::<[u32; VECTOR], __m512i>(row[v]) };
    }
    out
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store(rows: &mut [Row; 8], v: usize, x: [__m512i; 8]) {
    for (row, x) in rows.iter_mut().zip(x) {
        // SAFETY: as in `load`, the reverse direction.
        row[v] = unsafe { core::mem::transmute::<__m512i, [u32; VECTOR]>(x) };
    }
}

// Macros rather than helper functions: the kernel then costs no extra calls
// when the crate is built without optimisation (tests).
macro_rules! add {
    ($a:expr, $b:expr) => {
        _mm512_add_epi32($a, $b)
    };
}

macro_rules! splat {
    ($x:expr) => {
        _mm512_set1_epi32($x as i32)
    };
}

/// `x`, unchanged, through an empty `asm!`: the compiler cannot see that it
/// is the sum it was computed as, so it keeps the additions grouped as
/// written (its own reassociation lengthens the chain from one round's `e`
/// to the next).
macro_rules! pin {
    ($x:expr) => {{
        let mut x: __m512i = $x;
        // SAFETY: the template is only an assembler comment: nothing is
        // executed, no memory, stack or flag is touched, and the register
        // holds `x` unchanged.
        unsafe {
            core::arch::asm!(
                "/* {x} */",
                x = inout(zmm_reg) x,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        x
    }};
}

/// `a ^ b ^ c` in one `vpternlogd`.
macro_rules! xor3 {
    ($a:expr, $b:expr, $c:expr) => {
        _mm512_ternarylogic_epi32::<0x96>($a, $b, $c)
    };
}

/// Σ0(a) = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22).
macro_rules! big_sigma0 {
    ($a:expr) => {{
        let a = $a;
        xor3!(
            _mm512_ror_epi32::<2>(a),
            _mm512_ror_epi32::<13>(a),
            _mm512_ror_epi32::<22>(a)
        )
    }};
}

/// Σ1(e) = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25).
macro_rules! big_sigma1 {
    ($e:expr) => {{
        let e = $e;
        xor3!(
            _mm512_ror_epi32::<6>(e),
            _mm512_ror_epi32::<11>(e),
            _mm512_ror_epi32::<25>(e)
        )
    }};
}

/// σ0(x) = rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3).
macro_rules! small_sigma0 {
    ($x:expr) => {{
        let x = $x;
        xor3!(
            _mm512_ror_epi32::<7>(x),
            _mm512_ror_epi32::<18>(x),
            _mm512_srli_epi32::<3>(x)
        )
    }};
}

/// σ1(x) = rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10).
macro_rules! small_sigma1 {
    ($x:expr) => {{
        let x = $x;
        xor3!(
            _mm512_ror_epi32::<17>(x),
            _mm512_ror_epi32::<19>(x),
            _mm512_srli_epi32::<10>(x)
        )
    }};
}

/// One compression per lane of the fixed-layout block `msg || padding`,
/// starting from `mid`, on `N` vectors at once; the 64 rounds are fully
/// unrolled and each round is issued for every vector in turn.
// The last rounds' writes to the schedule ring are dead; the macro is
// uniform on purpose and the compiler drops them.
#[allow(unused_assignments)]
#[inline(never)]
#[target_feature(enable = "avx512f")]
fn compress<const N: usize>(mid: &[[__m512i; 8]; N], msg: &[[__m512i; 8]; N]) -> [[__m512i; 8]; N] {
    // A 64-byte aligned object kept in the frame: the frame is then aligned to
    // 64 bytes from the start, and so are the registers spilled to it (without
    // it, 512-bit spills may straddle cache lines).
    let mut anchor = _mm512_setzero_si512();
    core::hint::black_box(&mut anchor);
    let mut w = [[_mm512_setzero_si512(); 16]; N];
    for (w, msg) in w.iter_mut().zip(msg) {
        w[..8].copy_from_slice(msg);
        for (w, tail) in w[8..].iter_mut().zip(FIXED_TAIL) {
            *w = splat!(tail);
        }
    }
    let mut a = [_mm512_setzero_si512(); N];
    let (mut b, mut c, mut d, mut e, mut f, mut g, mut h) = (a, a, a, a, a, a, a);
    for s in 0..N {
        [a[s], b[s], c[s], d[s], e[s], f[s], g[s], h[s]] = mid[s];
    }
    macro_rules! round {
        ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident, $g:ident, $h:ident, $t:expr) => {{
            let t: usize = $t;
            for s in 0..N {
                let w = &mut w[s];
                let wt = if t < 16 {
                    w[t]
                } else {
                    let x = add!(
                        add!(
                            small_sigma1!(w[t.wrapping_sub(2) & 15]),
                            w[t.wrapping_sub(7) & 15]
                        ),
                        add!(small_sigma0!(w[t.wrapping_sub(15) & 15]), w[t & 15])
                    );
                    w[t & 15] = x;
                    x
                };
                // Off the chain: h + K + W (and, with one vector, d + that).
                let hkw = pin!(add!($h[s], add!(splat!(K[t]), wt)));
                let dhkw = if N == 1 { pin!(add!($d[s], hkw)) } else { hkw };
                // Ch is ready one operation after e, Σ1 two.
                let ch = _mm512_ternarylogic_epi32::<0xCA>($e[s], $f[s], $g[s]);
                let s1 = big_sigma1!($e[s]);
                let t1 = pin!(add!(pin!(add!(hkw, ch)), s1));
                $d[s] = if N == 1 {
                    // e' = (d + h + K + W + Ch) + Σ1: three operations after
                    // e, for one more addition per round.
                    add!(pin!(add!(dhkw, ch)), s1)
                } else {
                    // Two vectors keep the vector units busy with each
                    // other's work: the addition saved counts more than the
                    // fourth operation on the chain.
                    add!($d[s], t1)
                };
                // a' = T1 + Maj + Σ0: Maj and T1 first, Σ0 (two operations
                // after a) last.
                let maj = _mm512_ternarylogic_epi32::<0xE8>($a[s], $b[s], $c[s]);
                $h[s] = add!(pin!(add!(maj, t1)), big_sigma0!($a[s]));
            }
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
    let mut out = [[_mm512_setzero_si512(); 8]; N];
    for s in 0..N {
        out[s] = [
            add!(a[s], mid[s][0]),
            add!(b[s], mid[s][1]),
            add!(c[s], mid[s][2]),
            add!(d[s], mid[s][3]),
            add!(e[s], mid[s][4]),
            add!(f[s], mid[s][5]),
            add!(g[s], mid[s][6]),
            add!(h[s], mid[s][7]),
        ];
    }
    out
}

/// `iters` PBKDF2 rounds (two compressions each) on the lanes of the first
/// `N` vectors.
#[target_feature(enable = "avx512f")]
fn run<const N: usize>(st: &mut Lanes, iters: u32) {
    let mut inner = [[_mm512_setzero_si512(); 8]; N];
    let (mut outer, mut u, mut t) = (inner, inner, inner);
    for v in 0..N {
        inner[v] = load(&st.inner, v);
        outer[v] = load(&st.outer, v);
        u[v] = load(&st.u, v);
        t[v] = load(&st.t, v);
    }
    for _ in 0..iters {
        let h = compress(&inner, &u);
        u = compress(&outer, &h);
        for (t, u) in t.iter_mut().zip(&u) {
            for (t, u) in t.iter_mut().zip(u) {
                *t = _mm512_xor_si512(*t, *u);
            }
        }
    }
    for v in 0..N {
        store(&mut st.u, v, u[v]);
        store(&mut st.t, v, t[v]);
    }
}

/// Runs `iters` rounds on every chain (1 to 16 per vector) with `vectors` (1
/// or 2) interleaved vectors; each chain's `u` and `t` are updated and its
/// `left` is not touched. Lanes past the chains compute on zeros (that costs
/// nothing extra: the vector is the unit of work) and are ignored; chains
/// past the vectors' lanes are not run.
///
/// # Safety
/// [`available`] must have returned true on this CPU.
pub(crate) unsafe fn run_chains(chains: &mut [Chain], iters: u32, vectors: usize) {
    let mut st = Lanes {
        inner: [[[0; VECTOR]; MAX_VECTORS]; 8],
        outer: [[[0; VECTOR]; MAX_VECTORS]; 8],
        u: [[[0; VECTOR]; MAX_VECTORS]; 8],
        t: [[[0; VECTOR]; MAX_VECTORS]; 8],
    };
    let vectors = vectors.clamp(1, MAX_VECTORS);
    let n = chains.len().min(vectors * VECTOR);
    for (lane, chain) in chains[..n].iter().enumerate() {
        st.put(lane, chain);
    }
    if vectors == 2 {
        // SAFETY: this function's caller guarantees `available()`.
        unsafe { run::<2>(&mut st, iters) };
    } else {
        // SAFETY: this function's caller guarantees `available()`.
        unsafe { run::<1>(&mut st, iters) };
    }
    for (lane, chain) in chains[..n].iter_mut().enumerate() {
        let (v, i) = (lane / VECTOR, lane % VECTOR);
        chain.u = core::array::from_fn(|w| st.u[w][v][i]);
        chain.t = core::array::from_fn(|w| st.t[w][v][i]);
    }
}
