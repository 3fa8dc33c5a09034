//! Redis Sentinel: a URL that names the sentinels and the primary they
//! watch, discovery of the primary, and a connection that discovers it again
//! after a failover.
//!
//! `redis+sentinel://[[user]:password@]host1[:26379][,host2[:26379]…]/<master>[/<db>]`
//! (`rediss+sentinel://` for TLS), with `?sentinel_username=…&sentinel_password=…`
//! for sentinels that want credentials of their own. The URL's user and
//! password are for the primary, as in ioredis, redis-py and Sidekiq, where
//! sentinels get none unless told.
//!
//! Discovery asks each sentinel in turn `SENTINEL GET-MASTER-ADDR-BY-NAME`,
//! connects to the address it names and keeps it only when the node's `ROLE`
//! says `master` (a sentinel that has not yet seen a failover names the old
//! primary, which then answers `slave`). A [`SentinelConnection`] forgets its
//! socket when a command finds it broken or on a node that is no longer the
//! primary (`READONLY`, `UNBLOCKED`, `MASTERDOWN`); the next command asks the
//! sentinels again. It also listens to the sentinels' `+switch-master`
//! announcements, so that it leaves a demoted primary as soon as a sentinel
//! promotes another, rather than when the sentinels get round to
//! reconfiguring the old one (seconds, during which its writes would be
//! lost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::{Endpoint, describe};

/// The port of a sentinel named without one.
pub const DEFAULT_PORT: u16 = 26379;

/// The two schemes, plain and TLS.
pub(super) const SCHEMES: [&str; 2] = ["redis+sentinel://", "rediss+sentinel://"];

/// Whether `url` is a Sentinel URL.
pub(super) fn is_sentinel_url(url: &str) -> bool {
    SCHEMES.iter().any(|s| url.starts_with(s))
}

/// What a Sentinel URL says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Sentinels {
    /// `host:port` of each sentinel, in the URL's order (IPv6 in brackets).
    pub(super) nodes: Vec<String>,
    /// The name the sentinels know the primary by.
    pub(super) master: String,
    /// The database on the primary.
    pub(super) db: i64,
    /// `user:password` for the primary, percent-encoded as in the URL.
    pub(super) userinfo: Option<String>,
    /// `user:password` for the sentinels, percent-encoded.
    pub(super) sentinel_userinfo: Option<String>,
    /// TLS to the sentinels and to the primary.
    pub(super) tls: bool,
}

impl Sentinels {
    /// Reads a Sentinel URL; the error says what is wrong in it.
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "not a URL".to_string())?;
        let tls = match scheme {
            "redis+sentinel" => false,
            "rediss+sentinel" => true,
            other => return Err(format!("unknown scheme {other}://")),
        };
        if rest.contains('#') {
            return Err("a fragment (#…) has no meaning here".into());
        }
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = main.split_at(main.find('/').unwrap_or(main.len()));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if hosts.is_empty() {
            return Err("names no sentinel: list them as host1:26379,host2:26379".into());
        }
        let nodes = hosts
            .split(',')
            .map(sentinel_address)
            .collect::<Result<Vec<_>, _>>()?;
        let mut parts = path.trim_start_matches('/').split('/');
        let master = parts.next().unwrap_or_default();
        if master.is_empty() {
            return Err(
                "names no primary: add the name the sentinels monitor it by, as in …:26379/mymaster"
                    .into(),
            );
        }
        if !master
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "primary name {master:?}: only letters, digits, '-', '_' and '.' are supported"
            ));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
                format!("database {db:?} is not a number (…/{master}/0 selects database 0)")
            })?,
        };
        if let Some(extra) = parts.find(|p| !p.is_empty()) {
            return Err(format!(
                "unexpected path segment {extra:?}: the path is /<primary name>[/<db>]"
            ));
        }
        let (mut sentinel_user, mut sentinel_password) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sentinel_username" => sentinel_user = Some(value),
                "sentinel_password" => sentinel_password = Some(value),
                other => {
                    return Err(format!(
                        "unknown parameter {other:?}: the parameters are sentinel_username and sentinel_password"
                    ));
                }
            }
        }
        if sentinel_user.is_some() && sentinel_password.is_none() {
            return Err("sentinel_username needs sentinel_password".into());
        }
        let sentinel_userinfo = sentinel_password
            .map(|password| format!("{}:{password}", sentinel_user.unwrap_or_default()));
        let sentinels = Self {
            nodes,
            master: master.to_string(),
            db,
            userinfo: userinfo.filter(|u| !u.is_empty()).map(str::to_string),
            sentinel_userinfo,
            tls,
        };
        // The URLs the parts become must be ones redis-rs reads (percent
        // escapes in the credentials, host names).
        let check = |url: String| {
            redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        for node in &sentinels.nodes {
            check(sentinels.sentinel_url(node, false))
                .map_err(|e| format!("sentinel {node}: {e}"))?;
        }
        check(sentinels.primary_url("127.0.0.1", 6379, false))?;
        Ok(sentinels)
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "rediss" } else { "redis" }
    }

    /// The URL of one sentinel, with the sentinels' credentials.
    pub(super) fn sentinel_url(&self, node: &str, insecure: bool) -> String {
        let credentials = self
            .sentinel_userinfo
            .as_ref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let fragment = if insecure && self.tls {
            "#insecure"
        } else {
            ""
        };
        format!("{}://{credentials}{node}{fragment}", self.scheme())
    }

    /// The URL of the primary at `host:port`, with the URL's credentials
    /// and database.
    pub(super) fn primary_url(&self, host: &str, port: u16, insecure: bool) -> String {
        let credentials = self
            .userinfo
            .as_ref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let fragment = if insecure && self.tls {
            "#insecure"
        } else {
            ""
        };
        format!(
            "{}://{credentials}{host}:{port}/{}{fragment}",
            self.scheme(),
            self.db
        )
    }

    /// The secrets the URL holds, to keep them out of messages.
    pub(super) fn secrets(url: &str) -> Vec<&str> {
        let query = url.split_once('?').map_or("", |(_, q)| q);
        query
            .split('&')
            .filter_map(|p| p.strip_prefix("sentinel_password="))
            .filter(|p| !p.is_empty())
            .collect()
    }
}

