//! The `statsd` settings: upstream's stats to a statsd (or DogStatsD) server, and the
//! mogrifiers that rename them.

use serde::Deserialize;

/// envoyproxy/ratelimit's stats sent to a statsd server, beside `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsdSettings {
    /// `host:port` of the statsd server; none: nothing is sent.
    pub addr: Option<String>,
    pub protocol: StatsdProtocol,
    /// How often the changes since the last flush are sent.
    pub flush_interval_ms: u64,
    /// Tags added to every stat, `key:value,key:value` (upstream's `EXTRA_TAGS`), written
    /// as upstream's client writes them: a `.__key=value` suffix each (`|#key:value` as
    /// DogStatsD).
    pub extra_tags: String,
    /// Plain statsd, or DogStatsD: tags after the value (`|#key:value`), names rewritten by
    /// `mogrifiers` (upstream's `USE_DOG_STATSD`).
    pub format: StatsdFormat,
    /// DogStatsD only: the first whose `pattern` matches a stat's name renames it and adds
    /// its tags (upstream's `USE_DOG_STATSD_MOGRIFIERS`). In TOML an array of tables; as an
    /// environment variable, the same array in JSON.
    #[serde(deserialize_with = "mogrifiers")]
    pub mogrifiers: Vec<Mogrifier>,
}

/// How stats are written to the statsd server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsdFormat {
    /// `name.__tag=value:1|c`, as upstream's statsd client.
    #[default]
    Statsd,
    /// `name:1|c|#tag:value`, as upstream's DogStatsD client.
    Dogstatsd,
}

/// A DogStatsD rename (upstream's mogrifier): a stat whose name `pattern` (a regular
/// expression) matches is sent as `name` with `tags` (`key:value,key:value`); `$N` in
/// either stands for the match's Nth group (`$0` the whole match).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mogrifier {
    pub pattern: String,
    pub name: String,
    #[serde(default)]
    pub tags: String,
}

/// `statsd.mogrifiers`: an array of tables (TOML), or that array as a JSON string (an
/// environment variable has no arrays).
fn mogrifiers<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Mogrifier>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Tables(Vec<Mogrifier>),
        Json(String),
    }
    match Given::deserialize(deserializer)? {
        Given::Tables(tables) => Ok(tables),
        Given::Json(text) if text.trim().is_empty() => Ok(Vec::new()),
        Given::Json(text) => serde_json::from_str(&text)
            .map_err(|error| serde::de::Error::custom(format!("statsd.mogrifiers: {error}"))),
    }
}

/// Why `mogrifier` cannot rename anything: a pattern that does not compile, an empty name,
/// a tag without key or value (upstream refuses the same at start), or a `$N` past the
/// pattern's groups.
pub(super) fn check_mogrifier(mogrifier: &Mogrifier) -> Result<(), String> {
    let pattern = regex::Regex::new(&mogrifier.pattern).map_err(|error| error.to_string())?;
    if mogrifier.name.is_empty() {
        return Err("no name".into());
    }
    let mut templates = vec![mogrifier.name.as_str()];
    for tag in mogrifier
        .tags
        .split(',')
        .filter(|tag| !tag.trim().is_empty())
    {
        match tag.split_once(':') {
            Some((key, value)) if !key.trim().is_empty() && !value.trim().is_empty() => {
                templates.push(value);
            }
            _ => return Err(format!("tag {tag:?} is not key:value")),
        }
    }
    for template in templates {
        let groups = template.split('$').skip(1).filter_map(|after| {
            let digits = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            after[..digits].parse::<usize>().ok()
        });
        if let Some(group) = groups.max().filter(|&g| g >= pattern.captures_len()) {
            return Err(format!(
                "{template:?} names group {group}, which the pattern lacks"
            ));
        }
    }
    Ok(())
}

impl Default for StatsdSettings {
    fn default() -> Self {
        StatsdSettings {
            addr: None,
            protocol: StatsdProtocol::Tcp,
            flush_interval_ms: 10_000,
            extra_tags: String::new(),
            format: StatsdFormat::Statsd,
            mogrifiers: Vec::new(),
        }
    }
}

/// How stats reach the statsd server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsdProtocol {
    /// One connection, opened again after a failure (upstream's default).
    #[default]
    Tcp,
    Udp,
}
