//! The one memory budget: resident dense weights, the expert cache, the KV
//! arena (rows per token and fixed state per session) and the I/O buffers
//! are all carved out of it.

use std::fmt;
use std::str::FromStr;

use crate::{ByteSize, Error, Result};

/// Share of `MemAvailable` that `--ram-budget auto` takes. The rest is left
/// to the page cache (which serves expert reads), the desktop, and the documented slack of the process itself.
pub const AUTO_SHARE_PERCENT: u64 = 75;

/// Bytes the process may use beyond its budget: the binary and its libraries,
/// thread stacks, the allocator's overhead and per-layer activations. A
/// test checks resident memory against `budget + SLACK_BYTES`.
pub const SLACK_BYTES: u64 = 96 << 20;

/// `--ram-budget`: a size, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamBudget {
    /// [`AUTO_SHARE_PERCENT`] of `MemAvailable`, read at start.
    Auto,
    Bytes(u64),
}

impl FromStr for RamBudget {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(RamBudget::Auto);
        }
        Ok(RamBudget::Bytes(text.parse::<ByteSize>()?.bytes()))
    }
}

impl fmt::Display for RamBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RamBudget::Auto => f.write_str("auto"),
            RamBudget::Bytes(b) => write!(f, "{}", ByteSize(*b)),
        }
    }
}

impl RamBudget {
    /// The budget in bytes (reads `/proc/meminfo` for `auto`).
    pub fn resolve(self) -> Result<u64> {
        match self {
            RamBudget::Bytes(bytes) => Ok(bytes),
            RamBudget::Auto => Ok(mem_available_bytes()? / 100 * AUTO_SHARE_PERCENT),
        }
    }
}

/// `MemAvailable` from `/proc/meminfo`.
pub fn mem_available_bytes() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|source| Error::MemInfo { reason: format!("cannot read /proc/meminfo: {source}") })?;
    parse_mem_available(&text)
}

/// The process's peak resident memory so far (`VmHWM`), if the kernel says.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// The process's resident memory now (`VmRSS`), if the kernel says.
pub fn resident_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

/// A `kB` line of `/proc/self/status`, in bytes.
fn proc_status_bytes(label: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(label))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn parse_mem_available(meminfo: &str) -> Result<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .ok_or_else(|| Error::MemInfo { reason: "no MemAvailable line in /proc/meminfo".into() })?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::MemInfo { reason: format!("unreadable line {line:?}") })?;
    Ok(kib * 1024)
}

/// What a model needs from the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetNeeds {
    /// Dense weights, resident for the whole run.
    pub dense_bytes: u64,
    /// The KV rows of the whole context, for every session.
    pub kv_bytes: u64,
    /// The fixed-size KV state of every session (recurrent layers' states,
    /// their staged copies and snapshots), whatever its length.
    pub kv_state_bytes: u64,
    /// Buffers of loads in flight.
    pub io_buffer_bytes: u64,
    /// The least expert cache that can run: the experts one token routes
    /// to in one layer.
    pub min_expert_bytes: u64,
}

/// How the budget is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetPlan {
    pub total_bytes: u64,
    pub dense_bytes: u64,
    pub kv_bytes: u64,
    pub kv_state_bytes: u64,
    pub io_buffer_bytes: u64,
    /// Everything left: the expert cache.
    pub expert_cache_bytes: u64,
}

impl BudgetPlan {
    /// Shares `total_bytes` out, or refuses with what is needed and what there is.
    pub fn new(total_bytes: u64, needs: BudgetNeeds) -> Result<Self> {
        // Checked: a sum past u64 is more than any budget (and shown as the
        // largest size), never a wrapped small one.
        let needed_bytes = [needs.kv_bytes, needs.kv_state_bytes, needs.io_buffer_bytes, needs.min_expert_bytes]
            .into_iter()
            .try_fold(needs.dense_bytes, u64::checked_add);
        if needed_bytes.is_none_or(|needed| needed > total_bytes) {
            return Err(Error::BudgetTooSmall {
                needed: ByteSize(needed_bytes.unwrap_or(u64::MAX)),
                have: ByteSize(total_bytes),
                dense: ByteSize(needs.dense_bytes),
                kv: ByteSize(needs.kv_bytes),
                kv_state: ByteSize(needs.kv_state_bytes),
                io: ByteSize(needs.io_buffer_bytes),
                experts: ByteSize(needs.min_expert_bytes),
            });
        }
        // Cannot overflow: a part of the sum just checked.
        let fixed_bytes = needs.dense_bytes + needs.kv_bytes + needs.kv_state_bytes + needs.io_buffer_bytes;
        Ok(Self {
            total_bytes,
            dense_bytes: needs.dense_bytes,
            kv_bytes: needs.kv_bytes,
            kv_state_bytes: needs.kv_state_bytes,
            io_buffer_bytes: needs.io_buffer_bytes,
            expert_cache_bytes: total_bytes - fixed_bytes,
        })
    }
}

