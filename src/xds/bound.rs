//! A snapshot is bounded before it is expanded. A `RateLimitConfig` of many small descriptors
//! takes many times its wire size once decoded (some 200 bytes for a descriptor of 20) and as
//! rule text (some 140), so each bound is checked before the step that would expand past it:
//!
//! - **The message**: at most `xds.max_message_bytes` (4 MiB by default,
//!   `settings::DEFAULT_XDS_MAX_MESSAGE_BYTES`), refused by tonic as it arrives.
//! - **The items**: every descriptor and every `replaces` entry becomes at least
//!   [`MIN_ITEM_TEXT_BYTES`] of rule text, so a snapshot of more than `rules_max_bytes /
//!   MIN_ITEM_TEXT_BYTES` of them could never fit `rules_max_bytes`. They are counted on the
//!   encoded bytes, allocating nothing ([`ItemCount`]), before a configuration is decoded.
//! - **The text**: `convert.rs` writes the rule text into the room `rules_max_bytes` leaves,
//!   and stops where a snapshot would pass it.

use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};

/// The least rule text a descriptor or a `replaces` entry becomes: `{"key": ""}` or
/// `{"name": ""}` with its indentation, line breaks and comma take more (a test checks).
pub const MIN_ITEM_TEXT_BYTES: u64 = 16;

/// How deep the count follows nested messages: prost's own recursion limit, past which the
/// configuration does not decode anyway.
const MAX_DEPTH: u32 = 100;

/// The items (descriptors and `replaces` entries) of one snapshot's configurations, counted
/// on the wire against the most `rules_max_bytes` of rule text can hold.
pub struct ItemCount {
    counted: u64,
    max: u64,
    max_bytes: u64,
}

/// A snapshot with more items than `rules_max_bytes` can hold as rule text.
#[derive(Debug, thiserror::Error)]
#[error(
    "the snapshot holds more than {max} descriptors and replaces entries (counting stopped in \
     resource {resource}): each becomes at least {MIN_ITEM_TEXT_BYTES} bytes of rule text, \
     so no more fit in rules_max_bytes ({max_bytes}); raise the setting or send fewer rules"
)]
pub struct TooManyItems {
    pub max: u64,
    pub max_bytes: u64,
    /// The index of the resource that went past it.
    pub resource: usize,
}

/// The kinds of message whose fields the count looks into.
#[derive(Clone, Copy)]
enum Kind {
    Config,
    Descriptor,
    Policy,
}

impl ItemCount {
    /// A count against `max_bytes` (`rules_max_bytes`) of rule text.
    pub fn new(max_bytes: u64) -> ItemCount {
        ItemCount {
            counted: 0,
            max: max_bytes / MIN_ITEM_TEXT_BYTES,
            max_bytes,
        }
    }

    /// Counts the items of resource `resource`, an encoded `RateLimitConfig`; an error as soon
    /// as the snapshot holds more than allowed. Bytes that do not parse end the count: what
    /// was counted is within the bound, and decoding them reports the error.
    pub fn count(&mut self, resource: usize, encoded: &[u8]) -> Result<(), TooManyItems> {
        self.walk(encoded, Kind::Config, 0)
            .map_err(|Full| TooManyItems {
                max: self.max,
                max_bytes: self.max_bytes,
                resource,
            })
    }

    fn walk(&mut self, mut buf: &[u8], kind: Kind, depth: u32) -> Result<(), Full> {
        if depth >= MAX_DEPTH {
            return Ok(());
        }
        while let Some((tag, field)) = next_message_field(&mut buf) {
            let Some(field) = field else { continue };
            match (kind, tag) {
                (Kind::Config, 3) | (Kind::Descriptor, 4) => {
                    self.add_one()?;
                    self.walk(field, Kind::Descriptor, depth + 1)?;
                }
                (Kind::Descriptor, 3) => self.walk(field, Kind::Policy, depth + 1)?,
                (Kind::Policy, 5) => self.add_one()?,
                _ => {}
            }
        }
        Ok(())
    }

    fn add_one(&mut self) -> Result<(), Full> {
        self.counted += 1;
        if self.counted > self.max {
            return Err(Full);
        }
        Ok(())
    }
}

/// The count went past its most.
struct Full;

/// The next field of the message in `buf`: its tag, and its bytes when it is length-delimited
/// (a string, bytes or a message); `None` at the end, or where the bytes do not parse.
fn next_message_field<'b>(buf: &mut &'b [u8]) -> Option<(u32, Option<&'b [u8]>)> {
    if buf.is_empty() {
        return None;
    }
    let (tag, wire_type) = decode_key(buf).ok()?;
    if wire_type != WireType::LengthDelimited {
        skip_field(wire_type, tag, buf, DecodeContext::default()).ok()?;
        return Some((tag, None));
    }
    let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
    let field = buf.get(..len)?;
    *buf = &buf[len..];
    Some((tag, Some(field)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace,
    };
    use prost::Message;

    fn descriptor(children: Vec<RateLimitDescriptor>, replaces: usize) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                replaces: vec![RateLimitReplace::default(); replaces],
                ..Default::default()
            }),
            descriptors: children,
            ..Default::default()
        }
    }

    fn encoded(descriptors: Vec<RateLimitDescriptor>) -> Vec<u8> {
        RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors,
        }
        .encode_to_vec()
    }

    #[test]
    fn descriptors_at_every_level_and_replaces_entries_are_counted() {
        // 3 descriptors, 2 of them nested, and 4 replaces entries: 7 items.
        let config = encoded(vec![descriptor(
            vec![descriptor(vec![descriptor(vec![], 3)], 1)],
            0,
        )]);
        let at = |max_bytes| ItemCount::new(max_bytes).count(0, &config);
        assert!(at(7 * MIN_ITEM_TEXT_BYTES).is_ok());
        let error = at(6 * MIN_ITEM_TEXT_BYTES).expect_err("7 items, 6 allowed");
        assert!(
            error
                .to_string()
                .contains(&format!("rules_max_bytes ({})", 6 * MIN_ITEM_TEXT_BYTES)),
            "{error}"
        );
    }

    #[test]
    fn the_count_runs_over_the_whole_snapshot() {
        let config = encoded(vec![descriptor(vec![], 0); 3]);
        let mut count = ItemCount::new(5 * MIN_ITEM_TEXT_BYTES);
        assert!(count.count(0, &config).is_ok());
        let error = count.count(1, &config).expect_err("6 items, 5 allowed");
        assert_eq!(error.resource, 1);
    }

    #[test]
    fn bytes_that_do_not_parse_end_the_count_for_the_decoder_to_report() {
        let mut config = encoded(vec![descriptor(vec![], 0); 3]);
        config.truncate(config.len() - 1);
        assert!(
            ItemCount::new(MIN_ITEM_TEXT_BYTES * 3)
                .count(0, &config)
                .is_ok()
        );
        assert!(RateLimitConfig::decode(&config[..]).is_err());
    }
}
