//! What the Redis server that holds a queue does when it runs out of
//! memory, read from `INFO` (which works where `CONFIG` is disabled, as on
//! managed Redis).
//!
//! A queue's jobs live in ordinary keys without a TTL. With
//! `maxmemory-policy noeviction` a full Redis refuses writes and deletes
//! nothing: producers and workers get errors, and every job stays. Any
//! `allkeys-*` policy deletes keys to make room, and a waiting list, a
//! processing list or the dead list can then vanish with every job in it,
//! without an error anywhere. The `volatile-*` policies delete only keys
//! with a TTL: of workerpool's keys, a worker's details and a queue's rate
//! bucket ([`VOLATILE_KEYS`]).

use redis::RedisResult;

use crate::connection::Connection;
use crate::keys::QueueKeys;

/// The keys of a queue that carry a TTL, and what evicting each does.
pub const VOLATILE_KEYS: [(&str, &str); 2] = [
    (
        "<q>:worker:<instance>",
        "a worker's details; it writes them again at its next heartbeat, \
         and until then a reaper judges it by the reaper's own --dead-after",
    ),
    (
        "<q>:rate",
        "a rate-limited queue's bucket; the queue may start a burst above \
         its limit once",
    ),
];

/// The server's memory settings and evictions, as `INFO` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// `maxmemory_policy`; `None` when `INFO` does not say.
    pub policy: Option<String>,
    /// `maxmemory` in bytes (0: no limit).
    pub maxmemory: u64,
    /// `evicted_keys`: keys evicted since the server started.
    pub evicted_keys: u64,
    /// The Redis user may not run `INFO` (ACL): the policy is unknown.
    pub info_refused: bool,
}

/// How much a server's eviction policy puts a queue at risk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Risk {
    /// `noeviction`: nothing is ever deleted to make room.
    None,
    /// The policy could not be read.
    Unknown,
    /// `volatile-*`: only keys with a TTL can be deleted ([`VOLATILE_KEYS`]).
    Volatile,
    /// `allkeys-*` (or a policy this code does not know): any key, jobs
    /// included, can be deleted.
    AllKeys,
}

impl Memory {
    /// Reads the fields of `INFO memory` and `INFO stats` replies (or of
    /// one full `INFO`).
    pub fn parse(info: &str) -> Self {
        let mut memory = Memory::default();
        for line in info.lines() {
            let Some((name, value)) = line.trim_end().split_once(':') else {
                continue;
            };
            match name {
                "maxmemory_policy" => memory.policy = Some(value.to_string()),
                "maxmemory" => memory.maxmemory = value.parse().unwrap_or(0),
                "evicted_keys" => memory.evicted_keys = value.parse().unwrap_or(0),
                _ => {}
            }
        }
        memory
    }

    /// The risk the policy puts jobs at.
    pub fn risk(&self) -> Risk {
        match self.policy.as_deref() {
            None => Risk::Unknown,
            Some("noeviction") => Risk::None,
            Some(p) if p.starts_with("volatile-") => Risk::Volatile,
            Some(_) => Risk::AllKeys,
        }
    }

