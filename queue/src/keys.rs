//! The Redis key layout of a queue (queue contract v1).
//!
//! Every reader and writer of a queue — the worker, the operator, the CLI —
//! derives key names here and nowhere else. All keys start with the queue's
//! name, so a queue named with a Redis Cluster hash tag (`{emails}`) keeps
//! every key in one slot and every script stays atomic on a cluster.
//! The layout is documented in `docs/queue-contract.md`.

/// Version of the key layout and job envelope. Bumped on any change that an
/// older reader would misread.
pub const CONTRACT_VERSION: u32 = 1;

/// The names of every key that belongs to one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    name: String,
}

impl QueueKeys {
    /// Keys for the queue stored at the Redis list `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    /// The queue's name, which is also the key of its list of waiting jobs.
    /// Producers `LPUSH` here; workers take from the right, so it is FIFO.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The list of waiting jobs (same as [`QueueKeys::name`]).
    pub fn waiting(&self) -> &str {
        &self.name
    }

    /// The list of jobs one worker instance has taken and not yet settled.
    pub fn processing(&self, instance: &str) -> String {
        format!("{}:processing:{instance}", self.name)
    }

    /// Sorted set of failed jobs waiting for their next attempt, scored by
    /// the due time in unix milliseconds of the Redis server's clock.
    pub fn retry(&self) -> String {
        format!("{}:retry", self.name)
    }

    /// Sorted set of delayed jobs (`run_at` in the future), scored by `run_at`.
    pub fn scheduled(&self) -> String {
        format!("{}:scheduled", self.name)
    }

    /// List of dead-lettered jobs, newest first, each a JSON envelope with
    /// the job, the reason, the last error, the attempts and the time.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.name)
    }

    /// Sorted set of live worker instances, scored by their last heartbeat
    /// (unix milliseconds, Redis server clock).
    pub fn workers(&self) -> String {
        format!("{}:workers", self.name)
    }

    /// Hash describing one worker instance (id, pid, concurrency, in-flight…).
    pub fn worker(&self, instance: &str) -> String {
        format!("{}:worker:{instance}", self.name)
    }

    /// Hash of the unique keys held by jobs of the queue: unique key -> id
    /// of the job that holds it (see `enqueue.lua`).
    pub fn unique(&self) -> String {
        format!("{}:unique", self.name)
    }

    /// Sorted set of the unique keys held, scored by the unix milliseconds
    /// (Redis clock) at which the hold ends whatever became of the job.
    pub fn unique_expiry(&self) -> String {
        format!("{}:unique:expiry", self.name)
    }

    /// The queue's rate-limit bucket: the theoretical arrival time of the
    /// next start (GCRA), unix ms on the Redis clock with a fraction;
    /// expires when it falls behind the clock (see `rate.lua`).
    pub fn rate(&self) -> String {
        format!("{}:rate", self.name)
    }

    /// Monotonic counter of jobs completed successfully.
    pub fn stats_processed(&self) -> String {
        format!("{}:stats:processed", self.name)
    }

    /// Monotonic counter of failed attempts (retried or dead-lettered).
    pub fn stats_failed(&self) -> String {
        format!("{}:stats:failed", self.name)
    }

    /// Monotonic counter of jobs dead-lettered.
    pub fn stats_dead(&self) -> String {
        format!("{}:stats:dead", self.name)
    }

    /// Monotonic counter of jobs returned to the queue from a lost worker.
    pub fn stats_recovered(&self) -> String {
        format!("{}:stats:recovered", self.name)
    }

    /// The mean duration of the queue's jobs, in milliseconds, as its
    /// workers measure it (a moving average the heartbeats fold into; kept
    /// without expiry).
    pub fn stats_duration(&self) -> String {
        format!("{}:stats:duration", self.name)
    }

    /// The mean of the squares of the queue's job durations, in
    /// milliseconds squared, folded with the same weights as
    /// [`QueueKeys::stats_duration`], so that the two give the durations'
    /// spread (their standard deviation); kept without expiry.
    pub fn stats_duration_sq(&self) -> String {
        format!("{}:stats:duration_sq", self.name)
    }

    /// Hash of the recurring schedules that enqueue on the queue:
    /// `<namespace>/<pool>/<schedule>` -> unix ms of its latest claimed
    /// fire (see `fire.lua`).
    pub fn fires(&self) -> String {
        format!("{}:fires", self.name)
    }

    /// A list that is never written: a worker's first blocking wait on a
    /// connection blocks on it for a moment, to learn that the server lets
    /// it block (see `ops::probe_wait`).
    pub fn wait_probe(&self) -> String {
        format!("{}:wait-probe", self.name)
    }

    /// Hash of one kept job's outcome (`state`, `attempt`, `worker`,
    /// `result`, `error`, …; see `ops::Outcome`), for a job that asked for
    /// it (`keep`) or a worker that keeps every one: written with each
    /// settlement, expiring `keep` after the job ends.
    pub fn outcome(&self, id: &str) -> String {
        format!("{}:job:{id}", self.name)
    }

    /// Stream holding one entry once the job's outcome is final: what a
    /// waiter blocks on (`XREAD BLOCK`, a read: every waiter wakes, and a
    /// read-only user may wait). Expires with [`QueueKeys::outcome`].
    pub fn outcome_end(&self, id: &str) -> String {
        format!("{}:job:{id}:end", self.name)
    }
}

