//! Stores over small temporary expert files, shared by the store's tests.

use std::sync::Arc;

use super::{ExpertKey, ExpertSource, ExpertStore, StoreOptions};
use crate::io::RecordCheck;
use crate::policy::PolicyKind;
use crate::usage::Usage;

pub(super) const RECORD: usize = 4096;

pub(super) fn open_store(records: usize, options: StoreOptions) -> (tempfile::TempDir, ExpertStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layer_000.bin");
    let bytes: Vec<u8> = (0..records * RECORD).map(|i| (i / RECORD) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    let source = ExpertSource { path, record_bytes: RECORD, num_experts: records, check: None };
    let store = ExpertStore::open(vec![Some(source)], options, Usage::default()).unwrap();
    (dir, store)
}

pub(super) fn store_with(
    records: usize,
    capacity_bytes: usize,
    policy: PolicyKind,
) -> (tempfile::TempDir, ExpertStore) {
    open_store(records, StoreOptions { capacity_bytes, policy, ..StoreOptions::default() })
}

pub(super) fn key(expert: usize) -> ExpertKey {
    ExpertKey { layer: 0, expert }
}

/// A store of two records whose check refuses expert 1 (every record
/// but expert 0's starts with a nonzero byte).
pub(super) fn store_refusing_expert_1(options: StoreOptions) -> (tempfile::TempDir, ExpertStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layer_000.bin");
    let bytes: Vec<u8> = (0..2 * RECORD).map(|i| (i / RECORD) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    let check: RecordCheck = Arc::new(|expert, record| match record[0] {
        0 => Ok(()),
        _ => Err(format!("expert {expert} is bad")),
    });
    let source = ExpertSource { path, record_bytes: RECORD, num_experts: 2, check: Some(check) };
    (dir, ExpertStore::open(vec![Some(source)], options, Usage::default()).unwrap())
}
