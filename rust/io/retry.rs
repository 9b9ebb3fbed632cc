//! When and how long to wait before fetching a part again. Shared by every
//! network source so S3 and HTTP behave the same.

use std::time::{Duration, Instant};

use rand::Rng;

use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per part, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// The whole load gives up at this instant, whatever the attempts left.
    pub deadline: Option<Instant>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(5),
            deadline: None,
        }
    }
}

/// Failures that a later attempt may not repeat. Auth, not-found, a changed
/// object or a malformed file will fail the same way again.
pub fn is_transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Network | ErrorKind::Throttled)
}

impl RetryPolicy {
    /// Full-jitter exponential backoff: spreads many parts' retries so a
    /// throttled store is not hit by all of them at once.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
        let cap = exp.min(self.max_delay);
        let nanos = cap.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// Decides after failed attempt number `attempt` (1-based): the delay to
    /// wait, or the error to give up with.
    pub fn next_delay(&self, attempt: u32, err: Error) -> Result<Duration> {
        if !is_transient(err.kind()) || attempt >= self.max_attempts {
            return Err(err);
        }
        let delay = self.backoff(attempt);
        if let Some(deadline) = self.deadline {
            if Instant::now() + delay >= deadline {
                return Err(Error::new(
                    err.kind(),
                    format!("load deadline passed while retrying: {}", err.message()),
                ));
            }
        }
        Ok(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let p = RetryPolicy::default();
        for attempt in 0..40 {
            assert!(p.backoff(attempt) <= p.max_delay);
        }
    }

    #[test]
    fn only_transient_errors_retry() {
        let p = RetryPolicy::default();
        assert!(p
            .next_delay(1, Error::new(ErrorKind::Network, "reset"))
            .is_ok());
        assert!(p
            .next_delay(1, Error::new(ErrorKind::Throttled, "slow down"))
            .is_ok());
        for kind in [
            ErrorKind::Auth,
            ErrorKind::NotFound,
            ErrorKind::Changed,
            ErrorKind::Format,
        ] {
            let e = p.next_delay(1, Error::new(kind, "no")).unwrap_err();
            assert_eq!(e.kind(), kind);
        }
    }

    #[test]
    fn attempts_and_deadline_bound_retries() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..Default::default()
        };
        assert!(p.next_delay(2, Error::new(ErrorKind::Network, "x")).is_ok());
        assert!(p
            .next_delay(3, Error::new(ErrorKind::Network, "x"))
            .is_err());
        let p = RetryPolicy {
            deadline: Some(Instant::now()),
            base_delay: Duration::from_secs(1),
            ..Default::default()
        };
        // Jitter may pick zero; a deadline already passed must still stop us.
        let mut stopped = false;
        for _ in 0..20 {
            stopped |= p
                .next_delay(1, Error::new(ErrorKind::Network, "x"))
                .is_err();
        }
        assert!(stopped);
    }
}
