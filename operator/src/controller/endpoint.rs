//! Where a pool's Redis is: the endpoint from the spec and its Secrets,
//! and the connections kept per endpoint.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use workerpool_queue::connection::{Connection, Endpoint, Pem, Tls, redact};

use super::{Context, QueueProblem, lock};
use crate::crd::WorkerPool;

/// How long one queue read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

impl Context {
    pub(super) async fn redis_conn(&self, endpoint: &Endpoint) -> Result<Connection, QueueProblem> {
        if let Some(c) = lock(&self.redis).get(endpoint).cloned() {
            return Ok(c);
        }
        let c = endpoint
            .connect(READ_TIMEOUT, READ_TIMEOUT)
            .await
            .map_err(|e| unreachable_problem(endpoint, &e))?;
        lock(&self.redis).insert(endpoint.clone(), c.clone());
        Ok(c)
    }
}

/// A failed read of the queue, naming where it was read (the password
/// masked), as the CLI does. A command or key the Redis ACL refuses is
/// `RedisPermissionDenied`, naming the command.
pub(super) fn unreachable_problem(endpoint: &Endpoint, e: &redis::RedisError) -> QueueProblem {
    QueueProblem {
        reason: if workerpool_queue::connection::refused(e).is_some() {
            "RedisPermissionDenied"
        } else {
            "RedisUnreachable"
        },
        message: format!(
            "cannot read the queue at {}: {}",
            endpoint.redacted(),
            endpoint.describe(e)
        ),
    }
}

/// Where the pool's Redis is and how to reach it: the URL from the spec or
/// its Secret, and the TLS material from the Secrets `spec.queue.redis.tls`
/// names.
pub(super) async fn redis_endpoint(
    pool: &WorkerPool,
    client: &Client,
) -> Result<Endpoint, QueueProblem> {
    let redis = &pool.spec.queue.redis;
    // Where the URL came from, for messages: a URL from a Secret is never
    // echoed, not even masked, since the key named may hold any secret at
    // all (a token, another password) readable only through the pool.
    let mut from_secret = None;
    let url = match (&redis.url, &redis.url_secret_ref) {
        (Some(url), _) => url.clone(),
        (None, Some(r)) => {
            from_secret = Some(format!(
                "the value of key {:?} of Secret {:?} (spec.queue.redis.urlSecretRef; not shown)",
                r.key, r.name
            ));
            let bytes = secret_value(
                pool,
                client,
                &r.name,
                &r.key,
                "spec.queue.redis.urlSecretRef",
            )
            .await?;
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        (None, None) => {
            return Err(QueueProblem {
                reason: "InvalidSpec",
                message: "set spec.queue.redis.url or spec.queue.redis.urlSecretRef".into(),
            });
        }
    };
    let tls = redis.tls.clone().unwrap_or_default();
    let options = Tls {
        insecure_skip_verify: tls.insecure_skip_verify,
        ..Tls::default()
    };
    if redis.tls.is_some()
        && !url.starts_with("rediss://")
        && !url.starts_with("rediss+sentinel://")
    {
        return Err(QueueProblem {
            reason: "InvalidRedisURL",
            message: format!(
                "spec.queue.redis.tls is set but the Redis URL {} is plain redis://; use rediss:// (rediss+sentinel:// for Redis Sentinel)",
                from_secret.clone().unwrap_or_else(|| redact(&url))
            ),
        });
    }
    let endpoint = Endpoint::new(url, options)
        .and_then(|e| e.with_mode(redis.mode.unwrap_or_default().into()))
        .map_err(|e| QueueProblem {
            reason: "InvalidRedisURL",
            message: match &from_secret {
                Some(source) => format!(
                    "{source} is not a Redis URL: expected redis://[user:password@]host[:port][/db], rediss://… for TLS, or redis+sentinel://… for Redis Sentinel"
                ),
                None => format!("spec.queue.redis: {e}"),
            },
        })?;
    let mut pem = Pem::default();
    if let Some(r) = &tls.ca_secret_ref {
        pem.ca = Some(
            secret_value(
                pool,
                client,
                &r.name,
                &r.key,
                "spec.queue.redis.tls.caSecretRef",
            )
            .await?,
        );
    }
    if let Some(r) = &tls.client_certificate_secret_ref {
        let what = "spec.queue.redis.tls.clientCertificateSecretRef";
        let cert = secret_value(pool, client, &r.name, "tls.crt", what).await?;
        let key = secret_value(pool, client, &r.name, "tls.key", what).await?;
        pem.client = Some((cert, key));
    }
    Ok(if pem == Pem::default() {
        endpoint
    } else {
        endpoint.with_pem(pem)
    })
}

/// A key of a Secret in the pool's namespace, named in the spec at `what`.
pub(super) async fn secret_value(
    pool: &WorkerPool,
    client: &Client,
    name: &str,
    key: &str,
    what: &str,
) -> Result<Vec<u8>, QueueProblem> {
    let namespace = pool.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets.get_opt(name).await.map_err(|e| QueueProblem {
        reason: "SecretUnreadable",
        message: format!("cannot read Secret {name:?}: {e}"),
    })?;
    let Some(secret) = secret else {
        return Err(QueueProblem {
            reason: "SecretNotFound",
            message: format!(
                "Secret {name:?} named in {what} does not exist in namespace {namespace:?}"
            ),
        });
    };
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .ok_or_else(|| QueueProblem {
            reason: "SecretKeyNotFound",
            message: format!("Secret {name:?} named in {what} has no key {key:?}"),
        })
}
