//! The memory budget of memory-hard hashing (Argon2, scrypt): the memory such work
//! may hold at once, in KiB, counted by a semaphore.
//!
//! Work that needs `m` KiB reserves them before it is sent to the hashing threads
//! and gives them back when it ends (or is dropped unrun), so concurrent memory-hard
//! work × its memory never exceeds the budget, however many threads the pool has:
//! what does not fit waits, without holding a thread, until the caller's deadline.
//! A need above the whole budget takes all of it (it runs alone); the start refuses
//! a budget below one hash of the policy, so only a stored hash of a larger,
//! earlier policy can ask for that.
//!
//! PBKDF2 needs no memory to speak of and never reserves any. It knows nothing of
//! passwords or of the pool.

use super::work::PoolError;
use prometheus::IntGauge;
use std::{sync::Arc, time::Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The memory memory-hard work may hold at once. Cloning shares it.
#[derive(Clone)]
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
    /// `authd_hash_memory_in_use_bytes`.
    in_use: IntGauge,
}

/// Memory reserved until dropped.
pub struct Reserved {
    _permit: OwnedSemaphorePermit,
    bytes: i64,
    in_use: IntGauge,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.in_use.sub(self.bytes);
    }
}

impl MemoryBudget {
    /// A budget of `total_kib` (at least 1), reporting what is reserved into
    /// `in_use` and its size into `total`.
    pub(crate) fn new(total_kib: u32, in_use: IntGauge, total: &IntGauge) -> Self {
        let total_kib = total_kib.max(1);
        total.set(i64::from(total_kib) * 1024);
        Self {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            in_use,
        }
    }

    /// The budget, in KiB.
    pub fn total_kib(&self) -> u32 {
        self.total_kib
    }

    /// The KiB reserved now.
    pub fn in_use_kib(&self) -> u32 {
        let available = u32::try_from(self.permits.available_permits()).unwrap_or(u32::MAX);
        self.total_kib.saturating_sub(available)
    }

    /// Waits until `kib` KiB fit (all of the budget when it needs more), at most
    /// until `deadline`, and reserves them.
    pub async fn reserve(
        &self,
        kib: u32,
        deadline: Option<Instant>,
    ) -> Result<Reserved, PoolError> {
        let kib = kib.clamp(1, self.total_kib);
        let acquire = self.permits.clone().acquire_many_owned(kib);
        let permit = match deadline {
            Some(deadline) => {
                tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), acquire)
                    .await
                    .map_err(|_| PoolError::Expired)?
            }
            None => acquire.await,
        }
        .map_err(|_| PoolError::Closed)?;
        let bytes = i64::from(kib) * 1024;
        self.in_use.add(bytes);
        Ok(Reserved {
            _permit: permit,
            bytes,
            in_use: self.in_use.clone(),
        })
    }
}