    /// A reason in CamelCase for conditions and events: `NoEviction`,
    /// `PolicyUnknown`, `VolatileEviction`, `EvictionPolicy`.
    pub fn reason(&self) -> &'static str {
        match self.risk() {
            Risk::None => "NoEviction",
            Risk::Unknown => "PolicyUnknown",
            Risk::Volatile => "VolatileEviction",
            Risk::AllKeys => "EvictionPolicy",
        }
    }

    /// What to tell people, or `None` for `noeviction`.
    pub fn warning(&self) -> Option<String> {
        let policy = self.policy.as_deref().unwrap_or("unknown");
        let limit = if self.maxmemory == 0 {
            " (maxmemory is 0 now, so nothing is evicted until a limit is set)"
        } else {
            ""
        };
        match self.risk() {
            Risk::None => None,
            Risk::Unknown if self.info_refused => Some(
                "the Redis user may not run INFO (ACL), so Redis's maxmemory-policy cannot \
                 be read: if it evicts keys, jobs can be lost without an error; make sure it \
                 is noeviction, or grant +info to have it checked (docs/redis-acl.md)"
                    .into(),
            ),
            Risk::Unknown => Some(
                "cannot read Redis's maxmemory-policy from INFO memory: if it evicts keys, \
                 jobs can be lost without an error; make sure it is noeviction"
                    .into(),
            ),
            Risk::Volatile => Some(format!(
                "Redis evicts keys with a TTL when memory is full (maxmemory-policy {policy}){limit}. \
                 Jobs have no TTL and stay, but these workerpool keys do: {}. \
                 Set maxmemory-policy noeviction to keep them too",
                VOLATILE_KEYS
                    .iter()
                    .map(|(key, what)| format!("{key} ({what})"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Risk::AllKeys => Some(format!(
                "Redis deletes keys when memory is full (maxmemory-policy {policy}){limit}: waiting, \
                 running and dead jobs can vanish without an error. Set maxmemory-policy \
                 noeviction on the Redis that holds the queues (a full Redis then refuses new \
                 jobs instead of deleting old ones)"
            )),
        }
    }
}

/// Reads the memory settings of the server (on a cluster: the node) that
/// holds queue `q`. A user the ACL refuses `INFO` gets a [`Memory`] that
/// says so ([`Memory::info_refused`]) rather than an error: `INFO` is
/// optional (docs/redis-acl.md).
pub async fn read(conn: &mut Connection, q: &QueueKeys) -> RedisResult<Memory> {
    let memory: String = match conn
        .on_node_of(q.waiting(), redis::cmd("INFO").arg("memory"))
        .await
    {
        Ok(memory) => memory,
        Err(e) if crate::connection::refused(&e).is_some() => {
            return Ok(Memory {
                info_refused: true,
                ..Memory::default()
            });
        }
        Err(e) => return Err(e),
    };
    let stats: String = conn
        .on_node_of(q.waiting(), redis::cmd("INFO").arg("stats"))
        .await?;
    Ok(Memory::parse(&format!("{memory}\n{stats}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_has_its_risk_and_only_noeviction_no_warning() {
        for (policy, risk) in [
            ("noeviction", Risk::None),
            ("volatile-lru", Risk::Volatile),
            ("volatile-lfu", Risk::Volatile),
            ("volatile-random", Risk::Volatile),
            ("volatile-ttl", Risk::Volatile),
            ("allkeys-lru", Risk::AllKeys),
            ("allkeys-lfu", Risk::AllKeys),
            ("allkeys-random", Risk::AllKeys),
            ("some-future-policy", Risk::AllKeys),
        ] {
            let m = Memory::parse(&format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory:1048576\r\nmaxmemory_policy:{policy}\r\n"
            ));
            assert_eq!(m.risk(), risk, "{policy}");
            assert_eq!(m.warning().is_none(), risk == Risk::None, "{policy}");
            if let Some(w) = m.warning() {
                assert!(w.contains(policy), "{w}");
                assert!(w.contains("noeviction"), "{w}");
            }
        }
        let unknown = Memory::parse("# Memory\r\nused_memory:1\r\n");
        assert_eq!(
            (unknown.risk(), unknown.reason()),
            (Risk::Unknown, "PolicyUnknown")
        );
    }

    #[test]
    fn a_volatile_warning_names_every_key_with_a_ttl() {
        let m = Memory::parse("maxmemory_policy:volatile-lru\nmaxmemory:10\nevicted_keys:3\n");
        assert_eq!(m.evicted_keys, 3);
        let w = m.warning().unwrap_or_default();
        for (key, _) in VOLATILE_KEYS {
            assert!(w.contains(key), "{w}");
        }
    }
}
