//! Reaching Redis: one set of connection options for every part of
//! workerpool (worker, CLI, operator), with TLS, and URLs shown without
//! their passwords.
//!
//! - `redis://` is plain TCP; `rediss://` is TLS, verified against the
//!   system's roots, or against a private CA ([`Tls::ca_file`]), with an
//!   optional client certificate for mutual TLS.
//! - Files are read at each connection attempt, not at start: a Secret
//!   mounted a moment after the container started is picked up by the next
//!   retry.
//! - One node or a Redis Cluster: [`Mode::Auto`] asks the server which it
//!   is (`INFO cluster`), so the same URL and flags work for both. On a
//!   cluster the URL names any node; slots are discovered, `MOVED` and
//!   `ASK` followed, and the topology refreshed after a failover or a
//!   resharding by redis-rs's cluster client.
//! - Redis Sentinel: `redis+sentinel://host1:26379,host2:26379/mymaster`
//!   names the sentinels and the primary they watch ([`sentinel`]); the
//!   connection finds the primary through them, and again after a failover.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
pub mod sentinel;

pub use sentinel::{SentinelConnection, primary_lost};

use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};

/// Anything the queue operations can send commands on: a [`Connection`],
/// or a plain redis-rs connection to one node.
pub trait Conn: ConnectionLike + Send + Sync {}

impl<T: ConnectionLike + Send + Sync> Conn for T {}

/// Whether Redis is one node or a cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Ask the server (`INFO cluster`) at each connection.
    #[default]
    Auto,
    /// One node (or a primary with replicas behind one address).
    Standalone,
    /// A Redis Cluster; the URL names any of its nodes.
    Cluster,
}

impl Mode {
    /// The name used in flags and in the WorkerPool resource.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Standalone => "standalone",
            Mode::Cluster => "cluster",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Mode::Auto),
            "standalone" => Ok(Mode::Standalone),
            "cluster" => Ok(Mode::Cluster),
            other => Err(format!(
                "unknown Redis mode {other:?}: expected auto, standalone or cluster"
            )),
        }
    }
}

/// A connection to one Redis node or to a Redis Cluster. Cloning is cheap;
/// clones share the underlying sockets (both kinds are multiplexed).
#[derive(Clone)]
pub enum Connection {
    /// One node.
    Node(MultiplexedConnection),
    /// A cluster: each command goes to the node that owns its keys' slot.
    Cluster(ClusterConnection),
    /// The primary that Redis Sentinel names, found again after a failover.
    Sentinel(SentinelConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Node(_) => "Connection::Node",
            Connection::Cluster(_) => "Connection::Cluster",
            Connection::Sentinel(_) => "Connection::Sentinel",
        })
    }
}

impl Connection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// How many times this connection has found the primary the sentinels
    /// name (the first time included): one more after each failover it
    /// followed, or each lost socket it replaced. `None` for one node or a
    /// cluster, which it does not find through the sentinels.
    pub fn primaries_found(&self) -> Option<u64> {
        match self {
            Connection::Sentinel(c) => Some(c.discoveries()),
            Connection::Node(_) | Connection::Cluster(_) => None,
        }
    }

    /// Sends `cmd` to the node that owns `key`'s slot (on one node: to
    /// it). For commands about the connection itself, which name no key:
    /// `CLIENT ID` of the socket a blocking command on `key` uses, and
    /// `CLIENT UNBLOCK` on that node.
    pub async fn on_node_of<T: FromRedisValue>(&mut self, key: &str, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Connection::Node(c) => cmd.query_async(c).await,
            Connection::Sentinel(c) => cmd.query_async(c).await,
            Connection::Cluster(c) => {
                let slot = crate::keys::slot(key);
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                let value = c.route_command(cmd.clone(), route).await?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
        }
    }
}

/// TLS options beside a `rediss://` (or `rediss+sentinel://`) URL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Tls {
    /// PEM file of the CA that signed the server's certificate, instead of
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM file of a client certificate (mutual TLS); needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub client_key: Option<PathBuf>,
    /// Accept any server certificate. Only for tests and emergencies: it
    /// gives up the protection TLS is for.
    pub insecure_skip_verify: bool,
}

impl Tls {
    /// Whether any option is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
            || self.insecure_skip_verify
    }
}

