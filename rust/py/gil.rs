//! Waiting without the GIL, with Ctrl-C turned into cancellation.
//!
//! The work runs on a scoped thread while this thread, GIL released, waits
//! in short slices; between slices it briefly takes the GIL to let Python
//! run signal handlers. A KeyboardInterrupt cancels the token, and we still
//! wait for the work to finish, because it writes into buffers Python owns.

use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::cancel::CancelToken;

const SIGNAL_POLL: Duration = Duration::from_millis(50);

pub fn run_blocking<T, F>(py: Python<'_>, cancel: &CancelToken, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        scope.spawn(move || {
            // The receiver outlives this thread (same scope), so send only
            // fails if the waiter panicked; nothing to do then.
            let _ = tx.send(work());
        });
        let mut interrupt: Option<PyErr> = None;
        let mut rx = rx;
        loop {
            // The receiver moves into the GIL-free closure and back out,
            // since `&Receiver` may not cross threads.
            let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
            rx = back;
            match got {
                Ok(out) => {
                    return match interrupt {
                        Some(e) => Err(e),
                        None => Ok(out),
                    };
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if interrupt.is_none() {
                        if let Err(e) = py.check_signals() {
                            cancel.cancel();
                            interrupt = Some(e);
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(pyo3::exceptions::PyRuntimeError::new_err(
                        "fastshard worker thread panicked",
                    ));
                }
            }
        }
    })
}
