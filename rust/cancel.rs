//! Cancellation and deadlines, shared by every layer: a token is made at
//! the edge (the Python binding turns Ctrl-C into it) and read by opens,
//! loads, saves and uploads alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// A shared flag that asks every read of a load to stop. Reads check it
/// between chunks, and whatever awaits the store wakes at once
/// ([`Self::cancelled`]), so cancelling takes effect within one chunk's
/// time even where no byte is arriving. A child token is cancelled with its
/// parent, which lets one failed part stop its siblings without touching
/// the caller's token. A token may carry the operation's deadline, which
/// retries respect.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    token: CancellationToken,
    deadline: Option<Instant>,
    // Whether the operation has warned that it is retrying (once, shared
    // with its children).
    warned: Arc<AtomicBool>,
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn child(&self) -> Self {
        CancelToken {
            token: self.token.child_token(),
            deadline: self.deadline,
            warned: Arc::clone(&self.warned),
        }
    }

    /// A child whose operation must end within `budget` from now (the
    /// earlier of this and any inherited deadline wins).
    pub fn child_with_budget(&self, budget: Option<Duration>) -> Self {
        let mut child = self.child();
        if let Some(b) = budget {
            let d = Instant::now() + b;
            child.deadline = Some(child.deadline.map_or(d, |p| p.min(d)));
        }
        child
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True the first time it is asked of this token or any of its
    /// family: the operation's one warning.
    pub fn first_warning(&self) -> bool {
        !self.warned.swap(true, Ordering::Relaxed)
    }

    pub fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub fn cancel(&self) {
        self.token.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once this token (or a parent) is cancelled.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Resolves once the deadline passes; never without one.
    pub async fn deadline_passed(&self) {
        match self.deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    }

    /// `Err(Cancelled)` once cancelled, so reads can `?` it.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::cancelled())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let a = CancelToken::new();
        let b = a.clone();
        assert!(b.check().is_ok());
        a.cancel();
        assert!(b.is_cancelled());
        assert!(b.check().is_err());
    }

    #[test]
    fn child_sees_parent_but_not_the_reverse() {
        let parent = CancelToken::new();
        let child = parent.child();
        child.cancel();
        assert!(!parent.is_cancelled());
        let child2 = parent.child();
        parent.cancel();
        assert!(child2.is_cancelled());
    }
}