/// `host[:port]` of one sentinel, with the default port.
fn sentinel_address(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("an empty sentinel address (a doubled or trailing comma?)".into());
    }
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (inside, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("sentinel {text:?}: an IPv6 address needs its closing ']'"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                format!("sentinel {text:?}: expected :port after the IPv6 address")
            })?),
        };
        (format!("[{inside}]"), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(format!(
                    "sentinel {text:?}: write an IPv6 address in brackets, as [::1]:26379"
                ));
            }
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (text.to_string(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(format!("sentinel {text:?} names no host"));
    }
    if host.contains(|c: char| c.is_whitespace() || "/?#@".contains(c)) {
        return Err(format!("sentinel {text:?}: not a host name"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("sentinel {text:?}: port {p:?} is not a port number"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Asks the sentinels for the primary, in turn, until one names a node that
/// says it is the primary. The error lists what each sentinel answered.
pub(super) async fn discover(
    endpoint: &Endpoint,
    sentinels: &Sentinels,
    config: &AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let mut problems = Vec::new();
    for node in &sentinels.nodes {
        match ask(endpoint, sentinels, node, config).await {
            Ok(primary) => return Ok(primary),
            Err(problem) => problems.push(problem),
        }
    }
    let text = format!(
        "no sentinel named a reachable primary {:?}: {}",
        sentinels.master,
        problems.join("; ")
    );
    Err(RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        endpoint.scrub(&text),
    )))
}

/// One sentinel's answer, checked; `Err` says what went wrong with it.
async fn ask(
    endpoint: &Endpoint,
    sentinels: &Sentinels,
    node: &str,
    config: &AsyncConnectionConfig,
) -> Result<MultiplexedConnection, String> {
    let insecure = endpoint.tls().insecure_skip_verify;
    let mut sentinel = endpoint
        .client_for(&sentinels.sentinel_url(node, insecure))
        .map_err(|e| format!("sentinel {node}: {}", describe(&e)))?
        .get_multiplexed_async_connection_with_config(config)
        .await
        .map_err(|e| format!("sentinel {node}: {}", describe(&e)))?;
    let address: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(&sentinels.master)
        .query_async(&mut sentinel)
        .await
        .map_err(|e| format!("sentinel {node}: {}", describe(&e)))?;
    let Some((host, port)) = address else {
        return Err(format!(
            "sentinel {node} monitors no primary named {:?}",
            sentinels.master
        ));
    };
    let shown = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let named = |what: String| format!("primary {shown} (named by sentinel {node}): {what}");
    let mut primary = endpoint
        .client_for(&sentinels.primary_url(&host, port, insecure))
        .map_err(|e| named(describe(&e)))?
        .get_multiplexed_async_connection_with_config(config)
        .await
        .map_err(|e| named(describe(&e)))?;
    let role: Vec<Value> = redis::cmd("ROLE")
        .query_async(&mut primary)
        .await
        .map_err(|e| named(describe(&e)))?;
    let role: Option<String> = role
        .first()
        .and_then(|r| redis::from_redis_value_ref(r).ok());
    match role.as_deref() {
        Some("master") => Ok(primary),
        Some(other) => Err(named(format!(
            "it is a {other}, not the primary (a failover under way?)"
        ))),
        None => Err(named("ROLE gave no role".into())),
    }
}

/// Whether `error` says that the socket is gone or that the node behind it
/// is no longer the primary: the next command should ask the sentinels.
pub fn primary_lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || matches!(error.code(), Some("READONLY" | "UNBLOCKED" | "MASTERDOWN"))
}

/// A connection to the primary the sentinels name. Clones share one socket;
/// after a failover (a broken socket, or a node that answers as a replica)
/// the failed command returns its error and the next one discovers the new
/// primary. Commands are never resent: whether a write landed before the
/// socket broke is for the caller to find out, as with any connection.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: Endpoint,
    sentinels: Sentinels,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The socket to the primary; `None` after it was lost.
    socket: tokio::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    /// Discoveries made, for tests and logs.
    discoveries: AtomicU64,
    /// Dropped with the last clone: stops the `+switch-master` listener.
    _stop_listening: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master", &self.shared.sentinels.master)
            .field("sentinels", &self.shared.sentinels.nodes)
            .finish()
    }
}

