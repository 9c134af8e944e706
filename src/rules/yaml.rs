//! A rule file as a marked YAML tree: every node keeps the line it was written on, and
//! duplicate map keys are recorded per map instead of stopping the parse at the first one.
//!
//! saphyr's loader can either reject a duplicate key (one error, no tree) or keep the last
//! value silently. Neither lets us report every duplicate with its rule path, so the parser's
//! events pass through a small tracker that notes each duplicate key under the start of the
//! map holding it, on their way to saphyr's own loader. Scalars stay unresolved
//! (representations), so a string field keeps the text exactly as written (`value: 010`
//! stays `010`) and typed fields resolve with the YAML 1.2 core schema when read.
//!
//! The tracker also bounds nesting ([`MAX_NESTING`]): the parser's own loading loop, the
//! tree's drop and the rule readers all recurse once per level, so a few kilobytes of `[[[[`
//! would otherwise overflow a thread's stack and abort the process. Events are pulled one at
//! a time, without that loop, and the parse stops at the first node nested too deep, counting
//! what an alias expands to.

use std::borrow::Cow;
use std::collections::HashMap;

use saphyr::{AnnotatedMapping, MarkedYaml, Scalar, ScalarOwned, YamlData, YamlLoader};
use saphyr_parser::{Event, Parser, ScalarStyle, Span, SpannedEventReceiver};

/// One parsed rule file.
pub(super) struct Document<'input> {
    /// `None`: the file holds no YAML document at all (empty, or only comments).
    pub root: Option<MarkedYaml<'input>>,
    /// Repeated keys, by the source index of the map that holds them.
    duplicates: HashMap<usize, Vec<DuplicateKey>>,
}

/// A key written a second time in one map.
pub(super) struct DuplicateKey {
    pub key: String,
    pub line: usize,
}

/// Why a file is not YAML we can read: the line and the parser's message.
pub(super) struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl<'input> Document<'input> {
    pub fn parse(source: &'input str) -> Result<Self, SyntaxError> {
        let mut loader = YamlLoader::<MarkedYaml<'input>>::default();
        loader.early_parse(false);
        loader.allow_duplicate_keys(true);
        let mut tracker = Tracker {
            loader,
            frames: Vec::new(),
            duplicates: HashMap::new(),
            anchor_levels: HashMap::new(),
        };
        let syntax = |error: &saphyr::ScanError| SyntaxError {
            line: error.marker().line(),
            message: error.info().to_owned(),
        };
        let mut parser = Parser::new_from_str(source);
        while let Some(event) = parser.next_event() {
            let (event, span) = event.map_err(|e| syntax(&e))?;
            let line = span.start.line();
            tracker
                .on_event(event, span)
                .map_err(|levels| SyntaxError {
                    line,
                    message: format!(
                        "nested {levels} levels deep (lists and maps inside one another, \
                     aliases expanded); a rule file nests at most {MAX_NESTING}"
                    ),
                })?;
        }
        if let Some(error) = tracker.loader.error() {
            return Err(syntax(error));
        }
        let mut documents = tracker.loader.into_documents().into_iter();
        let root = documents.next();
        // A trailing `---` with nothing after it opens an empty document: harmless.
        if let Some(second) = documents.find(|document| !is_null(document)) {
            return Err(SyntaxError {
                line: second.span.start.line(),
                message: "a rule file holds one YAML document (one domain), and a second one \
                          starts here; put each domain in its own file"
                    .to_owned(),
            });
        }
        Ok(Document {
            root,
            duplicates: tracker.duplicates,
        })
    }

    /// The keys written twice in `map` (a mapping node of this document).
    pub fn duplicates_in(&self, map: &MarkedYaml<'_>) -> &[DuplicateKey] {
        self.duplicates
            .get(&map.span.start.index())
            .map_or(&[], Vec::as_slice)
    }
}

