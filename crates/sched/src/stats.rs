//! Time accounting of the MoE pipeline.

/// Where a layer's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Waiting for expert loads that had not arrived yet.
    pub stall_ns: u64,
    /// Computing experts.
    pub compute_ns: u64,
}

impl LayerStats {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: LayerStats) {
        self.stall_ns += other.stall_ns;
        self.compute_ns += other.compute_ns;
    }
}
