//! Properties of counter keys, for descriptors carrying any text a request can: separators,
//! braces, percent signs, control characters, non-ASCII.
//!
//! - Two different identities (domain, rule, limit index, algorithm, window, time zone,
//!   entries) never share a `CounterKey`; one identity always yields one key, whatever the
//!   rate, the burst or the spelling of its window.
//! - Every Redis key of one counter (the key behind any prefix without braces, and its
//!   `log_keys`) has `CounterKey::hash_tag` as its Redis Cluster hash tag, so one slot.
//! - Different counters spread over the 16,384 slots like a uniform hash would.
//!
//! The slot is the cluster backend's own (`backend::redis::slots`, by which it groups hits per
//! primary), checked against a real `redis-server --cluster-enabled yes` (`CLUSTER KEYSLOT`).
//!
//! Each run draws a fresh seed; a failure prints it, and `KEYS_PROPERTY_SEED=<seed>` replays it.

mod redis_harness;

use std::collections::HashMap;

use deadpool_redis::redis;
use floodgate::backend::redis::script::log_keys;
use floodgate::backend::redis::slots::{SLOTS, hash_tag, slot};
use floodgate::limiter::{Algorithm, CounterKey, Limit, Timezone, Unit};
use redis_harness::RedisServer;

/// Random identities per property.
const CASES: usize = 20_000;
/// Redis Cluster's slots.
/// Counters in the spread test.
const COUNTERS: usize = 10_000;

/// Pieces the random text is made of: every separator the key uses, the escapes of those
/// separators (so an escaped and a raw form meet), braces in every order, the algorithm
/// names and window digits the key appends, control bytes and multi-byte characters. A small
/// alphabet makes different identities look alike and lets equal ones recur.
const PIECES: &[&str] = &[
    "a",
    "b",
    "0",
    "_",
    ":",
    ";",
    "=",
    "%",
    "{",
    "}",
    " ",
    "%3A",
    "%3B",
    "%3D",
    "%7B",
    "%7D",
    "%25",
    "%20",
    "%%",
    "{}",
    "}{",
    ":0:",
    "=;",
    "}:gcra:1",
    "fixed_window",
    "é",
    "日本",
    "🦀",
    "\0",
    "\t",
    "\n",
    "\u{7f}",
    "\u{80}",
    "\u{ff}",
    "\u{feff}",
];

const ZONES: [&str; 3] = ["Europe/Paris", "America/New_York", "Asia/Kolkata"];

/// Everything that makes a counter distinct, and nothing else (not the rate, not the burst,
/// not whether the window is written as 60 seconds or 1 minute).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Identity {
    domain: String,
    rule: String,
    limit_index: usize,
    algorithm: Algorithm,
    window_micros: u64,
    timezone: Option<&'static str>,
    entries: Vec<(String, String)>,
}

impl Identity {
    /// The part inside the hash tag: the descriptor, without algorithm and window.
    fn descriptor(&self) -> (&str, &str, usize, &[(String, String)]) {
        (&self.domain, &self.rule, self.limit_index, &self.entries)
    }

    fn key(&self, limit: &Limit) -> CounterKey {
        assert_eq!(limit.window_micros(), self.window_micros);
        assert_eq!(limit.algorithm, self.algorithm);
        CounterKey::new(
            &self.domain,
            &self.rule,
            self.limit_index,
            limit,
            self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }
}

fn seed() -> u64 {
    match std::env::var("KEYS_PROPERTY_SEED") {
        Ok(text) => text.parse().expect("KEYS_PROPERTY_SEED is a u64"),
        Err(_) => fastrand::u64(..),
    }
}

/// How a failure names its seed.
fn replay(seed: u64) -> String {
    format!("seed {seed} (replay with KEYS_PROPERTY_SEED={seed})")
}

fn text(rng: &mut fastrand::Rng) -> String {
    let mut text = String::new();
    for _ in 0..rng.usize(0..=3) {
        if rng.u8(..) < 40 {
            text.push(rng.char(..));
        } else {
            text.push_str(PIECES[rng.usize(..PIECES.len())]);
        }
    }
    text
}

/// A random identity and a limit that has it.
fn random_case(rng: &mut fastrand::Rng) -> (Identity, Limit) {
    let algorithm = Algorithm::ALL[rng.usize(..Algorithm::ALL.len())];
    let units = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Month,
    ];
    let unit = units[rng.usize(..units.len())];
    // 60 and 24 make windows that other units also spell (60 s = 1 min, 24 h = 1 day).
    let unit_multiplier = [1, 1, 2, 3, 24, 60][rng.usize(..6)];
    let calendar = matches!(unit, Unit::Day | Unit::Month) && unit_multiplier == 1;
    let timezone = (calendar && rng.u8(..4) == 0).then(|| ZONES[rng.usize(..ZONES.len())]);
    let limit = Limit {
        algorithm,
        unit_multiplier,
        burst: rng.bool().then(|| rng.u32(1..100)),
        timezone: timezone.map(|name| Timezone::parse(name).expect("a tz database zone")),
        ..Limit::per(rng.u32(0..1000), unit)
    };
    let limit_index = if rng.u8(..20) == 0 {
        rng.usize(..)
    } else {
        rng.usize(0..3)
    };
    let entries = (0..rng.usize(0..=3))
        .map(|_| (text(rng), text(rng)))
        .collect();
    let identity = Identity {
        domain: text(rng),
        rule: text(rng),
        limit_index,
        algorithm,
        window_micros: limit.window_micros(),
        timezone,
        entries,
    };
    (identity, limit)
}