/// TLS material already in memory (the operator reads it from Secrets),
/// used instead of the files of [`Tls`].
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Pem {
    /// The CA certificate(s).
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("ca", &self.ca.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a Redis endpoint cannot be used as given; each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The URL does not parse.
    #[error(
        "--redis-url {url}: {reason}; expected redis://[user:password@]host[:port][/db] or rediss://… for TLS (or redis+sentinel://… for Redis Sentinel)"
    )]
    Url {
        /// The URL, password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Sentinel URL that does not parse.
    #[error(
        "--redis-url {url}: {reason}; expected redis+sentinel://[[user]:password@]host1[:26379][,host2[:26379]…]/<primary name>[/<db>] (rediss+sentinel:// for TLS)"
    )]
    SentinelUrl {
        /// The URL, passwords hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Sentinel URL with the cluster mode.
    #[error(
        "--redis-url {url} names a primary watched by Redis Sentinel, which is not a Redis Cluster: set the Redis mode to auto or standalone"
    )]
    SentinelIsNotACluster {
        /// The URL, passwords hidden.
        url: String,
    },
    /// TLS options beside a plain URL.
    #[error(
        "{option} is a TLS option but --redis-url {url} is plain redis://; use rediss:// (or rediss+sentinel://) to connect with TLS"
    )]
    TlsOptionWithoutTls {
        /// The first TLS option given.
        option: &'static str,
        /// The URL, password hidden.
        url: String,
    },
    /// A client certificate without its key, or the other way round.
    #[error("--redis-client-cert and --redis-client-key go together: give both or neither")]
    HalfAClientCertificate,
}

