//! Which experts a worker holds: shard `I` of `N` holds every expert `e`
//! with `e mod N = I`, so each shard gets as many of a layer's experts as
//! the next, and routing's popular experts spread over all of them.

use crate::{Error, Result};

/// The most shards a model is split into.
const SHARDS_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Every expert, on one worker.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    pub fn holds(self, expert: usize) -> bool {
        expert % self.count == self.index
    }

    /// `expert`'s shard among `count`.
    pub fn of(expert: usize, count: usize) -> usize {
        expert % count
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = Error;

    /// `I/N`, with `I < N <= 1024`.
    fn from_str(text: &str) -> Result<Shard> {
        let bad = || Error::Shard(format!("{text:?} is not I/N with 0 <= I < N <= {SHARDS_MAX}"));
        let (index, count) = text.split_once('/').ok_or_else(bad)?;
        let index: usize = index.trim().parse().map_err(|_| bad())?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || count > SHARDS_MAX || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_i_of_n_and_holds_every_nth_expert() {
        let shard: Shard = "1/3".parse().unwrap();
        assert_eq!(shard, Shard { index: 1, count: 3 });
        assert_eq!((0..9).filter(|&e| shard.holds(e)).collect::<Vec<_>>(), vec![1, 4, 7]);
        for bad in ["3/3", "0/0", "1", "a/2", "0/2000", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
