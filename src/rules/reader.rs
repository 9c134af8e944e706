//! Typed reads from a marked YAML tree. Every problem becomes a [`LoadError`] naming the file,
//! the line of the offending node and the rule path, and reading goes on, so one load reports
//! everything that is wrong at once.

use saphyr::{MarkedYaml, Scalar};

use super::LoadError;
use super::yaml::{self, Document};

/// Reads one file's tree and collects its errors.
pub(super) struct Reader<'d, 'input> {
    file: &'d str,
    document: &'d Document<'input>,
    pub errors: Vec<LoadError>,
}

/// The entries of one YAML map whose keys were all checked against the keys it may hold.
pub(super) struct Fields<'a, 'i> {
    /// Where the map starts, for "missing …" errors.
    pub line: usize,
    entries: Vec<(&'a str, usize, &'a MarkedYaml<'i>)>,
}

impl<'a, 'i> Fields<'a, 'i> {
    /// The value of `key`, if written.
    pub fn get(&self, key: &str) -> Option<&'a MarkedYaml<'i>> {
        self.entry(key).map(|(_, value)| value)
    }

    /// The line of `key` and its value, if written.
    pub fn entry(&self, key: &str) -> Option<(usize, &'a MarkedYaml<'i>)> {
        self.entries
            .iter()
            .find(|(name, ..)| *name == key)
            .map(|&(_, line, value)| (line, value))
    }
}

impl<'d, 'input> Reader<'d, 'input> {
    pub fn new(file: &'d str, document: &'d Document<'input>) -> Self {
        Reader {
            file,
            document,
            errors: Vec::new(),
        }
    }

    /// The file being read, as named in errors.
    pub fn file(&self) -> &str {
        self.file
    }

    pub fn error(&mut self, line: usize, rule: &str, message: impl Into<String>) {
        self.errors.push(LoadError {
            file: self.file.to_owned(),
            line,
            rule: rule.to_owned(),
            message: message.into(),
        });
    }

    /// The entries of the map `node` (a `what`), reporting a node that is not a map, keys
    /// written twice, keys that are not strings and keys not in `valid`.
    pub fn fields<'a, 'i>(
        &mut self,
        node: &'a MarkedYaml<'i>,
        what: &str,
        valid: &[&str],
        rule: &str,
    ) -> Option<Fields<'a, 'i>> {
        let Some(map) = yaml::mapping(node) else {
            let message = format!("{what} must be a map, got {}", yaml::describe(node));
            self.error(yaml::line(node), rule, message);
            return None;
        };
        self.report_duplicates(node, what, rule);
        let mut entries = Vec::with_capacity(map.len());
        for (key, value) in map {
            let name = match yaml::scalar(key) {
                Some(Scalar::String(_)) => yaml::text(key).unwrap_or_default(),
                _ => {
                    let message =
                        format!("{what}: keys must be strings, got {}", yaml::describe(key));
                    self.error(yaml::line(key), rule, message);
                    continue;
                }
            };
            if !valid.contains(&name) {
                let message = format!(
                    "unknown key `{name}` in {what}; valid keys: {}",
                    valid.join(", ")
                );
                self.error(yaml::line(key), rule, message);
                continue;
            }
            entries.push((name, yaml::line(key), value));
        }
        Some(Fields {
            line: yaml::line(node),
            entries,
        })
    }

    /// Reports the keys written twice in the map `node`.
    pub fn report_duplicates<'i>(&mut self, node: &MarkedYaml<'i>, what: &str, rule: &str) {
        let document = self.document;
        for duplicate in document.duplicates_in(yaml::untagged(node)) {
            let message = format!("duplicate key `{}` in {what}", duplicate.key);
            self.error(duplicate.line, rule, message);
        }
    }