/// The same identity's limit written differently: another rate and burst, and the window in
/// another unit when it divides evenly (a calendar window keeps its unit).
fn restated(limit: &Limit, rng: &mut fastrand::Rng) -> Limit {
    let mut other = Limit {
        requests_per_unit: rng.u32(..),
        burst: rng.bool().then(|| rng.u32(1..)),
        ..limit.clone()
    };
    if limit.timezone.is_none() {
        let seconds = limit.window_micros() / 1_000_000;
        let spellings: Vec<(Unit, u32)> = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day]
            .into_iter()
            .filter(|unit| seconds.is_multiple_of(unit.seconds()))
            .map(|unit| (unit, (seconds / unit.seconds()) as u32))
            .collect();
        (other.unit, other.unit_multiplier) = spellings[rng.usize(..spellings.len())];
    }
    other
}

/// Identities next to `identity`, each different from it: one character moved across the
/// boundary between two adjacent text components, or two entries merged into one value with
/// a separator between them. These are exactly the pairs a join without escaping confuses.
fn neighbours(identity: &Identity, rng: &mut fastrand::Rng) -> Vec<Identity> {
    let mut texts = vec![identity.domain.clone(), identity.rule.clone()];
    for (name, value) in &identity.entries {
        texts.push(name.clone());
        texts.push(value.clone());
    }
    let rebuild = |texts: &[String]| {
        let mut next = identity.clone();
        next.domain = texts[0].clone();
        next.rule = texts[1].clone();
        next.entries = texts[2..]
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        next
    };
    let mut out = Vec::new();
    for i in 0..texts.len() - 1 {
        let mut moved = texts.clone();
        if let Some(last) = moved[i].pop() {
            moved[i + 1].insert(0, last);
            out.push(rebuild(&moved));
        }
        let mut moved = texts.clone();
        if let Some(first) = moved[i + 1].chars().next() {
            moved[i + 1].remove(0);
            moved[i].push(first);
            out.push(rebuild(&moved));
        }
    }
    if identity.entries.len() >= 2 {
        let separator = [";", "=", ":", "_", "%3B", ";%3D"][rng.usize(..6)];
        let mut merged = identity.clone();
        let (name, value) = merged.entries.remove(1);
        merged.entries[0].1 = format!("{}{separator}{name}={value}", merged.entries[0].1);
        out.push(merged);
    }
    out.retain(|other| other != identity);
    out
}

/// Every key met so far and its identity, both ways.
struct Seen {
    seed: u64,
    owner_of_key: HashMap<CounterKey, Identity>,
    key_of_identity: HashMap<Identity, CounterKey>,
}

impl Seen {
    fn new(seed: u64) -> Self {
        Seen {
            seed,
            owner_of_key: HashMap::new(),
            key_of_identity: HashMap::new(),
        }
    }

    /// Records that `identity` has `key`: no other identity may have had it, and this one
    /// no other key.
    fn record(&mut self, identity: &Identity, key: CounterKey) {
        if let Some(other) = self.owner_of_key.get(&key) {
            assert_eq!(
                other,
                identity,
                "two identities share the key {key}; {}",
                replay(self.seed)
            );
        }
        if let Some(earlier) = self.key_of_identity.get(identity) {
            assert_eq!(
                earlier,
                &key,
                "one identity, two keys: {identity:?}; {}",
                replay(self.seed)
            );
        }
        self.owner_of_key.insert(key.clone(), identity.clone());
        self.key_of_identity.insert(identity.clone(), key);
    }
}

