//! Portable backend: one job at a time on `sha2`'s compression function
//! (`sha2::block_api::compress256`), which itself picks the best single-block
//! code `sha2` has for the target. Builds and works everywhere.

use crate::prep::{FIXED_TAIL, Prepared};
use sha2::block_api::compress256;

/// Rounds 2..=`rounds` of one job; returns T1.
pub(crate) fn run(p: &Prepared, rounds: u32) -> [u32; 8] {
    let mut u = p.u1;
    let mut t = u;
    // The tail (padding and length) is written once; each compression only
    // rewrites the first 32 bytes.
    let mut block = [0u8; 64];
    for (chunk, w) in block[32..].chunks_exact_mut(4).zip(&FIXED_TAIL) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    for _ in 1..rounds {
        put_digest(&mut block, &u);
        let mut inner = p.inner;
        compress256(&mut inner, core::slice::from_ref(&block));
        put_digest(&mut block, &inner);
        u = p.outer;
        compress256(&mut u, core::slice::from_ref(&block));
        for (t, u) in t.iter_mut().zip(&u) {
            *t ^= u;
        }
    }
    t
}

fn put_digest(block: &mut [u8; 64], digest: &[u32; 8]) {
    for (chunk, w) in block[..32].chunks_exact_mut(4).zip(digest) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
}
