//! `--forwarded-for N`: authbench as a calling service (a signup service, say) that
//! registers and logs in users on behalf of many end users, passing each end user's
//! address in `x-forwarded-for`.
//!
//! The addresses are N of the benchmarking network 198.18.0.0/15 (RFC 2544), address
//! k being 198.18.0.0 + k. Each one's header value is built once, before the load,
//! so a request only clones a prepared value. Which k a request carries is the
//! caller's: a user's own (user i: k = i mod N), the next in turn for a registration.

use http::HeaderValue;
use std::net::Ipv4Addr;
use tonic::{
    Request,
    metadata::{Ascii, MetadataValue},
};

/// The header (over gRPC, the metadata key) the address travels in.
pub(super) const HEADER: &str = "x-forwarded-for";

/// 198.18.0.0, the first address of the benchmarking network.
const FIRST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);

/// The addresses of 198.18.0.0/15: the most `--forwarded-for` takes.
pub const MAX_FORWARDED_FOR: usize = 1 << 17;

/// Address `k` (below [`MAX_FORWARDED_FOR`]): 198.18.0.0 + k.
pub fn forwarded_address(k: usize) -> Ipv4Addr {
    assert!(k < MAX_FORWARDED_FOR, "198.18.0.0/15 has no address {k}");
    let k = u32::try_from(k).expect("below 2^17");
    Ipv4Addr::from_bits(FIRST.to_bits() + k)
}

/// The header values of a run's addresses, for the protocols it speaks; empty
/// without `--forwarded-for`.
#[derive(Default)]
pub(super) struct Forwarded {
    grpc: Vec<MetadataValue<Ascii>>,
    http: Vec<HeaderValue>,
}

impl Forwarded {
    /// The values of addresses 0 to `count - 1`: as gRPC metadata when `grpc`, as
    /// HTTP/1.1 header values when `http`.
    pub(super) fn new(count: usize, grpc: bool, http: bool) -> Self {
        let text = |k| forwarded_address(k).to_string();
        let addresses = |wanted: bool| if wanted { 0..count } else { 0..0 };
        Self {
            grpc: addresses(grpc)
                .map(|k| MetadataValue::try_from(text(k)).expect("an address is ASCII"))
                .collect(),
            http: addresses(http)
                .map(|k| HeaderValue::try_from(text(k)).expect("an address is ASCII"))
                .collect(),
        }
    }

    /// The gRPC metadata value of address `k mod N` (none without
    /// `--forwarded-for`), for [`stamp`].
    pub(super) fn grpc(&self, k: usize) -> Option<&MetadataValue<Ascii>> {
        (!self.grpc.is_empty()).then(|| &self.grpc[k % self.grpc.len()])
    }

    /// The HTTP/1.1 header value of address `k mod N` (none without
    /// `--forwarded-for`).
    pub(super) fn http(&self, k: usize) -> Option<&HeaderValue> {
        (!self.http.is_empty()).then(|| &self.http[k % self.http.len()])
    }
}

/// Sets `x-forwarded-for` on a gRPC request to `value`, when there is one.
pub(super) fn stamp<T>(request: &mut Request<T>, value: Option<&MetadataValue<Ascii>>) {
    if let Some(value) = value {
        request.metadata_mut().insert(HEADER, value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_k_is_the_kth_of_the_benchmarking_network() {
        assert_eq!(forwarded_address(0), Ipv4Addr::new(198, 18, 0, 0));
        assert_eq!(forwarded_address(1), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(forwarded_address(256), Ipv4Addr::new(198, 18, 1, 0));
        assert_eq!(
            forwarded_address(MAX_FORWARDED_FOR - 1),
            Ipv4Addr::new(198, 19, 255, 255)
        );
    }

    #[test]
    fn values_cycle_over_the_addresses() {
        let forwarded = Forwarded::new(3, true, true);
        let mut request = Request::new(());
        stamp(&mut request, forwarded.grpc(7));
        assert_eq!(request.metadata().get(HEADER).unwrap(), "198.18.0.1");
        // A second stamp replaces the first: one address per request.
        stamp(&mut request, forwarded.grpc(2));
        assert_eq!(request.metadata().get_all(HEADER).iter().count(), 1);
        assert_eq!(request.metadata().get(HEADER).unwrap(), "198.18.0.2");
        assert_eq!(forwarded.http(3).unwrap(), "198.18.0.0");

        let off = Forwarded::default();
        let mut request = Request::new(());
        stamp(&mut request, off.grpc(7));
        assert!(request.metadata().get(HEADER).is_none());
        assert!(off.http(7).is_none());
    }
}
