//! The executor's own decisions about the requests it sends, in one place:
//! how many are in flight (`adapt`), how large each is (`sizing`, with
//! `queueing`'s verdict on the first answers), and the judge that weighs
//! each decision by the throughput it produced and undoes the ones that
//! made the load slower (`judge`). The part tasks report here as they
//! start, receive their first byte and end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::adapt::Growth;
use super::judge::{Change, Judge};
use super::options::ExecOptions;
use super::sizing::Sizer;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::{OnFirstByte, PartStats};

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Control {
    growth: Mutex<Growth>,
    judge: Mutex<Judge>,
    sizer: Option<Arc<Mutex<Sizer>>>,
    /// One permit a request in flight.
    permits: Arc<Semaphore>,
    /// Permits an undone growth still has to take back as requests end.
    owed: AtomicUsize,
    /// Whether parts wait to be sent: with none, more requests in flight
    /// could carry nothing, and growing would be a decision without effect.
    queued: AtomicBool,
}

impl Control {
    /// `first_round`: the bytes (segments) of the parts the load sends
    /// first, one per request it starts with.
    pub fn new(opts: &ExecOptions, first_round: u64, now: Instant) -> Control {
        let start = opts.concurrency.max(1);
        let growth = Growth::new(start, opts.max_concurrency.unwrap_or(start), now)
            .with_target(opts.throughput_target);
        let sizer = opts.join_up_to.map(|max| {
            Arc::new(Mutex::new(
                Sizer::new(max, start as u64, now).known(opts.in_turn),
            ))
        });
        let mut judge = Judge::new(now);
        if let Some(near) = opts.near {
            let change = Change::Near {
                first_byte: near.first_byte,
                rate: near.rate,
                start,
                part: near.part,
                wave: near.wave,
            };
            // Judged as its first round ends, where growth takes its first
            // step: a window that ran past it would hold that step back
            // (a pending decision stops growth) and leave a later round
            // measured against a first one of the same width.
            judge.started(change, near.floor, first_round);
        }
        Control {
            growth: Mutex::new(growth),
            judge: Mutex::new(judge),
            sizer,
            permits: Arc::new(Semaphore::new(start)),
            owed: AtomicUsize::new(0),
            queued: AtomicBool::new(true),
        }
    }

    /// Whether parts wait to be sent (see `queued`).
    pub fn set_queued(&self, queued: bool) {
        self.queued.store(queued, Ordering::Relaxed);
    }

    /// The sizer the part queue joins parts by, when the load has one.
    pub fn sizer(&self) -> Option<Arc<Mutex<Sizer>>> {
        self.sizer.clone()
    }

    pub fn permits(&self) -> Arc<Semaphore> {
        Arc::clone(&self.permits)
    }

    /// Whether parts cancelled to be sent again are still on their way
    /// back (see `Sizer::returning`).
    pub fn returning(&self) -> bool {
        self.sizer.as_ref().is_some_and(|s| locked(s).returning())
    }

    pub fn with_sizer(&self, f: impl FnOnce(&mut Sizer)) {
        if let Some(s) = &self.sizer {
            f(&mut locked(s));
        }
    }

    /// The part queue joined a request of `bytes` or cut the rest of the
    /// load for the first time: judged like the rest.
    pub fn queue_decided(&self, change: Change, bytes: u64) {
        let settle = match change {
            // A store serving requests in turn has one request's bytes in
            // service at a time, whatever the limit: a window of those
            // judges the cut within the load (one of `limit` requests'
            // bytes would outlast it).
            Change::InTurn { .. } => bytes,
            _ => bytes * locked(&self.growth).limit() as u64,
        };
        self.judged(|j| j.decided(change, settle, Instant::now()));
    }

    /// Runs `f` on the judge, then logs what it said once the lock is
    /// released: a log record reaches Python and may wait for the GIL,
    /// which must not hold up the other parts' tasks.
    fn judged<T>(&self, f: impl FnOnce(&mut Judge) -> T) -> T {
        let (out, said) = {
            let mut j = locked(&self.judge);
            let out = f(&mut j);
            (out, j.take_said())
        };
        for line in said {
            log::debug!("{line}");
        }
        out
    }

    /// Part `id` was sent, cancellable alone through `token`: what to call
    /// when its first byte arrives, for a load that sizes its requests.
    pub fn sent(&self, id: u64, token: &CancelToken) -> Option<OnFirstByte> {
        let sizer = Arc::clone(self.sizer.as_ref()?);
        locked(&sizer).sent(id, token.clone());
        Some(Arc::new(move |waited| {
            locked(&sizer).first_byte(id, waited, Instant::now())
        }))
    }

    /// Part `id`, `wanted` bytes of segments sent at `started`, ended with
    /// `out`: the measurements, the judge's verdicts and what they undo,
    /// then growth. Returns with the request's `permit` given back, or
    /// kept where an undone growth still owes one.
    pub fn ended(
        &self,
        id: u64,
        wanted: u64,
        started: Instant,
        out: &Result<PartStats>,
        permit: OwnedSemaphorePermit,
    ) {
        let now = Instant::now();
        if let Some(sizer) = &self.sizer {
            let mut s = locked(sizer);
            s.ended(id);
            if let Ok(PartStats {
                first_byte: Some(first_byte),
                bytes_fetched,
                ..
            }) = out
            {
                s.completed(*bytes_fetched, *first_byte, started.elapsed(), now);
            }
        }
        if out.is_ok() {
            let undo = self.judged(|j| j.completed(wanted, now));
            undo.into_iter().for_each(|c| self.undo(c));
            self.grow(wanted, now);
        }
        self.give_back(permit);
    }

    fn grow(&self, wanted: u64, now: Instant) {
        let busy = locked(&self.judge).busy() || !self.queued.load(Ordering::Relaxed);
        let (more, limit) = {
            let mut g = locked(&self.growth);
            (g.completed(wanted, now, !busy), g.limit())
        };
        if more > 0 {
            let change = Change::Grew {
                from: limit - more,
                to: limit,
            };
            self.judged(|j| j.decided(change, wanted * limit as u64, now));
            self.permits.add_permits(more);
        }
    }

    fn undo(&self, change: Change) {
        match change {
            Change::Grew { from, .. } => {
                let fewer = locked(&self.growth).undo(from);
                let taken = self.permits.forget_permits(fewer);
                self.owed.fetch_add(fewer - taken, Ordering::SeqCst);
            }
            Change::Joined { .. } | Change::InTurn { .. } => self.with_sizer(Sizer::stop_joining),
            Change::Near { wave, .. } => {
                let more = locked(&self.growth).widen(wave, Instant::now());
                self.permits.add_permits(more);
            }
        }
    }

    fn give_back(&self, permit: OwnedSemaphorePermit) {
        let owed = self
            .owed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if owed.is_ok() {
            permit.forget();
        }
    }

    /// Every decision of the load and its verdict, in order.
    pub fn adaptations(&self) -> Vec<String> {
        locked(&self.judge).adaptations()
    }
}