/// Where and how to reach Redis.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    url: String,
    tls: Tls,
    pem: Option<Pem>,
    mode: Mode,
    sentinel: Option<sentinel::Sentinels>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &redact(&self.url))
            .field("tls", &self.tls)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Endpoint {
    /// Checks the URL and the TLS options together (no I/O).
    pub fn new(url: impl Into<String>, tls: Tls) -> Result<Self, EndpointError> {
        let url = url.into();
        let bad = |reason: String| EndpointError::Url {
            url: redact(&url),
            reason,
        };
        let (is_tls, sentinel) = if sentinel::is_sentinel_url(&url) {
            let parsed =
                sentinel::Sentinels::parse(&url).map_err(|reason| EndpointError::SentinelUrl {
                    url: redact(&url),
                    reason: scrub(&reason, &url),
                })?;
            (parsed.tls, Some(parsed))
        } else {
            let info = redis::parse_redis_url(&url)
                .ok_or_else(|| bad("not a URL".into()))
                .and_then(|u| {
                    redis::IntoConnectionInfo::into_connection_info(u)
                        .map_err(|e| bad(scrub(&e.to_string(), &url)))
                })?;
            (
                matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }),
                None,
            )
        };
        if !is_tls {
            let option = [
                (tls.ca_file.is_some(), "--redis-ca-file"),
                (tls.client_cert.is_some(), "--redis-client-cert"),
                (tls.client_key.is_some(), "--redis-client-key"),
                (tls.insecure_skip_verify, "--redis-tls-insecure-skip-verify"),
            ]
            .into_iter()
            .find_map(|(set, name)| set.then_some(name));
            if let Some(option) = option {
                return Err(EndpointError::TlsOptionWithoutTls {
                    option,
                    url: redact(&url),
                });
            }
        }
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err(EndpointError::HalfAClientCertificate);
        }
        Ok(Self {
            url,
            tls,
            pem: None,
            mode: Mode::Auto,
            sentinel,
        })
    }

    /// The same endpoint, known to be one node or a cluster instead of
    /// asking the server. A Sentinel URL is never a cluster.
    pub fn with_mode(mut self, mode: Mode) -> Result<Self, EndpointError> {
        if self.sentinel.is_some() && mode == Mode::Cluster {
            return Err(EndpointError::SentinelIsNotACluster {
                url: self.redacted(),
            });
        }
        self.mode = mode;
        Ok(self)
    }

    /// Whether the URL names Redis Sentinel nodes (`redis+sentinel://`).
    pub fn is_sentinel(&self) -> bool {
        self.sentinel.is_some()
    }

    /// One node, a cluster, or ask.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The same endpoint with TLS material given in memory instead of files.
    pub fn with_pem(mut self, pem: Pem) -> Self {
        self.pem = Some(pem);
        self
    }

    /// What a failure to reach this endpoint means for a person
    /// ([`describe`]), and, for a TLS URL that timed out, that the server
    /// may not speak TLS: a `rediss://` URL pointed at a plain port waits
    /// for a handshake that never comes.
    pub fn describe(&self, error: &RedisError) -> String {
        let text = describe(error);
        if self.is_sentinel() && error.code() == Some("READONLY") {
            format!(
                "the node the sentinels named is now a replica (a failover): the sentinels are asked again ({error})"
            )
        } else if self.is_tls() && error.is_timeout() {
            format!(
                "{text} (a rediss:// URL: is this port TLS? A plain Redis never answers the TLS handshake)"
            )
        } else {
            text
        }
    }

    /// The URL with its password hidden, for messages.
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }

    /// The TLS options.
    pub fn tls(&self) -> &Tls {
        &self.tls
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        match &self.sentinel {
            Some(s) => s.tls,
            None => self.url.starts_with("rediss://"),
        }
    }

    /// `text` without any password of the URL.
    fn scrub(&self, text: &str) -> String {
        scrub(text, &self.url)
    }

    /// The URL as redis-rs reads it: the opt-out of verification is its
    /// fragment `#insecure`.
    fn client_url(&self) -> String {
        match redis::parse_redis_url(&self.url) {
            Some(mut parsed) if self.tls.insecure_skip_verify => {
                parsed.set_fragment(Some("insecure"));
                parsed.to_string()
            }
            _ => self.url.clone(),
        }
    }

    /// The CA and client certificate to use, read from their files now.
    fn certificates(&self) -> RedisResult<Option<TlsCertificates>> {
        if !self.is_tls() {
            return Ok(None);
        }
        if let Some(pem) = &self.pem {
            return Ok(Some(TlsCertificates {
                client_tls: pem.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                root_cert: pem.ca.clone(),
            }));
        }
        if self.tls.ca_file.is_none() && self.tls.client_cert.is_none() {
            return Ok(None);
        }
        let read = |what: &str, path: &Path| {
            std::fs::read(path).map_err(|e| {
                RedisError::from(std::io::Error::new(
                    e.kind(),
                    format!("cannot read {what} {}: {e}", path.display()),
                ))
            })
        };
        let root_cert = match &self.tls.ca_file {
            Some(p) => Some(read("--redis-ca-file", p)?),
            None => None,
        };
        let client_tls = match (&self.tls.client_cert, &self.tls.client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read("--redis-client-cert", cert)?,
                client_key: read("--redis-client-key", key)?,
            }),
            _ => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// A client for one node, reading the certificate files now. A
    /// Sentinel URL names no one node: [`Endpoint::connect`] finds it.
    pub fn client(&self) -> RedisResult<redis::Client> {
        if self.is_sentinel() {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a redis+sentinel:// URL names no single node; connect() asks the sentinels",
            )));
        }
        self.client_for(&self.client_url())
    }

    /// A client for `url` (one node: a sentinel, the primary they name, or
    /// the node of a plain URL) with this endpoint's TLS material.
    fn client_for(&self, url: &str) -> RedisResult<redis::Client> {
        let client = match self.certificates()? {
            Some(c) => redis::Client::build_with_tls(url, c),
            None => redis::Client::open(url),
        };
        client.map_err(|e| scrub_error(e, &self.url))
    }

    /// A connection with these timeouts: to the node, or to the cluster the
    /// node belongs to (see [`Mode`]).
    pub async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Connection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        if let Some(sentinels) = &self.sentinel {
            let c = SentinelConnection::connect(
                self.clone(),
                sentinels.clone(),
                config,
                connect_timeout,
            )
            .await?;
            return Ok(Connection::Sentinel(c));
        }
        if self.mode != Mode::Cluster {
            let mut node = self
                .client()?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            if self.mode == Mode::Standalone || !cluster_enabled(&mut node).await? {
                return Ok(Connection::Node(node));
            }
        }
        let mut builder = ClusterClientBuilder::new(vec![self.client_url()])
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout);
        if let Some(certificates) = self.certificates()? {
            builder = builder.certs(certificates);
        }
        let cluster = builder
            .build()
            .map_err(|e| scrub_error(e, &self.url))?
            .get_async_connection()
            .await?;
        Ok(Connection::Cluster(cluster))
    }
}

