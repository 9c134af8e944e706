//! An xDS `RateLimitConfig` as a rule file: the same document envoyproxy/ratelimit's YAML
//! would be, written as JSON (which YAML reads), so that a snapshot goes through exactly the
//! loader, checks and errors that rule files do. One key per line, so a loader error's line
//! points into the text that `/rlconfig`'s source names.
//!
//! The text is written straight from the decoded configuration, overlays merged in on the
//! way, into the room `rules_max_bytes` leaves it: a snapshot too large stops where it passes
//! the bound, having built nothing bigger than the bound allows (`bound.rs`).

use std::io;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::overlay::{Additions, DomainOverlays, Overlays};
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};

/// A configuration as a rule file.
pub struct RuleSource {
    /// The name its errors carry: `xds:<config name>`.
    pub name: String,
    pub text: String,
    /// The overlays of its domain that changed nothing, each saying why.
    pub unused_overlays: Vec<String>,
}

/// The rule file would take more than the room it was given.
#[derive(Debug, PartialEq, Eq)]
pub struct OutOfRoom;

/// The rule file of `config`, with `overlays` merged in, if it fits in `room` bytes.
pub fn rule_source(
    config: &RateLimitConfig,
    overlays: &Overlays,
    room: usize,
) -> Result<RuleSource, OutOfRoom> {
    let overlays = overlays.of_domain(&config.domain);
    let mut text = Bounded {
        text: Vec::new(),
        room,
    };
    let file = File {
        config,
        overlays: &overlays,
    };
    // The writer's refusal is the only error: the document is strings, numbers and booleans
    // under string keys.
    (file.serialize(&mut serde_json::Serializer::pretty(&mut text))).map_err(|_| OutOfRoom)?;
    Ok(RuleSource {
        name: source_name(&config.name),
        // serde_json writes UTF-8.
        text: String::from_utf8(text.text)
            .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned()),
        unused_overlays: overlays.unused(),
    })
}

/// The name a configuration's rules are known by in errors and `/rlconfig`.
pub fn source_name(config_name: &str) -> String {
    format!("xds:{config_name}")
}

/// Text that refuses a write taking it past `room` bytes.
struct Bounded {
    text: Vec<u8>,
    room: usize,
}

impl io::Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if bytes.len() > self.room - self.text.len() {
            return Err(io::Error::other("out of room"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The whole file: the domain and its descriptors.
struct File<'a> {
    config: &'a RateLimitConfig,
    overlays: &'a DomainOverlays<'a>,
}

impl Serialize for File<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("domain", &self.config.domain)?;
        if !self.config.descriptors.is_empty() {
            let top = Level {
                list: &self.config.descriptors,
                depth: 0,
                candidates: self.overlays.all(),
                overlays: self.overlays,
            };
            map.serialize_entry("descriptors", &top)?;
        }
        map.end()
    }
}

/// The descriptors of one level, `depth` below the domain, with the overlays whose path
/// leads there.
struct Level<'a> {
    list: &'a [RateLimitDescriptor],
    depth: usize,
    candidates: Vec<usize>,
    overlays: &'a DomainOverlays<'a>,
}

impl Serialize for Level<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut list = serializer.serialize_seq(None)?;
        for descriptor in self.list {
            let (additions, deeper) = self.overlays.at(&self.candidates, self.depth, descriptor);
            list.serialize_element(&Descriptor {
                descriptor,
                additions,
                children: Level {
                    list: &descriptor.descriptors,
                    depth: self.depth + 1,
                    candidates: deeper,
                    overlays: self.overlays,
                },
            })?;
        }
        list.end()
    }
}

/// One descriptor with only the fields it sets: a field left at its protobuf default is a
/// key the rule file leaves out, so it keeps the rule file's default.
struct Descriptor<'a> {
    descriptor: &'a RateLimitDescriptor,
    additions: Additions<'a>,
    children: Level<'a>,
}

impl Serialize for Descriptor<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let descriptor = self.descriptor;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("key", &descriptor.key)?;
        if !descriptor.value.is_empty() {
            map.serialize_entry("value", &descriptor.value)?;
        }
        if let Some(policy) = &descriptor.rate_limit {
            let limit = Limit {
                policy,
                additions: &self.additions,
            };
            map.serialize_entry("rate_limit", &limit)?;
        }
        let flags = [
            ("shadow_mode", descriptor.shadow_mode),
            ("detailed_metric", descriptor.detailed_metric),
            ("quota_mode", descriptor.quota_mode),
        ];
        for (name, set) in flags {
            if set {
                map.serialize_entry(name, &true)?;
            }
        }
        if let Some(policy) = self.additions.on_backend_error {
            map.serialize_entry("on_backend_error", policy)?;
        }
        // A protobuf Struct serializes as the JSON object it stands for: a YAML mapping.
        if let Some(metadata) = descriptor
            .metadata
            .as_ref()
            .filter(|m| !m.fields.is_empty())
        {
            map.serialize_entry("metadata", metadata)?;
        }
        if !descriptor.descriptors.is_empty() {
            map.serialize_entry("descriptors", &self.children)?;
        }
        map.end()
    }
}