#[test]
fn different_identities_never_share_a_key_and_one_identity_always_has_one() {
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut seen = Seen::new(seed);
    let mut repeats = 0;
    let mut neighbours_checked = 0;
    for _ in 0..CASES {
        let (identity, limit) = random_case(&mut rng);
        let key = identity.key(&limit);
        let restated = restated(&limit, &mut rng);
        assert_eq!(
            identity.key(&restated),
            key,
            "{identity:?}: {limit:?} and {restated:?} differ only in rate, burst or the \
             spelling of the window; {}",
            replay(seed)
        );
        if seen.key_of_identity.contains_key(&identity) {
            repeats += 1;
        }
        seen.record(&identity, key);
        for neighbour in neighbours(&identity, &mut rng) {
            let key = neighbour.key(&limit);
            seen.record(&neighbour, key);
            neighbours_checked += 1;
        }
    }
    // The generator must produce both: the same identity drawn again, and many distinct
    // ones (a generator stuck on a few identities would prove nothing).
    assert!(
        repeats >= 20,
        "only {repeats} repeated identities; {}",
        replay(seed)
    );
    assert!(
        seen.key_of_identity.len() > CASES,
        "only {} distinct identities; {}",
        seen.key_of_identity.len(),
        replay(seed)
    );
    assert!(
        neighbours_checked > CASES,
        "{neighbours_checked} neighbours"
    );
}

#[test]
fn the_hash_tag_names_the_descriptor_and_nothing_else() {
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut descriptor_of_tag: HashMap<String, Identity> = HashMap::new();
    for _ in 0..CASES {
        let (identity, limit) = random_case(&mut rng);
        let key = identity.key(&limit);
        let tag = key.hash_tag().to_owned();
        assert_eq!(
            key.as_str().matches('{').count() + key.as_str().matches('}').count(),
            2,
            "{key}: a value opened or closed a brace; {}",
            replay(seed)
        );
        if let Some(other) = descriptor_of_tag.get(&tag) {
            assert_eq!(
                other.descriptor(),
                identity.descriptor(),
                "two descriptors share the hash tag {tag}; {}",
                replay(seed)
            );
        }
        descriptor_of_tag.insert(tag, identity);
    }
}

#[test]
fn every_key_of_one_counter_has_its_hash_tag_and_one_slot() {
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..CASES {
        let (identity, limit) = random_case(&mut rng);
        let key = identity.key(&limit);
        let tag = key.hash_tag().as_bytes();
        assert!(!tag.is_empty(), "{key}: an empty tag hashes the whole key");
        let prefix = prefix(&mut rng);
        let full = format!("{prefix}{key}");
        let [log, total] = log_keys(&full);
        for redis_key in [key.as_str(), &full, &log, &total] {
            assert_eq!(
                hash_tag(redis_key.as_bytes()),
                tag,
                "Redis hashes {redis_key:?} by another part than {:?}; {}",
                key.hash_tag(),
                replay(seed)
            );
        }
        for state in [&log, &total] {
            assert_eq!(
                slot(full.as_bytes()),
                slot(state.as_bytes()),
                "{full:?} and its sliding log's {state:?}; {}",
                replay(seed)
            );
        }
        // Another algorithm or window of the same descriptor shares the tag too.
        let other = Limit {
            algorithm: Algorithm::ALL[rng.usize(..Algorithm::ALL.len())],
            unit_multiplier: rng.u32(1..100),
            timezone: None,
            ..limit.clone()
        };
        let sibling = CounterKey::new(
            &identity.domain,
            &identity.rule,
            identity.limit_index,
            &other,
            identity
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        assert_eq!(sibling.hash_tag(), key.hash_tag(), "{}", replay(seed));
    }
}

/// A key prefix as an operator may configure one: any text without braces
/// (`RedisBackend::new` refuses braces).
fn prefix(rng: &mut fastrand::Rng) -> String {
    match rng.u8(..4) {
        0 => String::new(),
        1 => "floodgate:".to_owned(),
        _ => text(rng).replace(['{', '}'], ""),
    }
}

#[test]
fn the_backends_slots_match_redis_cluster_keyslot() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let nodes = dir.path().join("nodes.conf");
    let server = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        nodes.to_str().expect("a UTF-8 temporary path"),
    ]);
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut keys: Vec<Vec<u8>> = [
        &b"foo"[..],
        b"",
        b"{user1000}.following",
        b"{user1000}.followers",
        b"foo{}{bar}",
        b"foo{{bar}}zap",
        b"foo{bar}{zap}",
        b"}{a}",
        b"{a",
        b"a}",
        b"{}",
        b"\xff\x00{\x80\xfe}\x01",
    ]
    .iter()
    .map(|key| key.to_vec())
    .collect();
    while keys.len() < 3_000 {
        let (identity, limit) = random_case(&mut rng);
        let full = format!("{}{}", prefix(&mut rng), identity.key(&limit));
        keys.extend(log_keys(&full).map(String::into_bytes));
        keys.push(full.into_bytes());
        // Raw bytes, braces included, to check the tag rule and the CRC beyond ASCII.
        let raw: Vec<u8> = (0..rng.usize(0..12))
            .map(|_| match rng.u8(..4) {
                0 => b'{',
                1 => b'}',
                _ => rng.u8(..),
            })
            .collect();
        keys.push(raw);
    }
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key);
    }
    let mut connection = server
        .client()
        .get_connection()
        .expect("connect to redis-server");
    let slots: Vec<u16> = pipe.query(&mut connection).expect("CLUSTER KEYSLOT");
    for (key, redis_slot) in keys.iter().zip(slots) {
        // The cluster backend's own slots, by which it groups hits per primary.
        assert_eq!(
            slot(key),
            redis_slot,
            "{:?}; {}",
            String::from_utf8_lossy(key),
            replay(seed)
        );
    }
}

