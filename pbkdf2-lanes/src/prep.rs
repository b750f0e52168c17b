//! The generic (once per job) part of PBKDF2-HMAC-SHA256: the HMAC key rule, the
//! two pad mid-states and the first block U1 = HMAC(P, salt || INT(1)), all on
//! `sha2`'s compression function. Also the fixed-layout block used by every later
//! round, shared by all backends.

use sha2::block_api::compress256;

/// SHA-256 initial hash value (FIPS 180-4, 5.3.3).
pub(crate) const IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// SHA-256 round constants (FIPS 180-4, 4.2.2), for the x86-64 kernels.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const K: [u32; 64] = [
    0x428a_2f98,
    0x7137_4491,
    0xb5c0_fbcf,
    0xe9b5_dba5,
    0x3956_c25b,
    0x59f1_11f1,
    0x923f_82a4,
    0xab1c_5ed5,
    0xd807_aa98,
    0x1283_5b01,
    0x2431_85be,
    0x550c_7dc3,
    0x72be_5d74,
    0x80de_b1fe,
    0x9bdc_06a7,
    0xc19b_f174,
    0xe49b_69c1,
    0xefbe_4786,
    0x0fc1_9dc6,
    0x240c_a1cc,
    0x2de9_2c6f,
    0x4a74_84aa,
    0x5cb0_a9dc,
    0x76f9_88da,
    0x983e_5152,
    0xa831_c66d,
    0xb003_27c8,
    0xbf59_7fc7,
    0xc6e0_0bf3,
    0xd5a7_9147,
    0x06ca_6351,
    0x1429_2967,
    0x27b7_0a85,
    0x2e1b_2138,
    0x4d2c_6dfc,
    0x5338_0d13,
    0x650a_7354,
    0x766a_0abb,
    0x81c2_c92e,
    0x9272_2c85,
    0xa2bf_e8a1,
    0xa81a_664b,
    0xc24b_8b70,
    0xc76c_51a3,
    0xd192_e819,
    0xd699_0624,
    0xf40e_3585,
    0x106a_a070,
    0x19a4_c116,
    0x1e37_6c08,
    0x2748_774c,
    0x34b0_bcb5,
    0x391c_0cb3,
    0x4ed8_aa4a,
    0x5b9c_ca4f,
    0x682e_6ff3,
    0x748f_82ee,
    0x78a5_636f,
    0x84c8_7814,
    0x8cc7_0208,
    0x90be_fffa,
    0xa450_6ceb,
    0xbef9_a3f7,
    0xc671_78f2,
];

/// Words 8..16 of every block hashed inside the round loop: a 32-byte message
/// (the previous digest, words 0..8) that follows one 64-byte pad block, so the
/// SHA-256 padding is the bit `0x80000000`, zeros, and the length
/// (64 + 32) × 8 = 768 bits in the last word.
pub(crate) const FIXED_TAIL: [u32; 8] = [0x8000_0000, 0, 0, 0, 0, 0, 0, 768];

/// What one job needs before its round loop: the HMAC inner and outer
/// mid-states (SHA-256 state after the `K ^ ipad` and `K ^ opad` blocks) and
/// U1, which is also the initial value of the output block T1.
#[derive(Clone, Copy)]
pub(crate) struct Prepared {
    pub(crate) inner: [u32; 8],
    pub(crate) outer: [u32; 8],
    pub(crate) u1: [u32; 8],
}

fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    compress256(state, core::slice::from_ref(block));
}

/// Streaming SHA-256 that may start from a mid-state (used for long passwords
/// and for the salt, which can have any length).
struct Hasher {
    state: [u32; 8],
    buf: [u8; 64],
    pos: usize,
    /// Bytes already compressed into `state` (including any pad block).
    done: u64,
}

impl Hasher {
    fn new(state: [u32; 8], done: u64) -> Self {
        Hasher {
            state,
            buf: [0; 64],
            pos: 0,
            done,
        }
    }