/// A descriptor's `rate_limit`, with what overlays add to it.
struct Limit<'a> {
    policy: &'a RateLimitPolicy,
    additions: &'a Additions<'a>,
}

impl Serialize for Limit<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (policy, additions) = (self.policy, self.additions);
        let mut map = serializer.serialize_map(None)?;
        if policy.unlimited {
            map.serialize_entry("unlimited", &true)?;
        } else {
            // An unknown unit is left out, so the loader says the rule has none.
            if let Some(unit) = unit_name(policy.unit) {
                map.serialize_entry("unit", unit)?;
            }
            map.serialize_entry("requests_per_unit", &policy.requests_per_unit)?;
        }
        if !policy.name.is_empty() {
            map.serialize_entry("name", &policy.name)?;
        }
        if !policy.replaces.is_empty() {
            map.serialize_entry("replaces", &Replaces(&policy.replaces))?;
        }
        if let Some(algorithm) = additions.algorithm {
            map.serialize_entry("algorithm", algorithm)?;
        }
        if let Some(burst) = additions.burst {
            map.serialize_entry("burst", &burst)?;
        }
        if let Some(multiplier) = additions.unit_multiplier {
            map.serialize_entry("unit_multiplier", &multiplier)?;
        }
        if let Some(timezone) = additions.timezone {
            map.serialize_entry("timezone", timezone)?;
        }
        if let Some(lease) = additions.lease {
            map.serialize_entry("lease", &lease)?;
        }
        map.end()
    }
}

/// `replaces`: a list of `{name: …}`.
struct Replaces<'a>(&'a [RateLimitReplace]);

impl Serialize for Replaces<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|replace| Named(&replace.name)))
    }
}

/// One entry of `replaces`: `{name: …}`.
struct Named<'a>(&'a str);

impl Serialize for Named<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("name", self.0)?;
        map.end()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleSet;
    use crate::xds::bound::MIN_ITEM_TEXT_BYTES;

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn load(config: &RateLimitConfig) -> Result<RuleSet, crate::rules::LoadErrors> {
        let source = rule_source(config, &Overlays::default(), usize::MAX).expect("fits");
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

    fn text(config: &RateLimitConfig) -> String {
        (rule_source(config, &Overlays::default(), usize::MAX).expect("fits")).text
    }

    #[test]
    fn the_text_stops_where_it_would_pass_its_room() {
        let config = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "k".into(),
                    rate_limit: policy(RateLimitUnit::Second, 1),
                    ..Default::default()
                };
                10
            ],
        };
        let whole = text(&config).len();
        assert!(rule_source(&config, &Overlays::default(), whole).is_ok());
        let short = rule_source(&config, &Overlays::default(), whole - 1);
        assert_eq!(short.err(), Some(OutOfRoom));
    }

    #[test]
    fn every_descriptor_and_replaces_entry_takes_at_least_the_least_item_text() {
        let empty = RateLimitDescriptor::default();
        let one_replace = || RateLimitPolicy {
            replaces: vec![RateLimitReplace::default()],
            ..Default::default()
        };
        let config = |descriptors| RateLimitConfig {
            descriptors,
            ..Default::default()
        };
        let nested = |children| RateLimitDescriptor {
            descriptors: children,
            ..Default::default()
        };
        let with_policy = |policy: RateLimitPolicy| RateLimitDescriptor {
            rate_limit: Some(policy),
            ..Default::default()
        };
        let least = MIN_ITEM_TEXT_BYTES as usize;
        let pairs = [
            // A first descriptor, a second one, a nested one, a replaces entry.
            (config(vec![]), config(vec![empty.clone()])),
            (
                config(vec![empty.clone()]),
                config(vec![empty.clone(), empty.clone()]),
            ),
            (
                config(vec![empty.clone()]),
                config(vec![nested(vec![empty.clone()])]),
            ),
            (
                config(vec![with_policy(RateLimitPolicy::default())]),
                config(vec![with_policy(one_replace())]),
            ),
        ];
        for (fewer, more) in pairs {
            let (fewer, more) = (text(&fewer), text(&more));
            assert!(more.len() >= fewer.len() + least, "{fewer}\n{more}");
        }
    }
}

#[cfg(test)]
mod overlaid {
    use super::*;
    use crate::rules::RuleSet;
    use serde_json::Value;

