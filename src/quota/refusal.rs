//! What a stream says when it refuses a report or a bucket: a status message of a few
//! hundred bytes, whatever the report held, and why a bucket cannot be a descriptor.

use crate::proto::envoy::service::rate_limit_quota::v3::BucketId;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::rules::Entry;
use crate::settings::RequestLimits;

use super::BucketKey;

/// Buckets a refusal names; the others are counted. A status message travels in a header,
/// which clients cap (16 KiB is common): a refusal stays a few hundred bytes.
const BUCKETS_NAMED: usize = 3;
/// Entries of a bucket a refusal quotes.
const ENTRIES_QUOTED: usize = 4;
/// Characters of a name or value a refusal quotes.
const CHARS_QUOTED: usize = 64;

/// The first [`BUCKETS_NAMED`] of `items`, joined by `separator`, and how many more.
pub(super) fn listed(items: &[String], separator: &str) -> String {
    let named = &items[..items.len().min(BUCKETS_NAMED)];
    match items.len() - named.len() {
        0 => named.join(separator),
        more => format!("{} and {more} more", named.join(separator)),
    }
}

/// A bucket's entries as a refusal quotes them: `{name=value, …}`, long values cut.
pub(super) fn describe(key: &BucketKey) -> String {
    let mut entries: Vec<String> = (key.iter().take(ENTRIES_QUOTED))
        .map(|entry| format!("{}={}", cut(&entry.key), cut(&entry.value)))
        .collect();
    if key.len() > ENTRIES_QUOTED {
        entries.push(format!("{} more entries", key.len() - ENTRIES_QUOTED));
    }
    format!("{{{}}}", entries.join(", "))
}

/// `text` cut as [`cut`] cuts it, quoted and escaped as Rust writes a string.
pub(super) fn quoted(text: &str) -> String {
    format!("{:?}", cut(text))
}

/// `text` up to [`CHARS_QUOTED`] characters, and an ellipsis where it went on.
pub(super) fn cut(text: &str) -> String {
    let mut kept: String = text.chars().take(CHARS_QUOTED).collect();
    if kept.len() < text.len() {
        kept.push('…');
    }
    kept
}

/// A usage's bucket as the server keys it: its entries, which must be a descriptor's
/// (`request_limits`: not too many, no name or value empty or too long); why it cannot be.
pub(super) fn bucket_key(
    usage: &BucketQuotaUsage,
    limits: &RequestLimits,
) -> Result<BucketKey, String> {
    let Some(BucketId { bucket }) = &usage.bucket_id else {
        return Err("no bucket_id".into());
    };
    if bucket.is_empty() {
        return Err("a bucket_id with no entries".into());
    }
    if bucket.len() > limits.max_entries {
        return Err(format!(
            "a bucket_id of {} entries; at most {} are allowed",
            bucket.len(),
            limits.max_entries
        ));
    }
    for (name, value) in bucket {
        if name.is_empty() || value.is_empty() {
            return Err("a bucket_id entry with an empty name or value".into());
        }
        if name.len() > limits.max_key_bytes {
            return Err(format!(
                "a bucket_id entry name of {} bytes; at most {} are allowed",
                name.len(),
                limits.max_key_bytes
            ));
        }
        if value.len() > limits.max_value_bytes {
            return Err(format!(
                "the value of bucket_id entry {} is {} bytes; at most {} are allowed",
                quoted(name),
                value.len(),
                limits.max_value_bytes
            ));
        }
    }
    let mut key: BucketKey = (bucket.iter())
        .map(|(name, value)| Entry::new(name.clone(), value.clone()))
        .collect();
    key.sort();
    Ok(key)
}