    fn update(&mut self, mut data: &[u8]) {
        if self.pos > 0 {
            let take = (64 - self.pos).min(data.len());
            self.buf[self.pos..self.pos + take].copy_from_slice(&data[..take]);
            self.pos += take;
            data = &data[take..];
            if self.pos < 64 {
                return;
            }
            compress(&mut self.state, &self.buf);
            self.done = self.done.wrapping_add(64);
            self.pos = 0;
        }
        let (blocks, rest) = data.as_chunks::<64>();
        if !blocks.is_empty() {
            compress256(&mut self.state, blocks);
            self.done = self
                .done
                .wrapping_add(64u64.wrapping_mul(blocks.len() as u64));
        }
        self.buf[..rest.len()].copy_from_slice(rest);
        self.pos = rest.len();
    }

    fn finish(mut self) -> [u32; 8] {
        let bits = self.done.wrapping_add(self.pos as u64).wrapping_mul(8);
        self.buf[self.pos] = 0x80;
        self.buf[self.pos + 1..].fill(0);
        if self.pos >= 56 {
            compress(&mut self.state, &self.buf);
            self.buf.fill(0);
        }
        self.buf[56..].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &self.buf);
        self.state
    }
}

/// Big-endian bytes of a SHA-256 state (the digest, or T1 as output).
pub(crate) fn to_bytes(words: &[u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// The fixed-layout block: `digest || 0x80 || zeros || 768u64`.
pub(crate) fn fixed_block(digest: &[u32; 8]) -> [u8; 64] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(&to_bytes(digest));
    for (chunk, w) in block[32..].chunks_exact_mut(4).zip(&FIXED_TAIL) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    block
}

/// One compression of the fixed-layout block holding `digest`, from `mid`.
pub(crate) fn compress_fixed(mid: &[u32; 8], digest: &[u32; 8]) -> [u32; 8] {
    let mut state = *mid;
    compress(&mut state, &fixed_block(digest));
    state
}

/// The HMAC key rule (keys longer than the 64-byte block are hashed), the pad
/// mid-states, and U1 = HMAC(P, salt || INT(1)) through the generic path.
pub(crate) fn prepare(password: &[u8], salt: &[u8]) -> Prepared {
    let mut key = [0u8; 64];
    if password.len() > 64 {
        let mut h = Hasher::new(IV, 0);
        h.update(password);
        key[..32].copy_from_slice(&to_bytes(&h.finish()));
    } else {
        key[..password.len()].copy_from_slice(password);
    }
    let mut inner = IV;
    compress(&mut inner, &key.map(|b| b ^ 0x36));
    let mut outer = IV;
    compress(&mut outer, &key.map(|b| b ^ 0x5c));

    let mut h = Hasher::new(inner, 64);
    h.update(salt);
    h.update(&1u32.to_be_bytes());
    let inner_digest = h.finish();
    let u1 = compress_fixed(&outer, &inner_digest);
    Prepared { inner, outer, u1 }
}

/// A job inside the round loop: the rounds it still has to run, and its state
/// (both pad mid-states, the last U and the running XOR T, which is the key
/// once no round is left). Kernels take chains, run rounds on them in their
/// own layout, and hand them back.
#[derive(Clone, Copy, Default)]
pub(crate) struct Chain {
    pub(crate) left: u32,
    pub(crate) inner: [u32; 8],
    pub(crate) outer: [u32; 8],
    pub(crate) u: [u32; 8],
    pub(crate) t: [u32; 8],
}

impl Chain {
    /// The chain of a job: prepared, with rounds 2..=`rounds` still to run (none
    /// for a job of one round, whose key is U1).
    pub(crate) fn start(password: &[u8], salt: &[u8], rounds: u32) -> Chain {
        let p = prepare(password, salt);
        Chain {
            left: rounds.saturating_sub(1),
            inner: p.inner,
            outer: p.outer,
            u: p.u1,
            t: p.u1,
        }
    }

    /// The key, once no round is left.
    pub(crate) fn key(&self) -> [u8; 32] {
        to_bytes(&self.t)
    }
}
