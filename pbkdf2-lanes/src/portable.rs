//! Portable backend: one job at a time on `sha2`'s compression function
//! (`sha2::block_api::compress256`), which itself picks the best single-block
//! code `sha2` has for the target. Builds and works everywhere.

use crate::prep::{Chain, FIXED_TAIL};
use sha2::block_api::compress256;

/// Runs `iters` rounds on one chain: its `u` and `t` are updated and its
/// `left` is not touched.
pub(crate) fn run_chain(c: &mut Chain, iters: u32) {
    let (mut u, mut t) = (c.u, c.t);
    // The tail (padding and length) is written once; each compression only
    // rewrites the first 32 bytes.
    let mut block = [0u8; 64];
    for (chunk, w) in block[32..].chunks_exact_mut(4).zip(&FIXED_TAIL) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    for _ in 0..iters {
        put_digest(&mut block, &u);
        let mut inner = c.inner;
        compress256(&mut inner, core::slice::from_ref(&block));
        put_digest(&mut block, &inner);
        u = c.outer;
        compress256(&mut u, core::slice::from_ref(&block));
        for (t, u) in t.iter_mut().zip(&u) {
            *t ^= u;
        }
    }
    (c.u, c.t) = (u, t);
}

fn put_digest(block: &mut [u8; 64], digest: &[u32; 8]) {
    for (chunk, w) in block[..32].chunks_exact_mut(4).zip(digest) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
}