/// How many streams decoded together the expert cache can serve without
/// thrashing: how many streams' per-token working sets (the experts one
/// token routes to in every MoE layer, `stream_working_set_bytes`) it holds
/// at once. At least 1, since one stream always runs (a cache below one
/// working set streams through the I/O buffers). Past this, streams that
/// share no experts evict each other's before their next tokens can reuse
/// them, so a batch reads more per token than one stream does.
pub fn batch_capacity(expert_cache_bytes: u64, stream_working_set_bytes: u64) -> usize {
    if stream_working_set_bytes == 0 {
        // No routed experts: nothing to thrash.
        return usize::MAX;
    }
    usize::try_from(expert_cache_bytes / stream_working_set_bytes).unwrap_or(usize::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEEDS: BudgetNeeds =
        BudgetNeeds { dense_bytes: 100, kv_bytes: 20, kv_state_bytes: 0, io_buffer_bytes: 30, min_expert_bytes: 50 };

    #[test]
    fn the_expert_cache_gets_what_is_left() {
        let plan = BudgetPlan::new(1000, NEEDS).unwrap();
        assert_eq!(plan.expert_cache_bytes, 850);
    }

    #[test]
    fn fixed_kv_state_is_counted_beside_the_rows() {
        let needs = BudgetNeeds { kv_state_bytes: 40, ..NEEDS };
        let plan = BudgetPlan::new(1000, needs).unwrap();
        assert_eq!((plan.kv_bytes, plan.kv_state_bytes, plan.expert_cache_bytes), (20, 40, 810));
        let err = BudgetPlan::new(239, needs).unwrap_err().to_string();
        assert!(err.contains("240 B") && err.contains("fixed KV state 40 B"), "{err}");
        assert!(BudgetPlan::new(240, needs).is_ok());
        let huge = BudgetNeeds { kv_state_bytes: u64::MAX - 60, ..NEEDS };
        assert!(BudgetPlan::new(u64::MAX, huge).is_err(), "the sum wraps past u64::MAX");
    }

    #[test]
    fn too_small_a_budget_says_what_it_needs_and_has() {
        let err = BudgetPlan::new(199, NEEDS).unwrap_err().to_string();
        assert!(err.contains("200 B") && err.contains("199 B"), "{err}");
        assert!(BudgetPlan::new(200, NEEDS).is_ok());
    }

    #[test]
    fn needs_past_u64_are_refused_not_wrapped() {
        let huge = BudgetNeeds { kv_bytes: u64::MAX - 10, ..NEEDS };
        let err = BudgetPlan::new(4 << 20, huge).unwrap_err().to_string();
        assert!(err.contains("too small") && err.contains("TiB"), "{err}");
        assert!(BudgetPlan::new(u64::MAX, huge).is_err(), "the sum wraps past u64::MAX");
    }

    #[test]
    fn batch_capacity_counts_whole_working_sets_and_is_at_least_one() {
        assert_eq!(batch_capacity(1000, 250), 4);
        assert_eq!(batch_capacity(999, 250), 3);
        assert_eq!(batch_capacity(100, 250), 1, "one stream always runs");
        assert_eq!(batch_capacity(0, 250), 1);
        assert_eq!(batch_capacity(1000, 0), usize::MAX, "a dense model has nothing to thrash");
    }

    #[test]
    fn parses_auto_and_sizes() {
        assert_eq!("auto".parse::<RamBudget>().unwrap(), RamBudget::Auto);
        assert_eq!("2GiB".parse::<RamBudget>().unwrap(), RamBudget::Bytes(2 << 30));
        assert!("lots".parse::<RamBudget>().is_err());
        assert_eq!(parse_mem_available("MemTotal: 5 kB\nMemAvailable:   1024 kB\n").unwrap(), 1 << 20);
        assert!(RamBudget::Auto.resolve().unwrap() > 0);
    }
}