impl SentinelConnection {
    /// Discovers the primary now.
    pub(super) async fn connect(
        endpoint: Endpoint,
        sentinels: Sentinels,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> RedisResult<Self> {
        let first = discover(&endpoint, &sentinels, &config).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let shared = Arc::new(Shared {
            endpoint,
            sentinels,
            config,
            connect_timeout,
            socket: tokio::sync::Mutex::new(Some((0, first))),
            generation: AtomicU64::new(1),
            discoveries: AtomicU64::new(1),
            _stop_listening: stop,
        });
        tokio::spawn(listen(Arc::downgrade(&shared), stopped));
        Ok(Self { shared })
    }

    /// How many times the primary was discovered (the first time included).
    pub fn discoveries(&self) -> u64 {
        self.shared.discoveries.load(Ordering::Relaxed)
    }

    /// The socket to use: the shared one, discovered again if it was lost.
    async fn socket(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut shared = self.shared.socket.lock().await;
        if let Some(s) = shared.as_ref() {
            return Ok(s.clone());
        }
        let found = discover(
            &self.shared.endpoint,
            &self.shared.sentinels,
            &self.shared.config,
        )
        .await?;
        self.shared.discoveries.fetch_add(1, Ordering::Relaxed);
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed);
        let socket = (generation, found);
        *shared = Some(socket.clone());
        Ok(socket)
    }

    /// Forgets socket `generation` when `lost` says it lost the primary
    /// (a newer socket found meanwhile is kept).
    async fn after(&self, generation: u64, lost: bool) {
        if lost {
            let mut shared = self.shared.socket.lock().await;
            if shared.as_ref().is_some_and(|(g, _)| *g == generation) {
                *shared = None;
            }
        }
    }
}

