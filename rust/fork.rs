//! What a forked child must not use from its parent.
//!
//! vLLM and torch.multiprocessing start workers with `fork`. The child gets
//! a copy of the parent's memory but only the forking thread: the IO
//! runtime's threads, the clients' connection pools (whose sockets the
//! parent still uses) and any lock another thread held are copies of things
//! that no longer work there. So every process-wide cache holds its value
//! in a [`PerProcess`], which a `pthread_atfork` child handler invalidates:
//! the child leaks the parent's copy (dropping it would join threads that do
//! not exist, or shut down connections the parent owns) and builds its own
//! on first use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child() {
    // Between fork and exec only async-signal-safe work is allowed: one
    // atomic add.
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// Changes in every forked child. The handler is registered by the first
/// call, which every [`PerProcess`] makes before it holds a value, so no
/// value can be inherited unnoticed.
pub fn generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: registers a child handler that does one atomic add (async-
        // signal-safe, as a fork handler must be); no prepare or parent
        // handler. pthread_atfork fails only when out of memory, and then the
        // process is no worse off than without a handler.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    GENERATION.load(Ordering::SeqCst)
}

/// A process-wide value built on first use, and again in a forked child
/// (see the module docs); the inherited one is leaked, never dropped.
pub struct PerProcess<T> {
    slot: Mutex<Option<(u64, T)>>,
}

impl<T: Clone> PerProcess<T> {
    pub const fn new() -> Self {
        PerProcess {
            slot: Mutex::new(None),
        }
    }

    /// This process's value, made by `make` when there is none yet.
    pub fn get_or_try_init<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        self.get_at(generation(), make)
    }

    /// [`Self::get_or_try_init`] for a `make` that cannot fail.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> T {
        match self.get_at(generation(), || Ok::<_, std::convert::Infallible>(make())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    fn get_at<E>(&self, generation: u64, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some((g, value)) if g == generation => {
                *slot = Some((g, value.clone()));
                return Ok(value);
            }
            Some(inherited) => std::mem::forget(inherited),
            None => {}
        }
        let value = make()?;
        *slot = Some((generation, value.clone()));
        Ok(value)
    }
}

impl<T: Clone> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn one_value_per_generation_and_the_inherited_one_is_leaked() {
        let drops = Arc::new(AtomicUsize::new(0));
        let cache: PerProcess<Arc<Counted>> = PerProcess::new();
        let make = || Ok::<_, ()>(Arc::new(Counted(Arc::clone(&drops))));
        let a = cache.get_at(0, make).unwrap();
        let b = cache.get_at(0, make).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        // "After a fork": a new value; the old one is never dropped, even
        // once every handle to it is gone.
        let c = cache.get_at(1, make).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert!(Arc::ptr_eq(&c, &cache.get_at(1, make).unwrap()));
    }

    #[test]
    fn a_failed_build_is_tried_again() {
        let cache: PerProcess<u32> = PerProcess::new();
        assert_eq!(cache.get_at(0, || Err("no")), Err("no"));
        assert_eq!(cache.get_at(0, || Ok::<_, &str>(7)), Ok(7));
        assert!(cache.get_or_try_init(|| Ok::<_, &str>(8)).is_ok());
    }

    #[test]
    fn the_generation_is_stable_within_a_process() {
        assert_eq!(generation(), generation());
    }
}
