//! Which Redis Cluster node serves a key: the slot of the key's hash tag, and the map of
//! slots to primaries the cluster reports (`CLUSTER SLOTS`).
//!
//! The cluster backend groups the hits of concurrent requests by node with it, so that each
//! node gets one script call for all of its hits. The map may be stale (a slot migrated, a
//! replica promoted): a hit sent to a node that no longer serves its key fails before it
//! writes anything, and is sent again by its slot alone while the map is read afresh.

use std::collections::HashMap;

use deadpool_redis::redis::Value;

/// Slots in a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag, modulo 16,384.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS as u16
}

/// The part of `key` Redis Cluster hashes: between the first `{` and the first `}` after
/// it, if that is not empty; else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(len) = rest.iter().position(|&b| b == b'}')
            && len > 0
        {
            return &rest[..len];
        }
    }
    key
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0, no reflection), a byte at a time.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// CRC16/XMODEM of every byte value, computed at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

/// A primary's address, as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The primary that serves each slot, and every node the cluster listed.
#[derive(Debug, Clone)]
pub struct SlotMap {
    /// The primaries, each once.
    nodes: Vec<Node>,
    /// The replicas the cluster listed beside them.
    replicas: Vec<Node>,
    /// Per slot, an index into `nodes`; `u16::MAX` for a slot no node serves.
    owners: Box<[u16]>,
}

const UNSERVED: u16 = u16::MAX;

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply, `[start, end, [host, port, …], replicas…]` per range,
    /// that `queried` gave: a node listed without a host (one that does not know its own
    /// address) is on `queried`'s host.
    pub fn from_cluster_slots(reply: &Value, queried: &Node) -> Result<Self, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS replied {reply:?}"));
        };
        let mut nodes: Vec<Node> = Vec::new();
        let mut replicas: Vec<Node> = Vec::new();
        let mut index: HashMap<Node, u16> = HashMap::new();
        let mut owners = vec![UNSERVED; SLOTS].into_boxed_slice();
        for range in ranges {
            let (start, end, node, range_replicas) = read_range(range, queried)?;
            for replica in range_replicas {
                if !replicas.contains(&replica) {
                    replicas.push(replica);
                }
            }
            let next = u16::try_from(nodes.len()).map_err(|_| "too many nodes".to_owned())?;
            let at = *index.entry(node.clone()).or_insert_with(|| {
                nodes.push(node);
                next
            });
            owners[start..=end].fill(at);
        }
        replicas.retain(|replica| !nodes.contains(replica));
        Ok(SlotMap {
            nodes,
            replicas,
            owners,
        })
    }

    /// The primaries that serve slots.
    pub fn primaries(&self) -> &[Node] {
        &self.nodes
    }

    /// Every node the map names: the primaries, then their replicas.
    pub fn members(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().chain(&self.replicas)
    }

    /// The primary that serves `key`, if the map knows one.
    pub fn node_of(&self, key: &[u8]) -> Option<&Node> {
        match self.owners[usize::from(slot(key))] {
            UNSERVED => None,
            at => self.nodes.get(usize::from(at)),
        }
    }
}

/// One range of a `CLUSTER SLOTS` reply: its first and last slot, its primary and its
/// replicas.
fn read_range(range: &Value, queried: &Node) -> Result<(usize, usize, Node, Vec<Node>), String> {
    let bad = || format!("CLUSTER SLOTS range {range:?}");
    let Value::Array(items) = range else {
        return Err(bad());
    };
    let [Value::Int(start), Value::Int(end), servers @ ..] = items.as_slice() else {
        return Err(bad());
    };
    let (start, end) = (usize::try_from(*start), usize::try_from(*end));
    let (Ok(start), Ok(end)) = (start, end) else {
        return Err(bad());
    };
    if start > end || end >= SLOTS {
        return Err(bad());
    }
    let mut servers = servers.iter().map(|server| read_node(server, queried));
    let primary = servers.next().ok_or_else(bad)?.ok_or_else(bad)?;
    let replicas = servers.collect::<Option<Vec<Node>>>().ok_or_else(bad)?;
    Ok((start, end, primary, replicas))
}

/// A server of a `CLUSTER SLOTS` range: `[host, port, id, …]`.
fn read_node(server: &Value, queried: &Node) -> Option<Node> {
    let Value::Array(fields) = server else {
        return None;
    };
    let host = match fields.first()? {
        Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
        Value::SimpleString(host) => host.clone(),
        Value::Nil => String::new(),
        _ => return None,
    };
    let host = match host.as_str() {
        "" | "?" => queried.host.clone(),
        _ => host,
    };
    let port = match fields.get(1)? {
        Value::Int(port) => u16::try_from(*port).ok()?,
        _ => return None,
    };
    Some(Node { host, port })
}

/// Whether a hit's error says the node does not serve its key now: a script that touches a
/// key the cluster has moved away (or cannot serve while it is down) fails on that key's
/// first read, before it wrote anything, so the hit can be sent again.
pub fn not_served_here(message: &str) -> bool {
    message.contains("non local key")
        || message.contains("cluster is down")
        // A primary demoted by a failover refuses a script that may write before it runs.
        || message.contains("read only replica")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_is_the_one_the_cluster_specification_quotes() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn only_a_non_empty_first_tag_is_hashed() {
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
    }

    /// The node the replies came from.
    fn queried() -> Node {
        Node {
            host: "10.0.0.9".into(),
            port: 7009,
        }
    }

    #[test]
    fn replicas_are_members_and_a_node_without_a_host_is_on_the_queried_ones() {
        let server = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
            ])
        };
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            server("", 7000),
            server("10.0.0.2", 7001),
        ])]);
        let map = SlotMap::from_cluster_slots(&reply, &queried()).expect("a slot map");
        let node = |host: &str, port| Node {
            host: host.into(),
            port,
        };
        assert_eq!(map.primaries(), [node("10.0.0.9", 7000)]);
        let members: Vec<&Node> = map.members().collect();
        assert_eq!(members, [&node("10.0.0.9", 7000), &node("10.0.0.2", 7001)]);
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn every_slot_of_a_range_belongs_to_its_primary() {
        let reply = Value::Array(vec![
            range(0, 5460, "10.0.0.1", 7000),
            range(10923, 16383, "10.0.0.3", 7002),
        ]);
        let map = SlotMap::from_cluster_slots(&reply, &queried()).expect("a slot map");
        let key = |slot: u16| {
            (0u32..)
                .map(|n| n.to_string())
                .find(|k| super::slot(k.as_bytes()) == slot)
                .expect("some key hashes to every slot")
        };
        let node = |host: &str, port| {
            Some(Node {
                host: host.into(),
                port,
            })
        };
        assert_eq!(
            map.node_of(key(0).as_bytes()).cloned(),
            node("10.0.0.1", 7000)
        );
        assert_eq!(
            map.node_of(key(5460).as_bytes()).cloned(),
            node("10.0.0.1", 7000)
        );
        assert_eq!(map.node_of(key(5461).as_bytes()), None);
        assert_eq!(
            map.node_of(key(16383).as_bytes()).cloned(),
            node("10.0.0.3", 7002)
        );
    }

    #[test]
    fn a_malformed_reply_is_an_error() {
        assert!(SlotMap::from_cluster_slots(&Value::Nil, &queried()).is_err());
        let reversed = Value::Array(vec![range(10, 5, "h", 1)]);
        assert!(SlotMap::from_cluster_slots(&reversed, &queried()).is_err());
        let beyond = Value::Array(vec![range(0, 16384, "h", 1)]);
        assert!(SlotMap::from_cluster_slots(&beyond, &queried()).is_err());
    }
}
