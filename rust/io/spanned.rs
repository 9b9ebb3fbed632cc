//! Several objects read as one, so that a single plan and a single executor
//! span every file of a load (a Hugging Face checkpoint's shards), each file
//! still its own source. Member `i`'s byte `o` is at `base(i) + o` in the
//! load's address space: the members lie 2^48 bytes apart, far more than
//! any gap a plan bridges, so no planned read crosses from one to the next.

use std::sync::Arc;

use super::source::{Fut, PartJob, PartSource, PartStats, RangeSource};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions};

const SHIFT: u32 = 48;
/// The largest member of a set of more than one.
pub const MAX_MEMBER_BYTES: u64 = 1 << SHIFT;
/// The most members a set may have (the address space's other 16 bits).
pub const MAX_MEMBERS: usize = 1 << (64 - SHIFT);

/// Where member `i`'s bytes start in the load's address space.
pub fn base(member: usize) -> u64 {
    (member as u64) << SHIFT
}

/// The members of one load behind the executor's one source. Plans, sizes
/// and concurrency follow the first member (a set's files share a store).
pub struct Spanned {
    uri: String,
    members: Vec<Arc<dyn RangeSource>>,
}

impl Spanned {
    /// `uri` names the whole (a single file's own URI, or a checkpoint's
    /// directory) in errors that concern no one member.
    pub fn new(uri: String, members: Vec<Arc<dyn RangeSource>>) -> Result<Spanned> {
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return Err(Error::invalid(format!(
                "a load spans 1 to {MAX_MEMBERS} files, not {}",
                members.len()
            )));
        }
        Ok(Spanned { uri, members })
    }

    fn first(&self) -> &dyn RangeSource {
        self.members[0].as_ref()
    }

    /// The one file behind a single-file load; `None` for a set.
    pub fn single(&self) -> Option<&dyn RangeSource> {
        match self.members.as_slice() {
            [only] => Some(only.as_ref()),
            _ => None,
        }
    }

    /// The member a part reads from and the part in that member's offsets.
    fn locate(&self, mut part: Part) -> Result<(&Arc<dyn RangeSource>, Part)> {
        let i = (part.start >> SHIFT) as usize;
        let member = self
            .members
            .get(i)
            .filter(|_| part.is_empty() || (part.end - 1) >> SHIFT == part.start >> SHIFT)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "planned read {}..{} does not lie within one of the {} files",
                        part.start,
                        part.end,
                        self.members.len()
                    ),
                )
            })?;
        let b = base(i);
        part.start -= b;
        part.end -= b;
        for s in &mut part.segments {
            s.offset -= b;
        }
        Ok((member, part))
    }
}

impl PartSource for Spanned {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        Box::pin(async move {
            let (part, dest, cancel, on_first_byte) = job.into_parts();
            let (member, part) = self.locate(part)?;
            let member = Arc::clone(member);
            let uri = member.uri().to_string();
            member
                .read_part(PartJob {
                    part,
                    dest,
                    cancel,
                    on_first_byte,
                })
                .await
                .map_err(|e| e.with_uri(uri))
        })
    }

    fn plan_options(&self) -> PlanOptions {
        self.first().plan_options()
    }

    fn default_concurrency(&self) -> usize {
        self.first().default_concurrency()
    }

    fn max_concurrency(&self) -> Option<usize> {
        self.first().max_concurrency()
    }

    fn part_size_for(&self, bytes: u64) -> Option<u64> {
        self.first().part_size_for(bytes)
    }

    fn max_joined_part(&self) -> Option<u64> {
        self.first().max_joined_part()
    }

    fn populates_ahead(&self) -> bool {
        self.first().populates_ahead()
    }

    fn staging_bytes(&self, part: &Part) -> u64 {
        match self.locate(part.clone()) {
            Ok((member, local)) => member.staging_bytes(&local),
            // read_part refuses it before staging anything.
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Segment;

    fn part(start: u64, end: u64) -> Part {
        Part {
            start,
            end,
            segments: vec![Segment {
                offset: start,
                len: end - start,
                slot: 0,
                slot_offset: 0,
            }],
            run: 0,
        }
    }

    fn spanned(n: usize) -> Spanned {
        let dir = tempfile::tempdir().unwrap();
        let members = (0..n)
            .map(|i| {
                let path = dir.path().join(format!("m{i}"));
                std::fs::write(&path, [i as u8; 16]).unwrap();
                let loc = crate::location::Location::parse(path.to_str().unwrap()).unwrap();
                Arc::new(super::super::FileSource::open(&loc).unwrap()) as Arc<dyn RangeSource>
            })
            .collect();
        Spanned::new("set/".into(), members).unwrap()
    }

    #[test]
    fn parts_map_to_their_member_in_its_own_offsets() {
        let s = spanned(3);
        let (m, local) = s.locate(part(base(2) + 3, base(2) + 9)).unwrap();
        assert!(m.uri().ends_with("m2"));
        assert_eq!(
            (local.start, local.end, local.segments[0].offset),
            (3, 9, 3)
        );
        let (m, local) = s.locate(part(5, 7)).unwrap();
        assert!(m.uri().ends_with("m0"));
        assert_eq!((local.start, local.end), (5, 7));
    }

    #[test]
    fn a_read_across_members_or_past_the_last_is_refused() {
        let s = spanned(2);
        assert!(s.locate(part(base(1) - 1, base(1) + 1)).is_err());
        assert!(s.locate(part(base(2), base(2) + 1)).is_err());
        assert_eq!(s.staging_bytes(&part(base(2), base(2) + 1)), 0);
        assert!(Spanned::new("x".into(), Vec::new()).is_err());
    }
}