/// The deepest a rule file nests lists and maps inside one another, aliases expanded: 100
/// levels, about 49 levels of descriptors (each is a map inside a `descriptors:` list).
pub const MAX_NESTING: usize = 100;

/// An open list or map in the event stream.
struct Frame {
    kind: FrameKind,
    /// The anchor it defines (0 for none), whose nesting an alias repeats.
    anchor: usize,
    /// The most levels of lists and maps inside it so far.
    below: usize,
}

enum FrameKind {
    Sequence,
    Mapping {
        keys: Vec<ScalarOwned>,
        /// The next complete node is a key (else a value).
        expects_key: bool,
        start: usize,
    },
}

/// Notes duplicate keys and bounds nesting, then hands every event to saphyr's loader
/// unchanged.
struct Tracker<'input> {
    loader: YamlLoader<'input, MarkedYaml<'input>>,
    frames: Vec<Frame>,
    duplicates: HashMap<usize, Vec<DuplicateKey>>,
    /// The levels of lists and maps each anchored collection holds, itself included.
    anchor_levels: HashMap<usize, usize>,
}

impl<'input> Tracker<'input> {
    /// Takes the parser's next event; `Err(levels)` when it would nest the document deeper
    /// than [`MAX_NESTING`].
    fn on_event(&mut self, event: Event<'input>, span: Span) -> Result<(), usize> {
        match &event {
            Event::MappingStart(anchor, _) => self.open(*anchor, || FrameKind::Mapping {
                keys: Vec::new(),
                expects_key: true,
                start: span.start.index(),
            })?,
            Event::SequenceStart(anchor, _) => self.open(*anchor, || FrameKind::Sequence)?,
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some(frame) = self.frames.pop() {
                    let levels = frame.below + 1;
                    if frame.anchor != 0 {
                        self.anchor_levels.insert(frame.anchor, levels);
                    }
                    self.nested(levels);
                }
                self.node_done();
            }
            Event::Scalar(text, style, _, tag) => {
                let value = Scalar::parse_from_cow_and_metadata(text.clone(), *style, tag.as_ref())
                    .unwrap_or_else(|| Scalar::String(text.clone()));
                self.scalar(value, text, span);
            }
            Event::Alias(anchor) => {
                let levels = self.anchor_levels.get(anchor).copied().unwrap_or(0);
                let depth = self.frames.len() + levels;
                if depth > MAX_NESTING {
                    return Err(depth);
                }
                self.nested(levels);
                self.node_done();
            }
            _ => {}
        }
        self.loader.on_event(event, span);
        Ok(())
    }

    fn open(&mut self, anchor: usize, kind: impl FnOnce() -> FrameKind) -> Result<(), usize> {
        let depth = self.frames.len() + 1;
        if depth > MAX_NESTING {
            return Err(depth);
        }
        self.frames.push(Frame {
            kind: kind(),
            anchor,
            below: 0,
        });
        Ok(())
    }

    /// A node holding `levels` of lists and maps has been completed in the open frame.
    fn nested(&mut self, levels: usize) {
        if let Some(parent) = self.frames.last_mut() {
            parent.below = parent.below.max(levels);
        }
    }

    /// A node has been completed: in a map, keys and values alternate.
    fn node_done(&mut self) {
        if let Some(Frame {
            kind: FrameKind::Mapping { expects_key, .. },
            ..
        }) = self.frames.last_mut()
        {
            *expects_key = !*expects_key;
        }
    }

    fn scalar(&mut self, value: Scalar<'_>, text: &str, span: Span) {
        if let Some(Frame {
            kind:
                FrameKind::Mapping {
                    keys,
                    expects_key: true,
                    start,
                },
            ..
        }) = self.frames.last_mut()
        {
            let key = value.into_owned();
            if keys.contains(&key) {
                self.duplicates
                    .entry(*start)
                    .or_default()
                    .push(DuplicateKey {
                        key: text.to_owned(),
                        line: span.start.line(),
                    });
            } else {
                keys.push(key);
            }
        }
        self.node_done();
    }
}