/// The words that follow a queue's name, after a colon, in the names of
/// its other keys (`<q>:retry`, `<q>:stats:processed`, `<q>:worker:<id>`).
/// A queue name with one of them as a colon-separated part after its first
/// is refused ([`check_name`]): it would be, or could become, a key of
/// another queue.
pub const KEY_PARTS: [&str; 12] = [
    "processing",
    "retry",
    "scheduled",
    "dead",
    "workers",
    "worker",
    "unique",
    "rate",
    "stats",
    "fires",
    "wait-probe",
    "job",
];

/// The queue's own keys with what each is, as an error names a queue name
/// that would be one of them.
pub fn described_keys(keys: &QueueKeys) -> Vec<(String, &'static str)> {
    vec![
        (keys.retry(), "the retry set"),
        (keys.scheduled(), "the set of delayed jobs"),
        (keys.dead(), "the dead-letter list"),
        (keys.workers(), "the set of live workers"),
        (keys.unique(), "the hash of unique keys"),
        (keys.unique_expiry(), "the expiry set of unique keys"),
        (keys.rate(), "the rate-limit bucket"),
        (keys.fires(), "the hash of schedule fires"),
        (keys.wait_probe(), "the probe list of blocking waits"),
        (keys.stats_processed(), "a counter"),
        (keys.stats_failed(), "a counter"),
        (keys.stats_dead(), "a counter"),
        (keys.stats_recovered(), "a counter"),
        (keys.stats_duration(), "the mean job duration"),
        (keys.stats_duration_sq(), "the mean squared job duration"),
    ]
}

/// Why `name` cannot be a queue's name, if it cannot. Besides being
/// non-empty and without white space, no part of it after a colon may be
/// one of [`KEY_PARTS`]. That is enough for no two distinct valid names to
/// share a key: every key of a queue `a` is `a` or `a:<part>…` with `<part>`
/// in [`KEY_PARTS`]. If a key of `a` were a key of another queue `b`, the
/// shorter name would be a prefix of the longer, say `b = a + t`; `t` is
/// then a prefix of `a`'s suffix `:<part>…` that ends at a colon or at the
/// key's end (where `b`'s own suffix starts), so it holds the whole first
/// `:<part>`, and `b` has `<part>` after a colon.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() || name.contains(char::is_whitespace) {
        return Err(format!(
            "queue name {name:?} must be non-empty and without white space"
        ));
    }
    let parts: Vec<&str> = name.split(':').collect();
    let Some(at) = (1..parts.len()).find(|&i| KEY_PARTS.contains(&parts[i])) else {
        return Ok(());
    };
    let owner = parts[..at].join(":");
    let keys = QueueKeys::new(owner.clone());
    let what = described_keys(&keys)
        .into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, what)| what);
    let how = match what {
        Some(what) => format!("is {what} of the queue {owner:?}"),
        None => format!(
            "would share the keys of the queue {owner:?} ({owner}:{}:…)",
            parts[at]
        ),
    };
    Err(format!(
        "queue name {name:?} {how}; no part of a queue name after a colon may be {}: \
         rename it, for example {:?}",
        KEY_PARTS.join(", "),
        name.replace(':', "-"),
    ))
}

