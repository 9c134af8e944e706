//! `dynamic_metadata` (when enabled): the domain, each descriptor's entries, code and limit
//! name, quota-mode violations, and the `metadata` of every matched rule whose descriptor is
//! under its limit — what Envoy needs to log, route on quota, or fail over.

use pbjson_types::{ListValue, Struct, Value, value::Kind};

use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::response::Outcome;

pub(super) fn build(request: &RateLimitRequest, outcomes: &[Outcome]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    // Rule metadata first, so floodgate's own fields win a name clash.
    for outcome in outcomes.iter().filter(|o| !o.over_limit) {
        if let Some(user) = outcome.rule.and_then(|rule| rule.metadata.as_ref()) {
            for (key, value) in user {
                fields.insert(key.clone(), json(value));
            }
        }
    }
    let descriptors = request
        .descriptors
        .iter()
        .zip(outcomes)
        .map(|(descriptor, outcome)| {
            let entries = descriptor
                .entries
                .iter()
                .map(|e| object([("key", string(&e.key)), ("value", string(&e.value))]))
                .collect();
            let code = if outcome.status.code == Code::OverLimit as i32 {
                "OVER_LIMIT"
            } else {
                "OK"
            };
            let mut item = vec![("entries", list(entries)), ("code", string(code))];
            if let Some((Some(name), _, _)) = outcome.reported {
                item.push(("limitName", string(name)));
            }
            object(item)
        })
        .collect();
    fields.insert("domain".into(), string(&request.domain));
    fields.insert("descriptors".into(), list(descriptors));
    let violations: Vec<Value> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.quota && o.over_limit)
        .map(|(i, _)| number(i as f64))
        .collect();
    fields.insert(
        "quotaModeEnabled".into(),
        kind(Kind::BoolValue(outcomes.iter().any(|o| o.quota))),
    );
    fields.insert("quotaModeViolations".into(), list(violations));
    Struct { fields }
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
