//! A record of the log: its kinds (park, park with a not-before instant, park with what the
//! task carries (an instant, a trace, the costs of a task of several kinds), park held for parents, claim, gone, a parent's end), its bytes (tag, kind, entry id, body, checksum) inside yaque's
//! frames, and how damage is told from a good record.

use crate::core::EntryId;

/// Every record starts with this tag.
pub(super) const MAGIC: [u8; 4] = *b"PLq1";
/// Tag, kind, entry id, checksum.
pub(super) const RECORD_OVERHEAD: usize = 4 + 1 + 8 + 8;
/// yaque's frame header: 26 bits of length and 6 parity bits.
pub(super) const FRAME_HEADER: usize = 4;
/// The largest frame yaque writes (its header holds 26 bits of length).
pub(super) const MAX_FRAME: usize = (1 << 26) - 1;
/// yaque's end-of-segment marker.
pub(super) const SEGMENT_END: [u8; 4] = [0xFF; 4];
pub(super) const PARK: u8 = 1;
pub(super) const CLAIM: u8 = 2;
pub(super) const GONE: u8 = 3;
/// A park of a task that must not start before an instant (a scheduled start): its body is
/// the instant (8 bytes, little-endian ms since the Unix epoch), then the task.
pub(super) const PARK_AT: u8 = 4;
/// A park of a task that carries its trace (and maybe a not-before instant): its body is a
/// byte of flags ([`CARRIES_INSTANT`], [`CARRIES_TRACE`]), then the instant (8 bytes,
/// little-endian ms since the Unix epoch) if flagged, then the trace (16 bytes of trace id,
/// 8 of span id, 1 of trace flags) if flagged, then the task. A park without a trace is
/// written as `PARK` or `PARK_AT`, which every earlier version reads.
pub(super) const PARK_CARRIED: u8 = 5;
/// A park of a task held until its parents end: its body is a byte saying whether it runs
/// anyway, the number of parents (2 bytes, little-endian), each parent's entry and caller's
/// task id (8 bytes each, little-endian), then a `PARK_CARRIED` body (flags, what they say,
/// the task). Earlier versions do not read it (they set it aside as damage).
pub(super) const PARK_HELD: u8 = 6;
/// The end of a parent that a held task names: the entry is gone, and its body is how it
/// ended (a `TaskStatus` as JSON), which the held tasks that name it read after a restart.
/// Written instead of `GONE` for such a parent, and for a parent the queue never stored.
pub(super) const ENDED: u8 = 7;
/// The flag of a `PARK_CARRIED` body that holds an instant.
pub(super) const CARRIES_INSTANT: u8 = 1;
/// The flag of a `PARK_CARRIED` body that holds a trace.
pub(super) const CARRIES_TRACE: u8 = 2;
/// The bytes of a trace in a `PARK_CARRIED` body.
pub(super) const TRACE_LEN: usize = 16 + 8 + 1;
/// The flag of a `PARK_CARRIED` body that holds the costs of a task of several kinds (core
/// rule 25), after the trace: each kind's units beside the task's first cost (4 bytes,
/// little-endian, in kind index order). Versions before it set such a record aside as
/// damage rather than run the task without its costs.
pub(super) const CARRIES_COSTS: u8 = 4;
/// The bytes of the costs in a `PARK_CARRIED` body.
pub(super) const COSTS_LEN: usize = 4 * crate::util::serde::ResourceKind::COUNT;

/// The frame starting at `at`, if it is whole and its record checks: (kind, entry, body,
/// where the next frame starts).
pub(super) fn frame_at(bytes: &[u8], at: usize) -> Option<(u8, EntryId, &[u8], usize)> {
    let header: [u8; 4] = bytes.get(at..at + FRAME_HEADER)?.try_into().ok()?;
    let len = (u32::from_be_bytes(header) & 0x03FF_FFFF) as usize;
    let start = at + FRAME_HEADER;
    let record = bytes.get(start..start.checked_add(len)?)?;
    let (kind, entry, body) = decode(record)?;
    Some((kind, entry, body, start + len))
}

pub(super) fn encode(kind: u8, entry: EntryId, body: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(body.len() + RECORD_OVERHEAD);
    record.extend_from_slice(&MAGIC);
    record.push(kind);
    record.extend_from_slice(&entry.to_le_bytes());
    record.extend_from_slice(body);
    let sum = checksum(&record);
    record.extend_from_slice(&sum.to_le_bytes());
    record
}

pub(super) fn decode(record: &[u8]) -> Option<(u8, EntryId, &[u8])> {
    if record.len() < RECORD_OVERHEAD || !record.starts_with(&MAGIC) {
        return None;
    }
    let (content, sum) = record.split_at(record.len() - 8);
    if checksum(content).to_le_bytes() != sum {
        return None;
    }
    let kind = content[4];
    if !(PARK..=ENDED).contains(&kind) {
        return None;
    }
    let entry = EntryId::from_le_bytes(content[5..13].try_into().ok()?);
    Some((kind, entry, &content[13..]))
}

/// FNV-1a, 64 bits: tells a damaged record from a good one (not an adversary's).
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a `park` record with a task of `task_len` bytes takes on disk.
pub(super) fn record_len(task_len: usize) -> u64 {
    (FRAME_HEADER + RECORD_OVERHEAD + task_len) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let record = encode(PARK, 42, b"{\"x\":1}");
        assert_eq!(decode(&record), Some((PARK, 42, &b"{\"x\":1}"[..])));
        for index in 0..record.len() {
            let mut damaged = record.clone();
            damaged[index] ^= 0x10;
            assert_eq!(
                decode(&damaged),
                None,
                "a flipped bit at {index} is noticed"
            );
        }
        assert_eq!(decode(&record[..record.len() - 1]), None, "truncated");
    }
}