/// The identity of one worker process: the stable worker id (the pod name in
/// Kubernetes) plus a nonce drawn at each process start. A restarted
/// container keeps its pod name but gets a new nonce, which lets the new
/// process find and return the jobs of its earlier incarnations at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    id: String,
    nonce: String,
}

impl Instance {
    /// Separates the worker id from the nonce in an instance name.
    pub const SEPARATOR: char = '~';

    /// A new instance of worker `id` with a fresh random nonce.
    pub fn new(id: impl Into<String>) -> Self {
        let nonce = format!("{:08x}", rand::random::<u32>());
        Self::with_nonce(id, nonce)
    }

    /// An instance with a given nonce (for tests and tools).
    pub fn with_nonce(id: impl Into<String>, nonce: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            nonce: nonce.into(),
        }
    }

    /// The stable worker id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `<id>~<nonce>`, the name used in keys and in the workers set.
    pub fn name(&self) -> String {
        format!("{}{}{}", self.id, Self::SEPARATOR, self.nonce)
    }

    /// The worker id of an instance name, if it has the instance form.
    pub fn id_of(name: &str) -> Option<&str> {
        name.rsplit_once(Self::SEPARATOR).map(|(id, _)| id)
    }
}

/// The hash tag of a key: what Redis Cluster hashes instead of the whole
/// key, the text between the first `{` and the next `}` when not empty.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The Redis Cluster slot of a key (CRC16/XMODEM of its hash tag, or of the
/// whole key, modulo 16384), as `CLUSTER KEYSLOT` gives it.
pub fn slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
}

/// Why `queues` cannot be served together on a Redis Cluster, with how to
/// name them instead. Every script keeps a queue's keys in one slot, and a
/// worker takes from all its queues in one script: on a cluster each queue
/// name needs a hash tag, and the queues of one worker (or one pool) the
/// same slot.
pub fn cluster_problem(queues: &[QueueKeys]) -> Option<String> {
    let untagged: Vec<&str> = queues
        .iter()
        .map(QueueKeys::name)
        .filter(|name| hash_tag(name).is_none())
        .collect();
    let names: Vec<&str> = queues.iter().map(QueueKeys::name).collect();
    if !untagged.is_empty() {
        return Some(format!(
            "Redis is a cluster and queue {} has no hash tag, so its keys would land in different slots; \
             name queues with a hash tag in braces, for example {}",
            untagged.join(", "),
            renamed(&names)
        ));
    }
    let first = names.first().map(|n| slot(n))?;
    if names.iter().any(|n| slot(n) != first) {
        return Some(format!(
            "Redis is a cluster and queues {} are in different slots, but a worker takes from all its queues in one script; \
             give them one hash tag, for example {}",
            names.join(", "),
            renamed(&names)
        ));
    }
    None
}

