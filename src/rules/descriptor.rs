//! One domain's `descriptors:` tree, read level by level into [`Descriptors`] indexed for
//! lookup, with each descriptor's rule and options.

use std::collections::HashMap;
use std::sync::Arc;

use saphyr::MarkedYaml;

use super::limits::{self, Configured};
use super::reader::{Fields, Reader};
use super::yaml;
use super::{
    DescriptorNode, Descriptors, MetricLevel, OnBackendError, Policy, Rule, Source, StatsSlot,
    Wildcard,
};

const DESCRIPTOR_KEYS: [&str; 12] = [
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "on_backend_error",
];

/// One level of descriptors. `parent_path` is the rule path so far (`domain api > user_id`),
/// `parent_id` the rule id so far (the domain at the top).
pub(super) fn read_descriptors(
    reader: &mut Reader<'_, '_>,
    items: &[MarkedYaml<'_>],
    parent_path: &str,
    parent_id: &str,
) -> Descriptors {
    read_level(reader, items, parent_path, parent_id, &[])
}

/// [`read_descriptors`] below `parent_levels`, the metric levels of the descriptors above.
fn read_level(
    reader: &mut Reader<'_, '_>,
    items: &[MarkedYaml<'_>],
    parent_path: &str,
    parent_id: &str,
    parent_levels: &[MetricLevel],
) -> Descriptors {
    let mut level = Descriptors::default();
    // Each node's id segment (`key` or `key_value`) → its index. envoyproxy/ratelimit keys its
    // tree by this segment, so two descriptors with one segment would share a rule id.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for item in items {
        let Some((node, line)) =
            read_descriptor(reader, item, parent_path, parent_id, parent_levels)
        else {
            continue;
        };
        let segment = id_segment(&node.key, node.value.as_deref());
        if let Some(&first) = seen.get(&segment) {
            let path = format!(
                "{parent_path} > {}",
                path_segment(&node.key, node.value.as_deref())
            );
            let message = duplicate_message(
                &level.nodes[first],
                &node,
                &format!("{parent_id}.{segment}"),
            );
            reader.error(line, &path, message);
            continue;
        }
        seen.insert(segment, level.nodes.len());
        level.push(node);
    }
    level
}

fn duplicate_message(first: &DescriptorNode, second: &DescriptorNode, id: &str) -> String {
    if first.key == second.key && first.value == second.value {
        let what = match &second.value {
            Some(value) => format!("key `{}` with value `{value}`", second.key),
            None => format!("key `{}` without a value", second.key),
        };
        format!("duplicate descriptor: {what} is already defined at this level")
    } else {
        format!(
            "descriptor id `{id}` is also the id of the descriptor with key `{}` at this level; \
             rename one",
            first.key
        )
    }
}

/// One descriptor and the line of its `key`; `None` when anything in it is wrong.
fn read_descriptor(
    reader: &mut Reader<'_, '_>,
    item: &MarkedYaml<'_>,
    parent_path: &str,
    parent_id: &str,
    parent_levels: &[MetricLevel],
) -> Option<(DescriptorNode, usize)> {
    let peeked = path_segment(
        yaml::peek(item, "key")
            .filter(|k| !k.is_empty())
            .unwrap_or("?"),
        yaml::peek(item, "value").filter(|v| !v.is_empty()),
    );
    let path = format!("{parent_path} > {peeked}");
    let fields = reader.fields(item, "descriptor", &DESCRIPTOR_KEYS, &path)?;
    let errors_before = reader.errors.len();

    let (key_line, key) = read_key(reader, &fields, &path);
    let value = fields
        .get("value")
        .and_then(|node| reader.string(node, "value", &path))
        .filter(|value| !value.is_empty());
    let segment = id_segment(&key, value.as_deref());
    let id = format!("{parent_id}.{segment}");
    let options = read_options(reader, &fields, value.as_deref(), &path);
    let mut metric_levels = parent_levels.to_vec();
    metric_levels.push(MetricLevel {
        segment,
        value_to_metric: options.value_to_metric,
        shared: options.share_threshold,
    });
    let configured = limits::read(
        reader,
        fields.entry("rate_limit"),
        fields.entry("rate_limits"),
        &path,
    );
    let children = match fields.get("descriptors") {
        None => Descriptors::default(),
        Some(node) => {
            let items = reader.list(node, "descriptors", &path).unwrap_or_default();
            read_level(reader, items, &path, &id, &metric_levels)
        }
    };
    let share_threshold = options.share_threshold;
    let source = Source {
        file: reader.file().to_owned(),
        line: key_line,
    };
    let rule = match configured {
        Configured::Present { policy, replaces } => {
            let rule = options.into_rule(id, metric_levels, policy, replaces, source);
            Some(Arc::new(rule))
        }
        Configured::Absent => {
            if let Some((line, _)) = options.on_backend_error {
                let message =
                    "on_backend_error applies to a descriptor with rate_limit or rate_limits";
                reader.error(line, &path, message);
            }
            None
        }
        Configured::Invalid => None,
    };
    if reader.errors.len() > errors_before {
        return None;
    }
    let node = DescriptorNode {
        key,
        value,
        rule,
        children,
        share_threshold,
    };
    Some((node, key_line))
}

/// The descriptor's `key` and its line (the map's line when missing).
fn read_key(reader: &mut Reader<'_, '_>, fields: &Fields<'_, '_>, path: &str) -> (usize, String) {
    const NEEDED: &str = "every descriptor needs `key: <name>`";
    let Some((line, node)) = fields.entry("key") else {
        reader.error(fields.line, path, format!("missing key: {NEEDED}"));
        return (fields.line, String::new());
    };
    let key = reader.string(node, "key", path);
    if key.as_deref() == Some("") {
        reader.error(line, path, format!("empty key: {NEEDED}"));
    }
    (line, key.unwrap_or_default())
}

/// What a descriptor sets besides its key, value, limits and children.
struct Options {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// With the line it was written on.
    on_backend_error: Option<(usize, OnBackendError)>,
}

impl Options {
    fn into_rule(
        self,
        id: String,
        metric_levels: Vec<MetricLevel>,
        policy: Policy,
        replaces: Vec<String>,
        source: Source,
    ) -> Rule {
        Rule {
            id,
            policy,
            replaces,
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            share_threshold: self.share_threshold,
            detailed_metric: self.detailed_metric,
            value_to_metric: self.value_to_metric,
            metadata: self.metadata,
            on_backend_error: self.on_backend_error.map(|(_, policy)| policy),
            source,
            metric_levels,
            stats: StatsSlot::default(),
        }
    }
}

fn read_options(
    reader: &mut Reader<'_, '_>,
    fields: &Fields<'_, '_>,
    value: Option<&str>,
    path: &str,
) -> Options {
    let mut flag = |name: &str| {
        fields
            .get(name)
            .and_then(|node| reader.boolean(node, name, path))
            .unwrap_or(false)
    };
    let shadow_mode = flag("shadow_mode");
    let quota_mode = flag("quota_mode");
    let detailed_metric = flag("detailed_metric");
    let value_to_metric = flag("value_to_metric");
    let share_threshold = flag("share_threshold");
    if share_threshold && !value.is_some_and(|v| v.contains('*')) {
        let line = fields
            .entry("share_threshold")
            .map_or(fields.line, |(line, _)| line);
        let message = "share_threshold applies only to a wildcard value (one with `*`): it makes \
                       every value the wildcard matches share one counter";
        reader.error(line, path, message);
    }
    let metadata = fields
        .get("metadata")
        .and_then(|node| read_metadata(reader, node, path));
    let on_backend_error = fields
        .entry("on_backend_error")
        .and_then(|(line, node)| Some((line, read_on_backend_error(reader, node, path)?)));
    Options {
        shadow_mode,
        quota_mode,
        detailed_metric,
        value_to_metric,
        share_threshold,
        metadata,
        on_backend_error,
    }
}

fn read_metadata(
    reader: &mut Reader<'_, '_>,
    node: &MarkedYaml<'_>,
    path: &str,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    if yaml::mapping(node).is_none() {
        let message = format!("metadata: expected a map, got {}", yaml::describe(node));
        reader.error(yaml::line(node), path, message);
        return None;
    }
    match reader.json(node, "metadata", path)? {
        serde_json::Value::Object(map) => Some(map),
        _ => None,
    }
}

fn read_on_backend_error(
    reader: &mut Reader<'_, '_>,
    node: &MarkedYaml<'_>,
    path: &str,
) -> Option<OnBackendError> {
    let name = reader.string(node, "on_backend_error", path)?;
    let policy = OnBackendError::parse(&name);
    if policy.is_none() {
        let message = format!(
            "on_backend_error: unknown policy `{name}`; valid policies: error, fail_open, \
             fail_closed, local"
        );
        reader.error(yaml::line(node), path, message);
    }
    policy
}

/// A descriptor as it appears in rule paths: `key` or `key=value`.
fn path_segment(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{key}={value}"),
        None => key.to_owned(),
    }
}

