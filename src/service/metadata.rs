//! `dynamic_metadata` (when enabled), in upstream's shape (envoyproxy/ratelimit since its
//! #1112): the `domain`; each descriptor's `entries` as `key=value` strings, with its
//! `limit` override and `hitsAddend` when it has them; the request's `hitsAddend` when not
//! 0; and under `metadata`, the `metadata` of every matched rule whose descriptor is under
//! its limit, merged in request order (maps merge key by key; otherwise the first wins).

use pbjson_types::{ListValue, Struct, Value, value::Kind};

use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;

use super::outcome::Outcome;

pub(super) fn build(request: &RateLimitRequest, outcomes: &[Outcome]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".into(), string(&request.domain));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert("descriptors".into(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(f64::from(request.hits_addend)));
    }
    let mut passed = Struct::default();
    for outcome in outcomes.iter().filter(|o| !o.over_limit) {
        if let Some(user) = outcome.rule.and_then(|rule| rule.metadata.as_ref()) {
            let user = user.iter().map(|(key, value)| (key.clone(), json(value)));
            merge(&mut passed, user.collect());
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".into(), kind(Kind::StructValue(passed)));
    }
    Struct { fields }
}

/// One request descriptor as upstream writes it.
fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let entries = (descriptor.entries.iter())
        .map(|e| string(&format!("{}={}", e.key, e.value)))
        .collect();
    let mut item = vec![("entries", list(entries))];
    if let Some(limit) = &descriptor.limit {
        let text = format!(
            "requests_per_unit:{} unit:{}",
            limit.requests_per_unit,
            crate::proto::envoy::r#type::v3::RateLimitUnit::try_from(limit.unit)
                .map_or("UNKNOWN", |unit| unit.as_str_name())
        );
        item.push(("limit", string(&text)));
    }
    if let Some(hits) = descriptor.hits_addend {
        item.push(("hitsAddend", number(hits.value as f64)));
    }
    object(item)
}

/// Adds `more` to `into`: a key both hold merges when both values are maps, and keeps
/// `into`'s otherwise.
fn merge(into: &mut Struct, more: std::collections::HashMap<String, Value>) {
    for (key, value) in more {
        match (into.fields.get_mut(&key), value) {
            (None, value) => {
                into.fields.insert(key, value);
            }
            (
                Some(Value {
                    kind: Some(Kind::StructValue(first)),
                }),
                Value {
                    kind: Some(Kind::StructValue(second)),
                },
            ) => merge(first, second.fields),
            (Some(_), _) => {}
        }
    }
}

fn kind(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(text: &str) -> Value {
    kind(Kind::StringValue(text.to_owned()))
}

fn number(n: f64) -> Value {
    kind(Kind::NumberValue(n))
}

fn list(values: Vec<Value>) -> Value {
    kind(Kind::ListValue(ListValue { values }))
}

fn object<'a>(fields: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    kind(Kind::StructValue(Struct {
        fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    }))
}

/// A rule file's metadata value as a protobuf `Value`.
fn json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => kind(Kind::NullValue(0)),
        serde_json::Value::Bool(b) => kind(Kind::BoolValue(*b)),
        serde_json::Value::Number(n) => number(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => string(s),
        serde_json::Value::Array(items) => list(items.iter().map(json).collect()),
        serde_json::Value::Object(map) => object(map.iter().map(|(k, v)| (k.as_str(), json(v)))),
    }
}
