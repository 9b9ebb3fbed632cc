//! Cancellation and deadlines, shared by every layer: a token is made at
//! the edge (the Python binding turns Ctrl-C into it) and read by opens,
//! loads, saves and uploads alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A shared flag that asks every read of a load to stop. Reads check it
/// between chunks, so cancelling takes effect within one chunk's time.
/// A child token also reads as cancelled when its parent is, which lets one
/// failed part stop its siblings without touching the caller's token.
/// A token may carry the operation's deadline, which retries respect.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    parent: Option<Arc<CancelToken>>,
    deadline: Option<Instant>,
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn child(&self) -> Self {
        CancelToken {
            flag: Arc::default(),
            parent: Some(Arc::new(self.clone())),
            deadline: self.deadline,
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

    pub fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire) || self.parent.as_ref().is_some_and(|p| p.is_cancelled())
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