/// Listens to `+switch-master` on one sentinel after another (a second
/// apart after a failure) and forgets the socket when the primary of this
/// connection's name moves; ends when the last clone is dropped.
async fn listen(shared: Weak<Shared>, mut stopped: tokio::sync::oneshot::Receiver<()>) {
    let Some((endpoint, sentinels, timeout)) = shared
        .upgrade()
        .map(|s| (s.endpoint.clone(), s.sentinels.clone(), s.connect_timeout))
    else {
        return;
    };
    let insecure = endpoint.tls().insecure_skip_verify;
    for node in sentinels.nodes.iter().cycle() {
        let subscribed = async {
            let client = endpoint.client_for(&sentinels.sentinel_url(node, insecure))?;
            let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
                })??;
            pubsub.subscribe("+switch-master").await?;
            let mut messages = pubsub.on_message();
            while let Some(message) = futures::StreamExt::next(&mut messages).await {
                // `<name> <old ip> <old port> <new ip> <new port>`
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split_whitespace().next() != Some(sentinels.master.as_str()) {
                    continue;
                }
                let Some(shared) = shared.upgrade() else {
                    break;
                };
                *shared.socket.lock().await = None;
            }
            Ok::<_, RedisError>(())
        };
        tokio::select! {
            _ = &mut stopped => return,
            _ = subscribed => {}
        }
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Whether a reply is an error that says the primary is lost. A server's
/// error reply comes back as a value (`Value::ServerError`), turned into an
/// `Err` only when the caller reads it.
fn lost_in(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => primary_lost(&RedisError::from(e.clone())),
        _ => false,
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut socket) = self.socket().await?;
            let result = socket.req_packed_command(cmd).await;
            let lost = match &result {
                Ok(value) => lost_in(value),
                Err(e) => primary_lost(e),
            };
            self.after(generation, lost).await;
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut socket) = self.socket().await?;
            let result = socket.req_packed_commands(pipeline, offset, count).await;
            let lost = match &result {
                Ok(values) => values.iter().any(lost_in),
                Err(e) => primary_lost(e),
            };
            self.after(generation, lost).await;
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.sentinels.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_the_url_is_read() {
        let s = Sentinels::parse(
            "redis+sentinel://app:pw@s1:26379,s2,[::1]:26380/mymaster/3?sentinel_password=spw",
        )
        .expect("valid");
        assert_eq!(s.nodes, ["s1:26379", "s2:26379", "[::1]:26380"]);
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.db, 3);
        assert_eq!(s.userinfo.as_deref(), Some("app:pw"));
        assert_eq!(s.sentinel_userinfo.as_deref(), Some(":spw"));
        assert!(!s.tls);
        assert_eq!(s.sentinel_url("s1:26379", false), "redis://:spw@s1:26379");
        assert_eq!(
            s.primary_url("10.0.0.5", 6379, false),
            "redis://app:pw@10.0.0.5:6379/3"
        );
        assert_eq!(
            s.primary_url("fe80::1", 6379, false),
            "redis://app:pw@[fe80::1]:6379/3"
        );
        let tls = Sentinels::parse("rediss+sentinel://s1/m").expect("valid");
        assert!(tls.tls);
        assert_eq!(tls.db, 0);
        assert_eq!(tls.userinfo, None);
        assert_eq!(
            tls.sentinel_url("s1:26379", true),
            "rediss://s1:26379#insecure"
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, expected) in [
            ("redis+sentinel://s1:26379", "names no primary"),
            ("redis+sentinel://s1:26379/", "names no primary"),
            ("redis+sentinel:///mymaster", "names no sentinel"),
            ("redis+sentinel://:pw@/mymaster", "names no sentinel"),
            ("redis+sentinel://s1,,s2/m", "empty sentinel address"),
            ("redis+sentinel://s1,/m", "empty sentinel address"),
            ("redis+sentinel://s1:port/m", "is not a port number"),
            ("redis+sentinel://s1:0/m", "is not a port number"),
            ("redis+sentinel://s1:70000/m", "is not a port number"),
            ("redis+sentinel://::1:26379/m", "in brackets"),
            ("redis+sentinel://[::1/m", "closing ']'"),
            ("redis+sentinel://s1/m/x", "is not a number"),
            ("redis+sentinel://s1/m/-1", "is not a number"),
            ("redis+sentinel://s1/m/0/extra", "unexpected path segment"),
            ("redis+sentinel://s1/my%20master", "only letters"),
            ("redis+sentinel://s1/m?password=x", "unknown parameter"),
            (
                "redis+sentinel://s1/m?sentinel_username=u",
                "needs sentinel_password",
            ),
            ("redis+sentinel://s1/m#x", "fragment"),
        ] {
            let e = Sentinels::parse(url).expect_err(url);
            assert!(e.contains(expected), "{url}: {e}");
        }
    }

    #[test]
    fn a_lost_primary_is_told_from_other_errors() {
        let reply = |text: &str| -> RedisError {
            redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
                .and_then(|v| v.extract_error())
                .expect_err("an error reply")
        };
        for lost in [
            "READONLY You can't write against a read only replica.",
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            assert!(primary_lost(&reply(lost)), "{lost}");
        }
        for kept in [
            "WRONGTYPE Operation against a key",
            "ERR unknown command",
            "NOSCRIPT x",
        ] {
            assert!(!primary_lost(&reply(kept)), "{kept}");
        }
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(primary_lost(&dropped));
    }
}