/// A descriptor as it appears in rule ids (envoyproxy/ratelimit's stats keys): `key` or
/// `key_value`.
fn id_segment(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{key}_{value}"),
        None => key.to_owned(),
    }
}

impl Descriptors {
    /// Adds `more`'s nodes, the top level of the same domain from a later file
    /// (`merge_domain_config`); a node whose id this level already has is handed back
    /// instead, with the first one's, for the caller's error.
    pub(super) fn merge(&mut self, more: Descriptors) -> Vec<(DescriptorNode, &DescriptorNode)> {
        let mut clashes = Vec::new();
        for node in more.nodes {
            let segment = id_segment(&node.key, node.value.as_deref());
            let first =
                (self.nodes.iter()).position(|n| id_segment(&n.key, n.value.as_deref()) == segment);
            match first {
                Some(first) => clashes.push((node, first)),
                None => self.push(node),
            }
        }
        (clashes.into_iter())
            .map(|(node, first)| (node, &self.nodes[first]))
            .collect()
    }

    /// Adds a node and indexes it for lookup: exact value, wildcard, or key-only default.
    fn push(&mut self, node: DescriptorNode) {
        let index = self.nodes.len();
        match &node.value {
            None => {
                self.defaults.insert(node.key.clone(), index);
            }
            Some(value) if value.contains('*') => {
                self.wildcards
                    .push((node.key.clone(), Wildcard::new(value), index));
            }
            Some(value) => {
                self.exact.insert((node.key.clone(), value.clone()), index);
            }
        }
        self.nodes.push(node);
    }
}