/// Whether the node runs in cluster mode. A server that refuses `INFO`
/// (some managed offerings rename it) is taken for a single node; say
/// `cluster` explicitly there.
async fn cluster_enabled(node: &mut MultiplexedConnection) -> RedisResult<bool> {
    match redis::cmd("INFO")
        .arg("cluster")
        .query_async::<String>(node)
        .await
    {
        Ok(info) => Ok(info.lines().any(|line| line.trim() == "cluster_enabled:1")),
        Err(e)
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::ResponseError | redis::ServerErrorKind::NoPerm
                )
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// What a connection error means for a person: certificate problems are
/// named, since they are fixed differently from an unreachable server.
pub fn describe(error: &RedisError) -> String {
    let text = error.to_string();
    let hint = [
        (
            "UnknownIssuer",
            "the server's certificate is not signed by a trusted CA (check --redis-ca-file)",
        ),
        (
            "NotValidForName",
            "the server's certificate does not name the host in --redis-url",
        ),
        ("Expired", "the server's certificate has expired"),
        ("NotValidYet", "the server's certificate is not valid yet"),
        (
            "CertificateRequired",
            "the server wants a client certificate (--redis-client-cert and --redis-client-key)",
        ),
        (
            "BadCertificate",
            "the server refused the client certificate",
        ),
        (
            "UnknownCA",
            "the server does not trust the client certificate's CA",
        ),
        ("InvalidCertificate", "the server's certificate was refused"),
    ]
    .into_iter()
    .find(|(needle, _)| text.contains(needle))
    .map(|(_, hint)| hint);
    if let Some(hint) = hint {
        return format!("TLS: {hint}: {text}");
    }
    if let Some(refused) = refused(error) {
        return format!("{refused} ({text})");
    }
    // Answers of the server that are not about the job: what they mean
    // and what to do.
    let code = match error.kind() {
        redis::ErrorKind::AuthenticationFailed => "WRONGPASS",
        _ => error.code().unwrap_or_default(),
    };
    let meaning = match code {
        "OOM" => Some(
            "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction): jobs cannot \
             be taken, settled or enqueued until memory is freed or maxmemory is raised",
        ),
        "WRONGPASS" | "NOAUTH" => {
            Some("Redis refused the credentials: check the user and password in the Redis URL")
        }
        "READONLY" => Some("this Redis is a read-only replica: point the URL at the primary"),
        "LOADING" => Some("Redis is loading its data set after a restart; it answers once loaded"),
        _ => None,
    };
    match meaning {
        Some(meaning) => format!("{meaning} ({text})"),
        None => text,
    }
}

/// What a Redis ACL refused, read from the server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A command, lower case as ACL rules spell it (`client|id` for a
    /// subcommand); `None` when the server did not say which.
    Command(Option<String>),
    /// A key outside the user's key patterns.
    Key,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Command(Some(command)) => write!(
                f,
                "the Redis user may not run {} (ACL): grant it with +{command}; \
                 docs/redis-acl.md lists what each component needs",
                command.replace('|', " ").to_ascii_uppercase()
            ),
            Refused::Command(None) => f.write_str(
                "the Redis user may not run a command workerpool needs (ACL): \
                 docs/redis-acl.md lists what each component needs",
            ),
            Refused::Key => f.write_str(
                "the Redis user may not touch a key of the queue (ACL): its key patterns \
                 must cover the queue's name and every key under it (~<queue> ~<queue>:*); \
                 see docs/redis-acl.md",
            ),
        }
    }
}

