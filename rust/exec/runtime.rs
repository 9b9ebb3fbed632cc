//! The process-wide tokio runtime, rebuilt in a forked child (a runtime's
//! threads do not survive a fork; see `crate::fork`).

use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};

use crate::error::{Error, Result};
use crate::fork::PerProcess;

static RUNTIME: PerProcess<Arc<Runtime>> = PerProcess::new();

/// The runtime for this process, built on first use (and again after a fork).
pub fn runtime() -> Result<Arc<Runtime>> {
    RUNTIME.get_or_try_init(|| {
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 16);
        let rt = Builder::new_multi_thread()
            .worker_threads(workers)
            // Local-file reads run as blocking tasks; allow plenty in flight.
            .max_blocking_threads(128)
            .thread_name("fastshard-io")
            .enable_all()
            .build()
            .map_err(|e| Error::from_io(e, "starting the IO runtime"))?;
        Ok(Arc::new(rt))
    })
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
