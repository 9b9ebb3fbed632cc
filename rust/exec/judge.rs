//! Every decision the executor takes on its own (more requests in flight,
//! parts joined into larger requests, parts sent again to a store that
//! serves them in turn) is a guess from the first answers, and a link or a
//! store it was not tuned on can make it a bad one. So each is judged
//! afterwards by what it did to the load: the rate bytes completed at over
//! a window of `settle` bytes before it, against the rate over the same
//! number of bytes after it, once another `settle` bytes have completed
//! (the requests in flight when it was taken, which the decision did not
//! shape). A decision after which the load ran slower is undone, once and
//! for good: an undone decision is never taken again in the same load, so
//! a load cannot swing between two settings.

use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

/// A decision is undone when the load ran at less than this times its
/// rate before: below the noise of a loaded host, which a decision that
/// changed nothing must not be undone for.
const SLOWER: f64 = 0.85;
/// Completions remembered for measuring the rate before a decision.
const HISTORY: usize = 4096;

/// What the executor changed about the requests it sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// More requests in flight.
    Grew { from: usize, to: usize },
    /// Queued parts joined into requests of about `bytes` (from `planned`).
    Joined { bytes: u64, planned: u64 },
    /// The first answers came one `service` (seconds) apart: `resent`
    /// parts that had not begun to arrive were sent again and the rest of
    /// the load cut into requests of up to `cap` bytes.
    InTurn {
        resent: usize,
        service: f64,
        cap: u64,
    },
    /// The store looked near when it was opened (its first read: the
    /// first byte after `first_byte` seconds, then `rate` bytes a second):
    /// the load started with `start` requests of `part` bytes instead of a
    /// wave of `wave`.
    Near {
        first_byte: f64,
        rate: f64,
        start: usize,
        part: u64,
        wave: usize,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Change::Grew { from, to } => write!(f, "requests in flight {from} -> {to}"),
            Change::Joined { bytes, planned } => {
                write!(
                    f,
                    "parts joined: requests of {bytes} bytes (planned {planned})"
                )
            }
            // Seen when the store was opened (`discover::probing`): no part
            // had been sent to send again.
            Change::InTurn {
                resent: 0,
                service,
                cap,
            } => write!(
                f,
                "store serves requests in turn ({:.0} ms each, seen when it was \
                 opened): requests of up to {cap} bytes",
                service * 1e3
            ),
            Change::InTurn {
                resent,
                service,
                cap,
            } => write!(
                f,
                "store serves requests in turn ({:.0} ms each): {resent} parts sent \
                 again, requests of up to {cap} bytes",
                service * 1e3
            ),
            Change::Near {
                first_byte,
                rate,
                start,
                part,
                ..
            } => write!(
                f,
                "store is near (its first byte after {:.1} ms, its first read at {:.0} \
                 MB/s, seen when it was opened): {start} requests in flight to start, \
                 parts of {part} bytes",
                first_byte * 1e3,
                rate / 1e6
            ),
        }
    }
}

/// One decision and its verdict, as `LoadStats.adaptations` tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Adaptation {
    pub change: Change,
    /// Bytes a second over the window before the decision.
    pub before: f64,
    /// Bytes a second over the window after it; `None` while pending, or
    /// when the load ended first.
    pub after: Option<f64>,
    pub undone: bool,
}

impl fmt::Display for Adaptation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |r: f64| r / 1e6;
        if let Change::Near { wave, .. } = self.change {
            // Taken before anything was read: judged against the rate the
            // open's evidence promised, not a window before it.
            write!(f, "{}: ", self.change)?;
            return match (self.after, self.undone) {
                (Some(after), undone) => write!(
                    f,
                    "{:.1} MB/s over its first requests, against the {:.1} MB/s one \
                     request to a near store gives: {}",
                    mb(after),
                    mb(self.before),
                    if undone {
                        format!("undone, up to {wave} requests in flight for the rest")
                    } else {
                        "kept".to_string()
                    }
                ),
                (None, _) => write!(f, "not judged (the load ended first)"),
            };
        }
        write!(f, "{}: {:.1} MB/s before", self.change, mb(self.before))?;
        match (self.after, self.undone) {
            (Some(after), true) => write!(f, ", {:.1} MB/s after: undone", mb(after)),
            (Some(after), false) => write!(f, ", {:.1} MB/s after: kept", mb(after)),
            (None, _) => write!(f, ", not judged (the load ended first)"),
        }
    }
}

