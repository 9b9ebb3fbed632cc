//! When and how long to wait before sending a request again, and the loop
//! that does so within an operation's attempts, deadline and cancellation.
//! Shared by every network source so S3 and HTTP behave the same.

use std::time::{Duration, Instant};

use rand::Rng;

use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};

/// How long a request fails before its operation warns that it is
/// retrying.
pub const WARN_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per part, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(5),
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

    /// Decides after failed attempt number `attempt` (1-based) of a request
    /// first sent at `started`: the delay to wait, or the error to give up
    /// with, saying how long it tried. A retry that would end past the
    /// operation's deadline is not started. An operation that will still be
    /// failing after [`WARN_AFTER`] says so once, before that wait, at
    /// WARNING, with the error (which names the endpoint, the object and
    /// the range): a store that cannot be reached is otherwise silent until
    /// the deadline.
    pub fn next_delay(
        &self,
        attempt: u32,
        err: Error,
        cancel: &CancelToken,
        started: Instant,
    ) -> Result<Duration> {
        if !is_transient(err.kind()) {
            return Err(err);
        }
        let spent = started.elapsed();
        let secs = spent.as_secs_f64();
        if attempt >= self.max_attempts {
            return Err(
                err.reworded(|m| format!("gave up after {attempt} attempts in {secs:.1} s: {m}"))
            );
        }
        let delay = self.backoff(attempt);
        if cancel
            .deadline()
            .is_some_and(|d| Instant::now() + delay >= d)
        {
            return Err(
                err.reworded(|m| format!("deadline passed after {secs:.1} s of retries: {m}"))
            );
        }
        if spent + delay >= WARN_AFTER && cancel.first_warning() {
            let left = cancel
                .deadline()
                .map(|d| {
                    format!(
                        " ({:.0} s left)",
                        d.saturating_duration_since(Instant::now()).as_secs_f64()
                    )
                })
                .unwrap_or_default();
            log::warn!(
                "{err}; retrying (attempt {attempt} failed after {secs:.1} s, next in {:.1} s){left}",
                delay.as_secs_f64()
            );
        }
        Ok(delay)
    }

    /// Waits out a backoff, waking early (with `Cancelled`) when the load is
    /// cancelled, so a deadline or Ctrl-C is not held up by a long backoff.
    pub async fn wait(&self, delay: Duration, cancel: &CancelToken) -> Result<()> {
        cancel.check()?;
        tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = cancel.cancelled() => Err(Error::cancelled()),
        }
    }
}

/// Runs a request again on transient failures, within the policy's
/// attempts and the token's deadline. The closure rebuilds the request.
pub async fn retrying<T, F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancelToken,
    mut request: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    let started = Instant::now();
    loop {
        attempt += 1;
        match bounded(request(), cancel).await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let delay = policy.next_delay(attempt, e, cancel, started)?;
                policy.wait(delay, cancel).await?;
            }
        }
    }
}