/// Statistics of `COUNTERS` slots, against what a uniform random hash would give.
///
/// - Occupied slots: an ideal hash fills `E = m (1 - (1 - 1/m)^n)` ≈ 7,486 of m = 16,384
///   slots with n = 10,000 counters (10,000 counters cannot fill 90 % of the slots; 61 % is
///   the ceiling). The count of occupied slots changes by at most 1 when one counter moves,
///   so McDiarmid's inequality gives P(occupied ≤ E - t) ≤ exp(-2t²/n): at least 90 % of E
///   (t ≈ 749) fails for a uniform hash with probability below e^-112. A tag that leaves
///   out the descriptor values puts every counter in one slot.
/// - Fullest slot: P(some slot ≥ k) ≤ m (n/m)^k / k!, below 2·10^-10 for k = 14.
/// - Nodes: 16 equal slot ranges (a 16-primary cluster) expect μ = 625 counters each; the
///   Chernoff bounds exp(-δ²μ/(2+δ)) and exp(-δ²μ/2) with δ = 0.4 put a range outside
///   [375, 875] with probability below 10^-17 over all 16.
fn assert_spread(what: &str, slots: &[u16]) {
    assert_eq!(slots.len(), COUNTERS);
    let mut per_slot = vec![0u32; SLOTS];
    for &slot in slots {
        per_slot[usize::from(slot)] += 1;
    }
    let (m, n) = (SLOTS as f64, COUNTERS as f64);
    let expected = m * (1.0 - (1.0 - 1.0 / m).powf(n));
    let occupied = per_slot.iter().filter(|&&count| count > 0).count();
    assert!(
        occupied as f64 >= 0.9 * expected,
        "{what}: {occupied} slots occupied, a uniform hash fills {expected:.0}"
    );
    let fullest = per_slot.iter().max().copied().unwrap_or(0);
    assert!(fullest < 14, "{what}: {fullest} counters in one slot");
    for (node, range) in per_slot.chunks(SLOTS / 16).enumerate() {
        let load: u32 = range.iter().sum();
        assert!(
            (375..=875).contains(&load),
            "{what}: node {node} of 16 holds {load} counters, 625 expected"
        );
    }
}

#[test]
fn different_counters_spread_over_the_slots() {
    // The usual shape: one rule, one descriptor key, a value per client.
    let limit = Limit::per(100, Unit::Minute);
    let users: Vec<u16> = (0..COUNTERS)
        .map(|i| {
            let value = format!("user-{i}");
            let key = CounterKey::new("api", "per_user", 0, &limit, [("user_id", value.as_str())]);
            slot(format!("floodgate:{key}").as_bytes())
        })
        .collect();
    assert_spread("user ids", &users);

    // Random descriptors, one counter per distinct hash tag.
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tags: HashMap<String, u16> = HashMap::new();
    while tags.len() < COUNTERS {
        let (identity, limit) = random_case(&mut rng);
        let key = identity.key(&limit);
        let slot = slot(key.as_str().as_bytes());
        tags.insert(key.hash_tag().to_owned(), slot);
    }
    let random: Vec<u16> = tags.into_values().collect();
    assert_spread(&format!("random descriptors, {}", replay(seed)), &random);
}
