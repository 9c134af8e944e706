//! An xDS `RateLimitConfig` as a rule file: the same document envoyproxy/ratelimit's YAML
//! would be, written as JSON (which YAML reads), so that a snapshot goes through exactly the
//! loader, checks and errors that rule files do. One key per line, so a loader error's line
//! points into the text that `/rlconfig`'s source names.

use serde_json::{Map, Value, json};

use super::overlay::Overlays;
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// A configuration as a rule file.
pub struct RuleSource {
    /// The name its errors carry: `xds:<config name>`.
    pub name: String,
    pub text: String,
    /// The overlays of its domain that changed nothing, each saying why.
    pub unused_overlays: Vec<String>,
}

/// The rule file of `config`, with `overlays` merged in.
pub fn rule_source(config: &RateLimitConfig, overlays: &Overlays) -> RuleSource {
    let mut document = Map::new();
    document.insert("domain".into(), config.domain.clone().into());
    let mut list = descriptors(&config.descriptors);
    let unused_overlays = overlays.apply(&config.domain, &mut list);
    if !config.descriptors.is_empty() {
        document.insert("descriptors".into(), list);
    }
    RuleSource {
        name: source_name(&config.name),
        text: pretty(&Value::Object(document)),
        unused_overlays,
    }
}

/// The name a configuration's rules are known by in errors and `/rlconfig`.
pub fn source_name(config_name: &str) -> String {
    format!("xds:{config_name}")
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Array(list.iter().map(descriptor).collect())
}

/// One descriptor with only the fields it sets: a field left at its protobuf default is a
/// key the rule file leaves out, so it keeps the rule file's default.
fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let mut out = Map::new();
    out.insert("key".into(), descriptor.key.clone().into());
    if !descriptor.value.is_empty() {
        out.insert("value".into(), descriptor.value.clone().into());
    }
    if let Some(policy) = &descriptor.rate_limit {
        out.insert("rate_limit".into(), rate_limit(policy));
    }
    let flags = [
        ("shadow_mode", descriptor.shadow_mode),
        ("detailed_metric", descriptor.detailed_metric),
        ("quota_mode", descriptor.quota_mode),
    ];
    for (name, set) in flags {
        if set {
            out.insert(name.into(), true.into());
        }
    }
    if !descriptor.descriptors.is_empty() {
        out.insert("descriptors".into(), descriptors(&descriptor.descriptors));
    }
    Value::Object(out)
}

fn rate_limit(policy: &RateLimitPolicy) -> Value {
    let mut out = Map::new();
    if policy.unlimited {
        out.insert("unlimited".into(), true.into());
    } else {
        // An unknown unit is left out, so the loader says the rule has none.
        if let Some(unit) = unit_name(policy.unit) {
            out.insert("unit".into(), unit.into());
        }
        out.insert("requests_per_unit".into(), policy.requests_per_unit.into());
    }
    if !policy.name.is_empty() {
        out.insert("name".into(), policy.name.clone().into());
    }
    if !policy.replaces.is_empty() {
        let replaces = (policy.replaces.iter())
            .map(|replace| json!({ "name": replace.name }))
            .collect();
        out.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(out)
}

/// The rule file's name of an xDS unit; `None` for UNKNOWN and numbers no unit has.
fn unit_name(unit: i32) -> Option<&'static str> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some("second"),
        RateLimitUnit::Minute => Some("minute"),
        RateLimitUnit::Hour => Some("hour"),
        RateLimitUnit::Day => Some("day"),
        RateLimitUnit::Week => Some("week"),
        RateLimitUnit::Month => Some("month"),
        RateLimitUnit::Year => Some("year"),
    }
}

/// JSON with one key per line.
fn pretty(value: &Value) -> String {
    // Serializing a `Value` cannot fail: its map keys are strings.
    serde_json::to_string_pretty(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use crate::rules::RuleSet;

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn load(config: &RateLimitConfig) -> Result<RuleSet, crate::rules::LoadErrors> {
        let source = rule_source(config, &Overlays::default());
        RuleSet::from_sources(&[(source.name, source.text)])
    }

    #[test]
    fn a_config_loads_as_the_rule_file_it_describes() {
        let config = RateLimitConfig {
            name: "api-limits".into(),
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: policy(RateLimitUnit::Minute, 10),
                descriptors: vec![RateLimitDescriptor {
                    key: "path".into(),
                    value: "/v1".into(),
                    rate_limit: Some(RateLimitPolicy {
                        name: "narrow".into(),
                        replaces: vec![RateLimitReplace {
                            name: "wide".into(),
                        }],
                        ..policy(RateLimitUnit::Week, 3).unwrap_or_default()
                    }),
                    shadow_mode: true,
                    quota_mode: true,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let from_xds = load(&config).expect("loads");
        let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, \
                    requests_per_unit: 10}\n    descriptors:\n      - key: path\n        \
                    value: /v1\n        shadow_mode: true\n        quota_mode: true\n        \
                    rate_limit: {unit: week, requests_per_unit: 3, name: narrow, replaces: \
                    [{name: wide}]}\n";
        let from_file = RuleSet::from_sources(&[("api.yaml".into(), yaml.into())]).expect("loads");
        assert_eq!(from_xds.dump(), from_file.dump());
    }

    #[test]
    fn an_unlimited_policy_carries_no_unit() {
        let config = RateLimitConfig {
            name: "u".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    unlimited: true,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        assert!(load(&config).expect("loads").dump().contains("unlimited"));
    }

    #[test]
    fn a_policy_without_a_unit_is_an_error_naming_the_config_and_rule() {
        let config = RateLimitConfig {
            name: "broken".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: policy(RateLimitUnit::Unknown, 5),
                ..Default::default()
            }],
        };
        let errors = load(&config).expect_err("no unit").to_string();
        assert!(errors.starts_with("xds:broken:"), "{errors}");
        assert!(errors.contains("domain d > k"), "{errors}");
        assert!(errors.contains("unit"), "{errors}");
    }

    #[test]
    fn values_are_taken_as_written_whatever_their_bytes() {
        let config = RateLimitConfig {
            name: "n".into(),
            domain: "d: {x}".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "\"quoted\"\n#not a comment".into(),
                rate_limit: policy(RateLimitUnit::Second, 1),
                ..Default::default()
            }],
        };
        let rules = load(&config).expect("loads");
        let domain = rules.domain("d: {x}").expect("the domain as written");
        assert_eq!(
            domain.descriptors.nodes[0].value.as_deref(),
            Some("\"quoted\"\n#not a comment")
        );
    }
}

#[cfg(test)]
mod overlaid {
    use super::*;
    use crate::rules::RuleSet;

    #[test]
    fn an_overlay_gives_an_xds_rule_floodgates_algorithm_and_a_bad_one_fails_the_load() {
        let config = RateLimitConfig {
            name: "api".into(),
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit: 2,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let overlays = |text: &str| -> Overlays { toml::from_str(text).expect("overlays") };
        let good = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['user']\nalgorithm = 'token_bucket'\nburst = 5\n",
        );
        let source = rule_source(&config, &good);
        let rules = RuleSet::from_sources(&[(source.name, source.text)]).expect("loads");
        assert!(
            rules.dump().contains("algorithm=token_bucket, burst=5"),
            "{}",
            rules.dump()
        );

        let bad = overlays("[[overlay]]\ndomain = 'api'\npath = ['user']\nburst = 5\n");
        let source = rule_source(&config, &bad);
        let error = RuleSet::from_sources(&[(source.name, source.text)])
            .expect_err("a burst on a fixed window");
        assert!(error.to_string().contains("xds:api"), "{error}");
    }
}