/// What a Redis ACL refused, if `error` is such a refusal: a command or
/// a key refused to the user (`NOPERM`), or refused to a script it runs
/// (Redis 7.0 answers `ERR The user executing the script can't…` there;
/// the command is then found from the script's line it names, see
/// [`crate::scripts::command_at`]).
pub fn refused(error: &RedisError) -> Option<Refused> {
    let text = error.to_string();
    let in_script = text.contains("The user executing the script can't");
    // A transaction whose EXEC the ACL refuses is discarded, with the
    // refusal quoted: `EXECABORT Transaction discarded because of: NOPERM …`.
    let at_exec = error.code() == Some("EXECABORT") && text.contains("NOPERM");
    if error.code() != Some("NOPERM") && !in_script && !at_exec {
        return None;
    }
    if text.contains("permissions to access") || text.contains("can't access") {
        return Some(Refused::Key);
    }
    let named = text
        .split_once("permissions to run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_ascii_lowercase());
    let traced = || {
        let (_, rest) = text.split_once("script: ")?;
        let (sha, rest) = rest.split_once(',')?;
        let (_, line) = rest.split_once("@user_script:")?;
        let line: String = line.chars().take_while(char::is_ascii_digit).collect();
        crate::scripts::command_at(sha.trim(), line.parse().ok()?)
    };
    Some(Refused::Command(named.or_else(traced)))
}

/// The URL with its passwords replaced, for messages, logs and status:
/// the one in its user part, and a Sentinel URL's `sentinel_password`.
///
/// A value that is not a URL at all (no `scheme://`) is not shown: it may
/// be any secret at all, such as the wrong key of a Secret (a token, a
/// password), and only its length is said.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!(
            "<a value of {} characters that is not a URL, not shown>",
            url.chars().count()
        );
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let path = redact_query(path);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// `sentinel_password=…` of a query hidden.
fn redact_query(path: &str) -> String {
    let Some((before, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.ends_with("password") => format!("{key}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{before}?{}", query.join("&"))
}

/// `text` with the URL's passwords removed, should an error quote them.
fn scrub(text: &str, url: &str) -> String {
    passwords(url)
        .into_iter()
        .fold(text.to_string(), |text, p| text.replace(p, "***"))
}

fn scrub_error(error: RedisError, url: &str) -> RedisError {
    let text = error.to_string();
    if passwords(url).iter().any(|p| text.contains(p)) {
        RedisError::from((
            error.kind(),
            "invalid Redis connection settings",
            scrub(&text, url),
        ))
    } else {
        error
    }
}

/// The URL's non-empty passwords: its user part's, and a Sentinel URL's
/// `sentinel_password`.
fn passwords(url: &str) -> Vec<&str> {
    let mut found = sentinel::Sentinels::secrets(url);
    let user_part = url.split_once("://").and_then(|(_, rest)| {
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let credentials = authority.rsplit_once('@')?.0;
        credentials.split_once(':').map(|(_, p)| p)
    });
    found.extend(user_part);
    found.retain(|p| !p.is_empty());
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_discarded_for_a_refused_exec_is_a_refusal_naming_exec() {
        let reply = |text: &str| -> RedisError {
            redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
                .and_then(|v| v.extract_error())
                .expect_err("an error reply")
        };
        let refused_exec = reply(
            "EXECABORT Transaction discarded because of: NOPERM this user has no permissions to run the 'exec' command",
        );
        assert_eq!(
            refused(&refused_exec),
            Some(Refused::Command(Some("exec".into())))
        );
        let other = reply("EXECABORT Transaction discarded because of previous errors.");
        assert_eq!(refused(&other), None);
    }

    #[test]
    fn passwords_are_hidden_and_everything_else_is_kept() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("redis://:secret@host"), "redis://:***@host");
        assert_eq!(redact("redis://host:6379/2"), "redis://host:6379/2");
        assert_eq!(
            redact("eyJhbGciOiJSUzI1NiJ9.token"),
            "<a value of 26 characters that is not a URL, not shown>"
        );
        assert_eq!(
            scrub("bad thing near s3cret", "redis://u:s3cret@h"),
            "bad thing near ***"
        );
    }

    #[test]
    fn sentinel_urls_hide_both_passwords() {
        let url = "redis+sentinel://app:pw1@s1:26379,s2:26380/mymaster/2?sentinel_username=sen&sentinel_password=pw2";
        let shown = redact(url);
        assert_eq!(
            shown,
            "redis+sentinel://app:***@s1:26379,s2:26380/mymaster/2?sentinel_username=sen&sentinel_password=***"
        );
        assert_eq!(
            redact("rediss+sentinel://s1/m?sentinel_password=pw2"),
            "rediss+sentinel://s1/m?sentinel_password=***"
        );
        assert_eq!(
            redact("redis+sentinel://:pw1@s1?sentinel_password=pw2"),
            "redis+sentinel://:***@s1?sentinel_password=***"
        );
        assert_eq!(scrub("pw1 and pw2", url), "*** and ***");
        let e = Endpoint::new(url, Tls::default()).expect("valid");
        assert_eq!(e.redacted(), shown);
        let debug = format!("{e:?}");
        assert!(!debug.contains("pw1") && !debug.contains("pw2"), "{debug}");
        let bad = "redis+sentinel://app:pw1@s1:nope/m?sentinel_password=pw2";
        let error = Endpoint::new(bad, Tls::default())
            .expect_err("bad port")
            .to_string();
        assert!(!error.contains("pw1") && !error.contains("pw2"), "{error}");
        assert!(error.contains("is not a port number"), "{error}");
        assert!(
            error.contains("redis+sentinel://[[user]:password@]"),
            "{error}"
        );
    }

    #[test]
    fn sentinel_urls_take_the_tls_options_of_a_tls_scheme_and_no_cluster_mode() {
        let ca = Tls {
            ca_file: Some("/ca.pem".into()),
            ..Tls::default()
        };
        let tls = Endpoint::new("rediss+sentinel://s1/m", ca.clone()).expect("tls");
        assert!(tls.is_tls() && tls.is_sentinel());
        assert_eq!(
            Endpoint::new("redis+sentinel://s1/m", ca),
            Err(EndpointError::TlsOptionWithoutTls {
                option: "--redis-ca-file",
                url: "redis+sentinel://s1/m".into()
            })
        );
        let plain = Endpoint::new("redis+sentinel://:pw@s1/m", Tls::default()).expect("plain");
        assert!(!plain.is_tls());
        assert!(plain.client().is_err(), "no single node to open");
        assert_eq!(
            plain.clone().with_mode(Mode::Cluster),
            Err(EndpointError::SentinelIsNotACluster {
                url: "redis+sentinel://:***@s1/m".into()
            })
        );
        assert!(plain.with_mode(Mode::Standalone).is_ok());
    }

    #[test]
    fn tls_options_need_a_tls_url_and_client_certificates_come_in_pairs() {
        let ca = Tls {
            ca_file: Some("/ca.pem".into()),
            ..Tls::default()
        };
        assert_eq!(
            Endpoint::new("redis://:pw@h:6379", ca.clone()),
            Err(EndpointError::TlsOptionWithoutTls {
                option: "--redis-ca-file",
                url: "redis://:***@h:6379".into()
            })
        );
        assert!(Endpoint::new("rediss://h:6380", ca).is_ok());
        let half = Tls {
            client_cert: Some("/c.pem".into()),
            ..Tls::default()
        };
        assert_eq!(
            Endpoint::new("rediss://h", half),
            Err(EndpointError::HalfAClientCertificate)
        );
        let e = Endpoint::new("http://u:pw@h", Tls::default()).expect_err("not redis");
        assert!(!e.to_string().contains("pw@"), "{e}");
        assert!(Endpoint::new("redis://h:6379/0", Tls::default()).is_ok());
    }

    #[test]
    fn skipping_verification_reaches_the_client_as_its_insecure_flag() {
        for url in ["rediss://h:6380", "rediss://h:6380/2"] {
            let tls = Tls {
                insecure_skip_verify: true,
                ..Tls::default()
            };
            let client = Endpoint::new(url, tls)
                .expect("valid")
                .client()
                .expect("client");
            assert!(
                matches!(
                    client.get_connection_info().addr(),
                    redis::ConnectionAddr::TcpTls { insecure: true, .. }
                ),
                "{url}"
            );
        }
        let client = Endpoint::new("rediss://h:6380/2", Tls::default())
            .expect("valid")
            .client()
            .expect("client");
        assert!(matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls {
                insecure: false,
                ..
            }
        ));
    }

    #[test]
    fn a_debug_print_never_shows_the_password() {
        let e = Endpoint::new("redis://u:hunter2@h", Tls::default()).expect("valid");
        assert!(!format!("{e:?}").contains("hunter2"));
    }

    #[test]
    fn certificate_problems_are_named() {
        let e = RedisError::from(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(
            describe(&e).starts_with("TLS: the server's certificate is not signed by a trusted CA")
        );
    }
}