/// Runs one attempt until it ends, the load is cancelled or its deadline
/// passes. Without this a stalled response holds a failed or out-of-time
/// load until the client's read timeout (30 s), since reads only look at
/// the cancel flag when bytes arrive.
pub(crate) async fn bounded<T>(
    attempt: impl std::future::Future<Output = Result<T>>,
    cancel: &CancelToken,
) -> Result<T> {
    cancel.check()?;
    tokio::select! {
        out = attempt => out,
        _ = cancel.cancelled() => Err(Error::cancelled()),
        _ = cancel.deadline_passed() => Err(Error::new(
            ErrorKind::Network,
            "deadline passed while waiting for the server",
        )),
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
            .next_delay(1, Error::new(ErrorKind::Network, "reset"), &none(), now())
            .is_ok());
        assert!(p
            .next_delay(
                1,
                Error::new(ErrorKind::Throttled, "slow down"),
                &none(),
                now()
            )
            .is_ok());
        for kind in [
            ErrorKind::Auth,
            ErrorKind::NotFound,
            ErrorKind::Changed,
            ErrorKind::Format,
        ] {
            let e = p
                .next_delay(1, Error::new(kind, "no"), &none(), now())
                .unwrap_err();
            assert_eq!(e.kind(), kind);
        }
    }

    #[test]
    fn attempts_bound_retries() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..Default::default()
        };
        assert!(p
            .next_delay(2, Error::new(ErrorKind::Network, "x"), &none(), now())
            .is_ok());
        let e = p
            .next_delay(3, Error::new(ErrorKind::Network, "x"), &none(), now())
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("gave up after 3 attempts in 0.0 s: x"),
            "{e}"
        );
        let passed = CancelToken::new().child_with_budget(Some(Duration::ZERO));
        let started = Instant::now() - Duration::from_millis(2500);
        let e = p
            .next_delay(
                1,
                Error::new(ErrorKind::Throttled, "x").with_range(1..2),
                &passed,
                started,
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Throttled);
        assert!(
            e.message()
                .contains("deadline passed after 2.5 s of retries"),
            "{e}"
        );
        assert_eq!(e.range(), Some(1..2));
    }

    #[test]
    fn an_operation_warns_once_that_it_is_retrying() {
        let p = RetryPolicy::default();
        let load = CancelToken::new();
        let part = load.child();
        let early = Instant::now();
        let late = Instant::now() - WARN_AFTER;
        let e = || Error::new(ErrorKind::Network, "refused");
        // Too early to warn: the flag is still free afterwards.
        p.next_delay(1, e(), &part, early).unwrap();
        assert!(part.child().first_warning());
        assert!(!load.first_warning() && !part.first_warning());
        let fresh = CancelToken::new();
        p.next_delay(5, e(), &fresh.child(), late).unwrap();
        assert!(
            !fresh.first_warning(),
            "the late failure warned and took the flag"
        );
    }

    fn none() -> CancelToken {
        CancelToken::new()
    }

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn waiting_stops_when_cancelled() {
        let cancel = CancelToken::new();
        cancel.cancel();
        // io has no runtime of its own: the facades bring one.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let p = RetryPolicy::default();
        let started = Instant::now();
        let r = rt.block_on(p.wait(Duration::from_secs(10), &cancel));
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// Cancels `token` from another thread `ms` from now.
    fn cancel_in(token: &CancelToken, ms: u64) {
        let token = token.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            token.cancel();
        });
    }

    #[test]
    fn a_stalled_attempt_ends_at_the_deadline_or_on_cancel() {
        // io has no runtime of its own: the facades bring one.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let stalled = std::future::pending::<Result<()>>;
        let timed = CancelToken::new().child_with_budget(Some(Duration::from_millis(200)));
        let started = Instant::now();
        let e = rt.block_on(bounded(stalled(), &timed)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Network);
        assert!(e.message().contains("deadline"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));

        let parent = CancelToken::new();
        let child = parent.child();
        cancel_in(&parent, 100);
        let started = Instant::now();
        let e = rt.block_on(bounded(stalled(), &child)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(2));

        let done = rt.block_on(bounded(async { Ok(7) }, &CancelToken::new()));
        assert_eq!(done.unwrap(), 7);
    }

    #[test]
    fn a_cancel_wakes_what_waits_without_a_timer() {
        // A runtime with no time driver: a wait that looked at the flag on
        // a timer would panic here; the cancel itself must wake it.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let parent = CancelToken::new();
        let child = parent.child();
        cancel_in(&parent, 50);
        let stalled = std::future::pending::<Result<()>>();
        let e = rt.block_on(bounded(stalled, &child)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled);
        // A backoff of an hour ends with its load's cancel.
        let timed = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let load = CancelToken::new();
        cancel_in(&load, 50);
        let e = timed
            .block_on(RetryPolicy::default().wait(Duration::from_secs(3600), &load.child()))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled);
    }
}
