//! The synchronisation primitives the engine is built on, from `std` (atomics) and `parking_lot`
//! (mutexes) normally and from `loom` under `--cfg tollgate_loom`, so the same store and
//! wait-queue code is model-checked by loom.
//! (A cfg of our own, not `loom`: tokio reads `loom` too and must stay as it is.)

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(tollgate_loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A value alone on its cache lines (two: neighbouring lines are fetched in pairs), so that
/// threads writing it do not also take away the lines of what other threads use: a hot
/// counter's word, a shard's lock and map.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Lock a mutex, ignoring poisoning: every critical section in the engine leaves its data
/// consistent before anything that can panic, so a poisoned lock holds valid state. Outside
/// loom the mutex is `parking_lot`'s, which has no poisoning to ignore.
#[cfg(tollgate_loom)]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(not(tollgate_loom))]
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock()
}
