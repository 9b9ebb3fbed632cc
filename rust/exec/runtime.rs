//! The process-wide tokio runtime.
//!
//! vLLM forks worker processes; a runtime's threads do not survive a fork, so
//! the runtime is keyed by pid and rebuilt in a child. The parent's copy in the
//! child is leaked on purpose: dropping it would try to join threads that do
//! not exist there.

use std::sync::{Arc, Mutex};

use tokio::runtime::{Builder, Runtime};

use crate::error::{Error, Result};

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The runtime for this process, built on first use (and again after a fork).
pub fn runtime() -> Result<Arc<Runtime>> {
    let pid = std::process::id();
    let mut guard = RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, rt)) = guard.as_ref() {
        if *owner == pid {
            return Ok(Arc::clone(rt));
        }
    }
    if let Some((_, stale)) = guard.take() {
        std::mem::forget(stale);
    }
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 16);
    let rt = Arc::new(
        Builder::new_multi_thread()
            .worker_threads(workers)
            // Local-file reads run as blocking tasks; allow plenty in flight.
            .max_blocking_threads(128)
            .thread_name("fastshard-io")
            .enable_all()
            .build()
            .map_err(|e| Error::from_io(e, "starting the IO runtime"))?,
    );
    *guard = Some((pid, Arc::clone(&rt)));
    Ok(rt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_runtime_within_a_process() {
        assert!(Arc::ptr_eq(&runtime().unwrap(), &runtime().unwrap()));
        assert_eq!(runtime().unwrap().block_on(async { 7 }), 7);
    }
}
