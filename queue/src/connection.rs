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

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ClientTlsConfig, RedisError, RedisResult, TlsCertificates};

/// TLS options beside a `rediss://` URL.
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
        "--redis-url {url}: {reason}; expected redis://[user:password@]host[:port][/db] or rediss://… for TLS"
    )]
    Url {
        /// The URL, password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// TLS options beside a plain URL.
    #[error(
        "{option} is a TLS option but --redis-url {url} is plain redis://; use rediss:// to connect with TLS"
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
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &redact(&self.url))
            .field("tls", &self.tls)
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
        let info = redis::parse_redis_url(&url)
            .ok_or_else(|| bad("not a URL".into()))
            .and_then(|u| {
                redis::IntoConnectionInfo::into_connection_info(u)
                    .map_err(|e| bad(scrub(&e.to_string(), &url)))
            })?;
        let is_tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
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
        })
    }

    /// The same endpoint with TLS material given in memory instead of files.
    pub fn with_pem(mut self, pem: Pem) -> Self {
        self.pem = Some(pem);
        self
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
        self.url.starts_with("rediss://")
    }

    /// A client for this endpoint, reading the certificate files now.
    pub fn client(&self) -> RedisResult<redis::Client> {
        // redis-rs reads the opt-out as the URL fragment `#insecure`.
        let url = match redis::parse_redis_url(&self.url) {
            Some(mut parsed) if self.tls.insecure_skip_verify => {
                parsed.set_fragment(Some("insecure"));
                parsed.to_string()
            }
            _ => self.url.clone(),
        };
        let in_memory = self
            .pem
            .as_ref()
            .filter(|_| self.is_tls())
            .map(|pem| TlsCertificates {
                client_tls: pem.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                root_cert: pem.ca.clone(),
            });
        let certificates = if in_memory.is_some() {
            in_memory
        } else if self.is_tls() && (self.tls.ca_file.is_some() || self.tls.client_cert.is_some()) {
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
            Some(TlsCertificates {
                client_tls,
                root_cert,
            })
        } else {
            None
        };
        let client = match certificates {
            Some(c) => redis::Client::build_with_tls(url.as_str(), c),
            None => redis::Client::open(url.as_str()),
        };
        client.map_err(|e| scrub_error(e, &self.url))
    }

    /// A multiplexed connection with these timeouts.
    pub async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        self.client()?
            .get_multiplexed_async_connection_with_config(&config)
            .await
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
    match hint {
        Some(hint) => format!("TLS: {hint}: {text}"),
        None => text,
    }
}

/// The URL with its password replaced, for messages, logs and status.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_string(),
    }
}

/// `text` with the URL's password removed, should an error quote it.
fn scrub(text: &str, url: &str) -> String {
    match password(url) {
        Some(p) if !p.is_empty() => text.replace(p, "***"),
        _ => text.to_string(),
    }
}

fn scrub_error(error: RedisError, url: &str) -> RedisError {
    match password(url) {
        Some(p) if !p.is_empty() && error.to_string().contains(p) => RedisError::from((
            error.kind(),
            "invalid Redis connection settings",
            scrub(&error.to_string(), url),
        )),
        _ => error,
    }
}

fn password(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let credentials = authority.rsplit_once('@')?.0;
    credentials.split_once(':').map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_everything_else_is_kept() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("redis://:secret@host"), "redis://:***@host");
        assert_eq!(redact("redis://host:6379/2"), "redis://host:6379/2");
        assert_eq!(
            scrub("bad thing near s3cret", "redis://u:s3cret@h"),
            "bad thing near ***"
        );
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
