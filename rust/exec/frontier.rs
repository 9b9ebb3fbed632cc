//! How much of one item has landed from its start: byte ranges arrive in
//! any order (parts run concurrently) and possibly more than once, and the
//! contiguous prefix is what can be hashed or decrypted in order.

use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct Frontier {
    size: u64,
    /// Bytes `0..prefix` have all landed.
    prefix: u64,
    /// Landed ranges past the prefix, `start -> end`: disjoint, not
    /// touching one another or the prefix (they are merged when they do).
    ahead: BTreeMap<u64, u64>,
}

impl Frontier {
    pub fn new(size: u64) -> Frontier {
        Frontier {
            size,
            prefix: 0,
            ahead: BTreeMap::new(),
        }
    }

    pub fn prefix(&self) -> u64 {
        self.prefix
    }

    pub fn complete(&self) -> bool {
        self.prefix == self.size
    }

    /// Records that bytes `start..start + len` landed; returns whether the
    /// prefix grew. Bytes that landed before, or lie past the item's size,
    /// change nothing.
    pub fn land(&mut self, start: u64, len: u64) -> bool {
        let mut lo = start.max(self.prefix);
        let mut hi = start.saturating_add(len).min(self.size);
        if lo >= hi {
            return false;
        }
        // Absorb every range that overlaps or touches `lo..hi`: those
        // starting at or before `hi` whose end reaches `lo`.
        let touching: Vec<(u64, u64)> = self
            .ahead
            .range(..=hi)
            .rev()
            .take_while(|&(_, &end)| end >= lo)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.ahead.remove(&s);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        if lo > self.prefix {
            self.ahead.insert(lo, hi);
            return false;
        }
        self.prefix = hi;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_and_repeated_ranges() {
        let mut f = Frontier::new(10);
        assert!(!f.land(4, 2));
        assert!(!f.land(8, 2));
        assert_eq!(f.prefix(), 0);
        assert!(f.land(0, 4));
        assert_eq!(f.prefix(), 6, "the range ahead that touches is absorbed");
        assert!(!f.land(0, 6), "landing again changes nothing");
        assert!(!f.land(5, 1));
        assert!(f.land(6, 2));
        assert!(f.complete());
        assert!(!f.land(9, 5), "nothing past the size");
    }

    #[test]
    fn an_empty_item_is_complete_from_the_start() {
        assert!(Frontier::new(0).complete());
        assert!(!Frontier::new(0).land(0, 3));
    }

    proptest! {
        /// Whatever order and repetition ranges land in, the prefix is the
        /// longest run from 0 that their union covers.
        #[test]
        fn prefix_is_the_covered_run_from_zero(
            ranges in proptest::collection::vec((0u64..64, 0u64..16), 0..40),
        ) {
            let mut f = Frontier::new(64);
            let mut covered = [false; 64];
            for (start, len) in ranges {
                let before = f.prefix();
                let grew = f.land(start, len);
                for b in start..(start + len).min(64) {
                    covered[b as usize] = true;
                }
                let want = covered.iter().position(|c| !c).unwrap_or(64) as u64;
                prop_assert_eq!(f.prefix(), want);
                prop_assert_eq!(grew, want > before);
            }
        }
    }
}