    #[test]
    fn an_overlay_gives_an_xds_rule_floodgates_algorithm_and_a_bad_one_fails_the_load() {
        let config = one_limit("user", RateLimitUnit::Minute, 2);
        let good = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['user']\nalgorithm = 'token_bucket'\nburst = 5\n",
        );
        let source = rule_source(&config, &good, usize::MAX).expect("fits");
        let rules = RuleSet::from_sources(&[(source.name, source.text)]).expect("loads");
        assert!(
            rules.dump().contains("algorithm=token_bucket, burst=5"),
            "{}",
            rules.dump()
        );

        let bad = overlays("[[overlay]]\ndomain = 'api'\npath = ['user']\nburst = 5\n");
        let source = rule_source(&config, &bad, usize::MAX).expect("fits");
        let error = RuleSet::from_sources(&[(source.name, source.text)])
            .expect_err("a burst on a fixed window");
        assert!(error.to_string().contains("xds:api"), "{error}");
    }

    #[test]
    fn an_overlay_leases_an_xds_rule_where_its_algorithm_can() {
        let config = one_limit("tenant", RateLimitUnit::Hour, 200);
        let leased = overlays("[[overlay]]\ndomain = 'api'\npath = ['tenant']\nlease = true\n");
        let source = rule_source(&config, &leased, usize::MAX).expect("fits");
        let rules = RuleSet::from_sources(&[(source.name, source.text)]).expect("loads");
        assert!(rules.dump().contains("lease=true"), "{}", rules.dump());

        let refused = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['tenant']\nalgorithm = 'sliding_log'\n\
             lease = true\n",
        );
        let source = rule_source(&config, &refused, usize::MAX).expect("fits");
        let error = RuleSet::from_sources(&[(source.name, source.text)])
            .expect_err("a sliding log does not lease");
        let error = error.to_string();
        assert!(
            error.contains("xds:api") && error.contains("lease"),
            "{error}"
        );
    }

    /// The config of domain `api`: one descriptor, `key`, limited to `requests` a `unit`.
    fn one_limit(key: &str, unit: RateLimitUnit, requests: u32) -> RateLimitConfig {
        RateLimitConfig {
            name: "api".into(),
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                key: key.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: unit as i32,
                    requests_per_unit: requests,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }
    }

    fn overlays(text: &str) -> Overlays {
        toml::from_str(text).expect("overlays")
    }

    fn limited(key: &str, value: &str, children: Vec<RateLimitDescriptor>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: 9,
                ..Default::default()
            }),
            descriptors: children,
            ..Default::default()
        }
    }

    fn written(descriptors: Vec<RateLimitDescriptor>, overlays: &Overlays) -> (Value, Vec<String>) {
        let config = RateLimitConfig {
            name: "api".into(),
            domain: "api".into(),
            descriptors,
        };
        let source = rule_source(&config, overlays, usize::MAX).expect("fits");
        let document = serde_json::from_str(&source.text).expect("JSON");
        (document, source.unused_overlays)
    }

    #[test]
    fn an_overlay_extends_the_limit_and_policy_of_the_descriptor_it_names() {
        let descriptors = vec![
            limited("user", "", vec![limited("path", "/v1", vec![])]),
            limited("path", "/v1", vec![]),
        ];
        let (document, unused) = written(
            descriptors,
            &overlays(
                "[[overlay]]\ndomain = 'api'\npath = ['user', 'path=/v1']\nalgorithm = 'gcra'\n\
                 burst = 20\non_backend_error = 'local'\n",
            ),
        );
        assert!(unused.is_empty(), "{unused:?}");
        let nested = &document["descriptors"][0]["descriptors"][0];
        assert_eq!(nested["rate_limit"]["algorithm"], "gcra");
        assert_eq!(nested["rate_limit"]["burst"], 20);
        assert_eq!(nested["on_backend_error"], "local");
        let others = [&document["descriptors"][0], &document["descriptors"][1]];
        for other in others {
            assert_eq!(
                other["rate_limit"].get("algorithm"),
                None,
                "only the one named"
            );
        }
    }

    #[test]
    fn an_overlay_that_names_nothing_or_no_limit_is_reported_and_changes_nothing() {
        let bare = RateLimitDescriptor {
            key: "user".into(),
            ..Default::default()
        };
        let overlays = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['nobody']\nburst = 2\n\
             [[overlay]]\ndomain = 'api'\npath = ['user']\nburst = 2\n\
             [[overlay]]\ndomain = 'other'\npath = ['user']\nburst = 2\n",
        );
        let (document, unused) = written(vec![bare.clone()], &overlays);
        assert_eq!(document, written(vec![bare], &Overlays::default()).0);
        assert_eq!(unused.len(), 2, "{unused:?}");
        assert!(unused[0].contains("no such descriptor"), "{unused:?}");
        assert!(unused[1].contains("no rate_limit"), "{unused:?}");
    }
}