/// The node under any non-core tag (`!custom {a: 1}` reads as `{a: 1}`).
pub(super) fn untagged<'a, 'input>(node: &'a MarkedYaml<'input>) -> &'a MarkedYaml<'input> {
    match &node.data {
        YamlData::Tagged(_, inner) => untagged(inner),
        _ => node,
    }
}

/// The 1-based line a node starts on.
pub(super) fn line(node: &MarkedYaml<'_>) -> usize {
    node.span.start.line()
}

pub(super) fn mapping<'a, 'input>(
    node: &'a MarkedYaml<'input>,
) -> Option<&'a AnnotatedMapping<'input, MarkedYaml<'input>>> {
    match &untagged(node).data {
        YamlData::Mapping(map) => Some(map),
        _ => None,
    }
}

pub(super) fn sequence<'a, 'input>(
    node: &'a MarkedYaml<'input>,
) -> Option<&'a [MarkedYaml<'input>]> {
    match &untagged(node).data {
        YamlData::Sequence(items) => Some(items),
        _ => None,
    }
}

/// The text of `key` in `node` when it is a map, before the map is checked: rule paths need
/// a descriptor's key and value before its other fields are read.
pub(super) fn peek<'a>(node: &'a MarkedYaml<'_>, key: &str) -> Option<&'a str> {
    mapping(node)?
        .iter()
        .find(|(k, _)| text(k) == Some(key))
        .and_then(|(_, value)| text(value))
}

/// A scalar's text exactly as written (without quotes).
pub(super) fn text<'a>(node: &'a MarkedYaml<'_>) -> Option<&'a str> {
    match &untagged(node).data {
        YamlData::Representation(text, ..) => Some(text),
        _ => None,
    }
}

/// A scalar resolved with the YAML 1.2 core schema (`10` an integer, `"10"` a string, `~` null).
/// `None` for collections, and for a scalar whose explicit tag does not fit (`!!int ten`).
pub(super) fn scalar<'a>(node: &'a MarkedYaml<'_>) -> Option<Scalar<'a>> {
    match &untagged(node).data {
        YamlData::Representation(text, style, tag) => {
            let tag = tag.as_ref().map(|t| Cow::Borrowed(t.as_ref()));
            Scalar::parse_from_cow_and_metadata(Cow::Borrowed(text), *style, tag.as_ref())
        }
        _ => None,
    }
}