/// A decision waiting for its verdict.
#[derive(Debug)]
struct Pending {
    /// Its place in `Judge::log`.
    entry: usize,
    /// Bytes completed when it was taken.
    done_at: u64,
    settle: u64,
    /// When `settle` more bytes had completed: the after window's start.
    settled: Option<(Instant, u64)>,
}

/// The decisions of one load and the rate measurements that judge them.
#[derive(Debug)]
pub struct Judge {
    started: Instant,
    /// Bytes completed so far.
    done: u64,
    /// `(when, done)` after each recent completion.
    history: VecDeque<(Instant, u64)>,
    pending: Vec<Pending>,
    log: Vec<Adaptation>,
    /// What to log at DEBUG, taken by the caller once it let go of its
    /// lock (logging reaches Python and waits for the GIL).
    said: Vec<String>,
}

impl Judge {
    pub fn new(now: Instant) -> Judge {
        Judge {
            started: now,
            done: 0,
            history: VecDeque::new(),
            pending: Vec::new(),
            log: Vec::new(),
            said: Vec::new(),
        }
    }

    /// Whether a decision still waits for its verdict: another of the same
    /// kind would be judged against a window the first one shaped.
    pub fn busy(&self) -> bool {
        !self.pending.is_empty()
    }

    /// `change` was taken now, with about `settle` bytes in flight.
    pub fn decided(&mut self, change: Change, settle: u64, now: Instant) {
        let settle = settle.max(1);
        let before = self.rate_over_last(settle, now);
        self.said.push(format!(
            "{change}, at {:.1} MB/s over the last {settle} bytes; judged after {} more",
            before / 1e6,
            2 * settle
        ));
        self.pending.push(Pending {
            entry: self.log.len(),
            done_at: self.done,
            settle,
            settled: None,
        });
        self.log.push(Adaptation {
            change,
            before,
            after: None,
            undone: false,
        });
    }

    /// `change` was taken before the load began, from what the open saw
    /// of the store: judged on the load's first `window` bytes, which it
    /// shaped all of, against `promised`, the rate that evidence stood for.
    pub fn started(&mut self, change: Change, promised: f64, window: u64) {
        let window = window.max(1);
        self.said.push(format!(
            "{change}; judged on the first {window} bytes against {:.1} MB/s",
            promised / 1e6
        ));
        self.pending.push(Pending {
            entry: self.log.len(),
            done_at: 0,
            settle: window,
            settled: Some((self.started, 0)),
        });
        self.log.push(Adaptation {
            change,
            before: promised,
            after: None,
            undone: false,
        });
    }

    /// Bytes a second over the most recent `bytes` completed (or since the
    /// load began, when fewer have).
    fn rate_over_last(&self, bytes: u64, now: Instant) -> f64 {
        let floor = self.done.saturating_sub(bytes);
        let (when, from) = self
            .history
            .iter()
            .rev()
            .find(|&&(_, d)| d <= floor)
            .copied()
            .unwrap_or((self.started, 0));
        rate(self.done - from, now.duration_since(when).as_secs_f64())
    }

    /// `bytes` more completed now; returns the decisions to undo.
    pub fn completed(&mut self, bytes: u64, now: Instant) -> Vec<Change> {
        self.done += bytes;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((now, self.done));
        let mut undo = Vec::new();
        let done = self.done;
        let (log, said) = (&mut self.log, &mut self.said);
        self.pending.retain_mut(|p| {
            let (since, from) = match p.settled {
                Some(s) => s,
                None if done >= p.done_at + p.settle => {
                    p.settled = Some((now, done));
                    return true;
                }
                None => return true,
            };
            if done < from + p.settle {
                return true;
            }
            let after = rate(done - from, now.duration_since(since).as_secs_f64());
            let a = &mut log[p.entry];
            a.after = Some(after);
            a.undone = after < a.before * SLOWER;
            said.push(a.to_string());
            if a.undone {
                undo.push(a.change);
            }
            false
        });
        undo
    }

    /// The DEBUG lines since last asked: decisions and verdicts.
    pub fn take_said(&mut self) -> Vec<String> {
        std::mem::take(&mut self.said)
    }

    /// Every decision of the load, in order, as told to the user.
    pub fn adaptations(&self) -> Vec<String> {
        self.log.iter().map(ToString::to_string).collect()
    }

    #[cfg(test)]
    pub fn log(&self) -> &[Adaptation] {
        &self.log
    }
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-6)
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
