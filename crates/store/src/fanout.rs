//! Lazy fan-out (design §9.2): an event matching more subscriptions than a
//! threshold is committed with a *fan-out job* instead of all its delivery
//! rows, and [`Store::materialize_fanout`](crate::Store::materialize_fanout)
//! creates the rows later, one batch per transaction.
//!
//! What every backend shares: the setting ([`LazyFanout`]), what a step
//! reports ([`FanoutStep`], [`FanoutBacklog`]), and the encoding of one
//! batch of planned deliveries ([`encode_batch`], [`decode_batch`]): the
//! deliveries are planned whole at ingest — their ids are made there, in
//! event order, like eagerly written ones — and a job stores them as opaque
//! batches, so a batch is read, written out and deleted as one row.

use hookd_domain::{DeliveryId, EventId, SubscriptionId};

use crate::{NewDelivery, Result, StoreError};

/// When and how a store fans out lazily. A store setting (not a caller's
/// choice), so ingest's API does not change with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LazyFanout {
    /// An event with more deliveries than this is fanned out lazily; one
    /// with this many or fewer is written whole at ingest (the common
    /// case, and the quickest to its first delivery).
    pub threshold: usize,
    /// Planned deliveries per batch: what one
    /// [`materialize_fanout`](crate::Store::materialize_fanout) writes in
    /// one transaction. Fixed for a job when it is written.
    pub batch: usize,
}

impl LazyFanout {
    /// The design's numbers: above 1,000 deliveries, in batches of 1,000.
    pub const DEFAULT: Self = Self {
        threshold: 1000,
        batch: 1000,
    };

    /// Whether an event with `deliveries` deliveries is fanned out lazily.
    pub fn is_lazy(&self, deliveries: usize) -> bool {
        deliveries > self.threshold
    }

    /// The batch size, at least 1.
    pub fn batch_size(&self) -> usize {
        self.batch.max(1)
    }
}

impl Default for LazyFanout {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What one [`materialize_fanout`](crate::Store::materialize_fanout) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanoutStep {
    /// The event whose job moved on.
    pub event_id: EventId,
    /// Planned deliveries this step took: the whole batch.
    pub materialized: u64,
    /// Of those, how many rows it created (fewer only if some existed).
    pub created: u64,
    /// Whether the job has now created all its deliveries.
    pub finished: bool,
}

/// Unfinished fan-out jobs, for a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanoutBacklog {
    /// Jobs not finished.
    pub jobs: u64,
    /// Their planned deliveries not created yet.
    pub deliveries: u64,
}

/// Version byte of the batch encoding.
const BATCH_V1: u8 = 1;

/// Encodes one batch of planned deliveries: a version byte, then per
/// delivery its id (16 bytes), its subscription's id (16 bytes), and its
/// destination host (a 2-byte big-endian length and UTF-8). Compact (about
/// 50 bytes a delivery) and read only by [`decode_batch`].
pub fn encode_batch(deliveries: &[NewDelivery]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + deliveries.len() * 50);
    out.push(BATCH_V1);
    for d in deliveries {
        out.extend_from_slice(d.id.as_uuid().as_bytes());
        out.extend_from_slice(d.sub_id.as_uuid().as_bytes());
        // A host name is at most 253 bytes (DestinationUrl checks it).
        let host =
            &d.destination_host.as_bytes()[..d.destination_host.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(host.len() as u16).to_be_bytes());
        out.extend_from_slice(host);
    }
    out
}

/// Decodes what [`encode_batch`] wrote. `Corrupt` on anything else.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<NewDelivery>> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("fan-out batch: {what}"));
    let (&version, body) = bytes.split_first().ok_or_else(|| corrupt("empty"))?;
    if version != BATCH_V1 {
        return Err(corrupt(&format!("unknown version {version}")));
    }
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8]> {
        let part = body.get(at..at + n).ok_or_else(|| corrupt("truncated"))?;
        at += n;
        Ok(part)
    };
    let uuid = |b: &[u8]| {
        let mut raw = [0; 16];
        raw.copy_from_slice(b);
        uuid::Uuid::from_bytes(raw)
    };
    let mut out = Vec::new();
    let mut left = body.len();
    while left > 0 {
        let id = uuid(take(16)?);
        let sub = uuid(take(16)?);
        let len = take(2)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let host = std::str::from_utf8(take(len)?).map_err(|_| corrupt("host is not UTF-8"))?;
        left -= 34 + len;
        out.push(NewDelivery {
            id: DeliveryId::from_uuid(id),
            sub_id: SubscriptionId::from_uuid(sub),
            destination_host: host.to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(host: &str) -> NewDelivery {
        NewDelivery {
            id: DeliveryId::new(),
            sub_id: SubscriptionId::new(),
            destination_host: host.to_owned(),
        }
    }

    #[test]
    fn a_batch_round_trips() {
        let batch = vec![planned("a.example"), planned(""), planned("ü.example")];
        assert_eq!(decode_batch(&encode_batch(&batch)).unwrap(), batch);
        assert_eq!(decode_batch(&encode_batch(&[])).unwrap(), vec![]);
    }

    #[test]
    fn a_damaged_batch_is_corrupt() {
        let bytes = encode_batch(&[planned("a.example")]);
        for cut in [0, 5, 20, 33, bytes.len() - 1] {
            assert!(
                matches!(decode_batch(&bytes[..cut]), Err(StoreError::Corrupt(_))),
                "cut at {cut}"
            );
        }
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(matches!(decode_batch(&other), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn the_threshold_is_exclusive() {
        let f = LazyFanout::DEFAULT;
        assert!(!f.is_lazy(1000));
        assert!(f.is_lazy(1001));
        assert_eq!(
            LazyFanout {
                threshold: 1,
                batch: 0
            }
            .batch_size(),
            1
        );
    }
}