/// A plain scalar spelled as a YAML 1.1 boolean (`yes`, `On`, `n`, …). envoyproxy/ratelimit
/// reads rule files with a YAML 1.1 parser that takes these as booleans, so they are accepted
/// where a boolean is expected and its files load unchanged. Quoted, they stay strings.
pub(super) fn yaml11_boolean(node: &MarkedYaml<'_>) -> Option<bool> {
    match &untagged(node).data {
        YamlData::Representation(text, ScalarStyle::Plain, None) => match text.as_ref() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the node is absent in YAML's sense: `~`, `null`, or nothing after the colon.
pub(super) fn is_null(node: &MarkedYaml<'_>) -> bool {
    matches!(scalar(node), Some(Scalar::Null)) || matches!(untagged(node).data, YamlData::BadValue)
}

/// What a node is, for "expected …, got …" messages.
pub(super) fn describe(node: &MarkedYaml<'_>) -> String {
    match &untagged(node).data {
        YamlData::Mapping(_) => "a map".to_owned(),
        YamlData::Sequence(_) => "a list".to_owned(),
        YamlData::Representation(text, ..) => match scalar(node) {
            Some(Scalar::Null) => "nothing (null)".to_owned(),
            Some(Scalar::String(_)) => format!("the string `{text}`"),
            _ => format!("`{text}`"),
        },
        _ => "nothing".to_owned(),
    }
}

/// Builds nodes in tests: parse a document and return its root.
#[cfg(test)]
pub(super) fn parse_root(source: &str) -> MarkedYaml<'_> {
    match Document::parse(source) {
        Ok(Document {
            root: Some(root), ..
        }) => root,
        _ => <MarkedYaml<'_> as saphyr::LoadableYamlNode>::from_bare_yaml(saphyr::Yaml::BadValue),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a, 'input>(map: &'a MarkedYaml<'input>, key: &str) -> &'a MarkedYaml<'input> {
        mapping(map)
            .and_then(|m| m.iter().find(|(k, _)| text(k) == Some(key)))
            .map(|(_, v)| v)
            .expect("key present")
    }

    #[test]
    fn every_duplicate_key_is_recorded_under_its_map() {
        let source = "a: 1\nb:\n  x: 1\n  x: 2\n  'x': 3\na: 4\n";
        let document = Document::parse(source).ok().expect("parses");
        let root = document.root.as_ref().expect("a root");
        let top: Vec<_> = document
            .duplicates_in(root)
            .iter()
            .map(|d| (d.key.as_str(), d.line))
            .collect();
        assert_eq!(top, [("a", 6)]);
        let inner = get(root, "b");
        let nested: Vec<_> = document
            .duplicates_in(inner)
            .iter()
            .map(|d| (d.key.as_str(), d.line))
            .collect();
        assert_eq!(nested, [("x", 4), ("x", 5)]);
    }

    #[test]
    fn keys_differing_in_yaml_type_are_not_duplicates() {
        let document = Document::parse("1: a\n'1': b\n").ok().expect("parses");
        let root = document.root.as_ref().expect("a root");
        assert!(document.duplicates_in(root).is_empty());
    }

    #[test]
    fn scalar_text_is_kept_as_written() {
        let root = parse_root("value: 010\n");
        let value = get(&root, "value");
        assert_eq!(text(value), Some("010"));
        assert_eq!(line(value), 1);
    }

    #[test]
    fn syntax_error_carries_the_parser_line() {
        let error = Document::parse("a: 1\nb: [1, 2\nc: 3\n")
            .err()
            .expect("fails");
        assert!(error.line >= 2, "line {}", error.line);
    }

    #[test]
    fn a_trailing_empty_document_is_ignored() {
        let document = Document::parse("---\na: 1\n---\n").ok().expect("parses");
        assert!(document.root.is_some());
    }

    #[test]
    fn a_second_document_is_an_error() {
        let error = Document::parse("a: 1\n---\nb: 2\n").err().expect("fails");
        assert_eq!(error.line, 3);
    }

    #[test]
    fn nesting_is_bounded_where_it_goes_too_deep() {
        let fits = format!("{}x{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert!(Document::parse(&fits).is_ok());
        let deeper = MAX_NESTING + 1;
        let error = Document::parse(&format!("a: 1\nb: {}", "[".repeat(deeper)))
            .err()
            .expect("too deep");
        assert_eq!(error.line, 2);
        assert!(error.message.contains("at most 100"), "{}", error.message);
        // Far deeper input stops at the bound instead of recursing once per level.
        let error = Document::parse(&format!("a:\n{}x\n", "- ".repeat(100_000)))
            .err()
            .expect("too deep");
        assert_eq!(error.line, 2);
    }

    #[test]
    fn an_alias_counts_the_levels_it_expands_to() {
        // `b` repeats `a`'s 60 levels inside 60 of its own, inside the top map: 121 levels.
        let open = "[".repeat(59);
        let close = "]".repeat(59);
        let source = format!("a: &a {open}[1]{close}\nb: &b {open}[*a]{close}\n");
        let error = Document::parse(&source).err().expect("too deep");
        assert_eq!(error.line, 2);
        assert!(
            error.message.contains("nested 121 levels"),
            "{}",
            error.message
        );
        let shallow = format!("a: &a {open}[1]{close}\nb: [*a, *a]\n");
        assert!(Document::parse(&shallow).is_ok());
    }
}