/// `names` given one hash tag: the first tag among them, else the first
/// name's leading part (`mail:high` → `{mail}:high`).
fn renamed(names: &[&str]) -> String {
    let tag = names
        .iter()
        .find_map(|n| hash_tag(n))
        .or_else(|| names.first().and_then(|n| n.split(':').next()))
        .unwrap_or("jobs");
    names
        .iter()
        .map(|name| {
            if hash_tag(name) == Some(tag) {
                return name.to_string();
            }
            let mut rest = name.to_string();
            if let Some(other) = hash_tag(name) {
                rest = rest.replacen(&format!("{{{other}}}"), "", 1);
            }
            let rest = rest
                .strip_prefix(tag)
                .unwrap_or(&rest)
                .trim_start_matches(':');
            if rest.is_empty() {
                format!("{{{tag}}}")
            } else {
                format!("{{{tag}}}:{rest}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The host name (the pod name in Kubernetes): the default worker id, and
/// the operator's identity for its Lease.
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_string())
}

/// The facts of queue names a client library needs to refuse the same
/// names with the same words: [`KEY_PARTS`], and each of a queue's own
/// keys by its suffix with what it is (generated into each client
/// package's `contract.json` with [`crate::outcome::facts`]).
pub fn facts() -> serde_json::Value {
    let q = QueueKeys::new("q");
    let named: serde_json::Map<String, serde_json::Value> = described_keys(&q)
        .into_iter()
        .filter_map(|(key, what)| Some((key.strip_prefix("q:")?.to_string(), what.into())))
        .collect();
    serde_json::json!({
        "key_parts": KEY_PARTS,
        "key_names": named,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_starts_with_the_queue_name_so_hash_tags_keep_one_slot() {
        let k = QueueKeys::new("{mail}");
        for key in [
            k.waiting().to_string(),
            k.processing("w~1"),
            k.retry(),
            k.scheduled(),
            k.dead(),
            k.workers(),
            k.worker("w~1"),
            k.fires(),
            k.stats_processed(),
            k.stats_failed(),
            k.stats_dead(),
            k.stats_recovered(),
            k.stats_duration(),
            k.stats_duration_sq(),
            k.rate(),
        ] {
            assert!(key.starts_with("{mail}"), "{key}");
        }
    }

    #[test]
    fn slots_are_those_redis_cluster_computes() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("{mail}:high"), Some("mail"));
        assert_eq!(hash_tag("mail"), None);
    }

    #[test]
    fn queues_on_a_cluster_need_one_hash_tag_and_are_told_how() {
        let keys = |names: &[&str]| names.iter().map(|n| QueueKeys::new(*n)).collect::<Vec<_>>();
        assert_eq!(cluster_problem(&keys(&["{mail}"])), None);
        assert_eq!(cluster_problem(&keys(&["{mail}:high", "{mail}:low"])), None);
        let one = cluster_problem(&keys(&["mail"])).expect("untagged");
        assert!(one.contains("queue mail has no hash tag"), "{one}");
        assert!(one.ends_with("for example {mail}"), "{one}");
        let two = cluster_problem(&keys(&["mail:high", "mail:low"])).expect("untagged");
        assert!(two.contains("queue mail:high, mail:low"), "{two}");
        assert!(two.ends_with("{mail}:high, {mail}:low"), "{two}");
        let half = cluster_problem(&keys(&["{mail}:high", "low"])).expect("untagged");
        assert!(half.contains("queue low has"), "{half}");
        assert!(half.ends_with("{mail}:high, {mail}:low"), "{half}");
        let apart = cluster_problem(&keys(&["{mail}:high", "{sms}:low"])).expect("two slots");
        assert!(apart.contains("different slots"), "{apart}");
        assert!(apart.ends_with("{mail}:high, {mail}:low"), "{apart}");
    }

    #[test]
    fn instance_names_round_trip_to_their_worker_id() {
        let a = Instance::with_nonce("pod-7c9d", "0000beef");
        assert_eq!(a.name(), "pod-7c9d~0000beef");
        assert_eq!(Instance::id_of(&a.name()), Some("pod-7c9d"));
        assert_eq!(Instance::id_of("no-separator"), None);
        assert_ne!(Instance::new("x").name(), Instance::new("x").name());
    }
}
