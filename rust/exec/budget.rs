//! The staging budget of a run, in pages: what every part and every
//! joined request may claim of it.

use tokio::sync::Semaphore;

use crate::error::{Error, ErrorKind, Result};
use crate::io::PartSource;
use crate::plan::{Part, ReadPlan};

/// Budget accounting in pages, so any budget fits the semaphore's `u32`
/// acquisitions: a part's need rounds up, the budget rounds down.
pub const BUDGET_UNIT: u64 = 4096;

pub fn budget_units(bytes: u64) -> u64 {
    bytes.div_ceil(BUDGET_UNIT)
}

/// The budget in `BUDGET_UNIT`s, after checking that every part fits it on
/// its own (a part that never could would wait forever).
pub fn budget_cap<S: PartSource + ?Sized>(
    source: &S,
    plan: &ReadPlan,
    budget: Option<u64>,
) -> Result<Option<u64>> {
    let Some(cap) = budget.map(|b| (b / BUDGET_UNIT).min(Semaphore::MAX_PERMITS as u64)) else {
        return Ok(None);
    };
    for part in &plan.parts {
        let need = source.staging_bytes(part);
        if budget_units(need) > cap {
            return Err(Error::new(
                ErrorKind::Budget,
                format!(
                    "a read of {} bytes needs {need} bytes of staging memory, more than the \
                     budget of {} bytes; raise max_host_bytes",
                    part.len(),
                    cap * BUDGET_UNIT
                ),
            )
            .with_range(part.start..part.end));
        }
    }
    Ok(Some(cap))
}

/// Whether parts `a` and `b` joined into one request would still fit the
/// staging budget (`cap` units) on their own, as `budget_cap` checked every
/// part.
pub fn fits_joined<S: PartSource + ?Sized>(
    cap: Option<u64>,
    source: &S,
    a: &Part,
    b: &Part,
) -> bool {
    let Some(cap) = cap else {
        return true;
    };
    let mut joined = a.clone();
    joined.join(b.clone()).is_ok() && budget_units(source.staging_bytes(&joined)) <= cap
}