    /// A string field. Any scalar counts, as written (`value: 200` is the string `200`); null
    /// (`value:` with nothing after it) is the empty string, as in envoyproxy/ratelimit.
    pub fn string<'i>(&mut self, node: &MarkedYaml<'i>, field: &str, rule: &str) -> Option<String> {
        if yaml::is_null(node) {
            return Some(String::new());
        }
        match yaml::text(node) {
            Some(text) => Some(text.to_owned()),
            None => {
                let message = format!("{field}: expected a string, got {}", yaml::describe(node));
                self.error(yaml::line(node), rule, message);
                None
            }
        }
    }

    pub fn boolean<'i>(&mut self, node: &MarkedYaml<'i>, field: &str, rule: &str) -> Option<bool> {
        if let Some(Scalar::Boolean(value)) = yaml::scalar(node) {
            return Some(value);
        }
        if let Some(value) = yaml::yaml11_boolean(node) {
            return Some(value);
        }
        let message = format!(
            "{field}: expected true or false, got {}",
            yaml::describe(node)
        );
        self.error(yaml::line(node), rule, message);
        None
    }

    /// An integer field from `min` to `u32::MAX`.
    pub fn integer<'i>(
        &mut self,
        node: &MarkedYaml<'i>,
        field: &str,
        min: u32,
        rule: &str,
    ) -> Option<u32> {
        if let Some(Scalar::Integer(value)) = yaml::scalar(node)
            && let Ok(value) = u32::try_from(value)
            && value >= min
        {
            return Some(value);
        }
        let message = format!(
            "{field}: expected an integer from {min} to {}, got {}",
            u32::MAX,
            yaml::describe(node)
        );
        self.error(yaml::line(node), rule, message);
        None
    }

    /// A list field; null is the empty list.
    pub fn list<'a, 'i>(
        &mut self,
        node: &'a MarkedYaml<'i>,
        field: &str,
        rule: &str,
    ) -> Option<&'a [MarkedYaml<'i>]> {
        if yaml::is_null(node) {
            return Some(&[]);
        }
        let list = yaml::sequence(node);
        if list.is_none() {
            let message = format!("{field}: expected a list, got {}", yaml::describe(node));
            self.error(yaml::line(node), rule, message);
        }
        list
    }

    /// Any YAML value as JSON, scalars keeping their YAML type (`1` a number, `"1"` a string).
    pub fn json<'i>(
        &mut self,
        node: &MarkedYaml<'i>,
        field: &str,
        rule: &str,
    ) -> Option<serde_json::Value> {
        use serde_json::Value;
        if let Some(map) = yaml::mapping(node) {
            self.report_duplicates(node, field, rule);
            let mut object = serde_json::Map::with_capacity(map.len());
            let mut complete = true;
            for (key, value) in map {
                let Some(name) = yaml::text(key) else {
                    let message =
                        format!("{field}: keys must be strings, got {}", yaml::describe(key));
                    self.error(yaml::line(key), rule, message);
                    complete = false;
                    continue;
                };
                match self.json(value, &format!("{field}.{name}"), rule) {
                    Some(value) => {
                        object.insert(name.to_owned(), value);
                    }
                    None => complete = false,
                }
            }
            return complete.then_some(Value::Object(object));
        }
        if let Some(items) = yaml::sequence(node) {
            let values: Vec<_> = items
                .iter()
                .enumerate()
                .map(|(i, item)| self.json(item, &format!("{field}[{i}]"), rule))
                .collect();
            return values
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .map(Value::Array);
        }
        let value = match yaml::scalar(node) {
            Some(Scalar::Null) => Some(Value::Null),
            Some(Scalar::Boolean(b)) => Some(Value::Bool(b)),
            Some(Scalar::Integer(i)) => Some(Value::from(i)),
            Some(Scalar::FloatingPoint(f)) => {
                serde_json::Number::from_f64(f.into_inner()).map(Value::Number)
            }
            Some(Scalar::String(s)) => Some(Value::String(s.into_owned())),
            None if yaml::is_null(node) => Some(Value::Null),
            None => None,
        };
        if value.is_none() {
            let message = format!("{field}: {} has no JSON equivalent", yaml::describe(node));
            self.error(yaml::line(node), rule, message);
        }
        value
    }
}
