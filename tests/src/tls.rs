//! A throwaway `redis-server` that speaks only TLS, with a CA, server and
//! client certificates made by `openssl` for each test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, redis_server};

/// Certificate files in PEM.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// Another CA, which signed nothing here.
    pub other_ca: PathBuf,
    /// The server's certificate (for 127.0.0.1 and localhost) and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate signed by `ca`.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl must be installed (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

fn ca(dir: &Path, name: &str) {
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
    args.extend(EC);
    let (key, crt, subj) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN={name}"),
    );
    args.extend(["-keyout", &key, "-out", &crt, "-subj", &subj]);
    openssl(dir, &args);
}

fn signed(dir: &Path, name: &str, extensions: &str) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), extensions).expect("extensions file");
    let subj = format!("/CN={name}");
    let mut args = vec!["req", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ],
    );
}

impl Certificates {
    /// Makes a CA, a server certificate for 127.0.0.1, a client
    /// certificate, and an unrelated CA in `dir`.
    pub fn make(dir: &Path) -> Self {
        Self::make_for(dir, &[])
    }

    /// The same, with the server certificate also valid for `ips`.
    pub fn make_for(dir: &Path, ips: &[&str]) -> Self {
        ca(dir, "ca");
        ca(dir, "other-ca");
        let mut names = String::from("IP:127.0.0.1,DNS:localhost");
        for ip in ips {
            names.push_str(&format!(",IP:{ip}"));
        }
        signed(
            dir,
            "server",
            &format!("subjectAltName={names}\nextendedKeyUsage=serverAuth\n"),
        );
        signed(dir, "client", "extendedKeyUsage=clientAuth\n");
        Self {
            ca: dir.join("ca.crt"),
            other_ca: dir.join("other-ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }
}

/// A `redis-server` listening only on a TLS port of 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct TestTlsRedis {
    port: u16,
    dir: tempfile::TempDir,
    /// The certificates it was started with.
    pub certs: Certificates,
    child: Child,
}

impl TestTlsRedis {
    /// Starts one; with `mutual`, clients must present a certificate
    /// signed by the CA.
    pub fn start(mutual: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let certs = Certificates::make(dir.path());
        let port = free_port();
        let child = spawn_tls(dir.path(), &certs, port, mutual);
        let mut redis = Self {
            port,
            dir,
            certs,
            child,
        };
        // A port found free can be taken before the server binds it (by
        // another test's client socket): the server then exits, and starts
        // again on another port.
        for _ in 0..5 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if redis.ping() {
                    return redis;
                }
                if let Ok(Some(_)) = redis.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = redis.child.kill();
            let _ = redis.child.wait();
            redis.port = free_port();
            redis.child = spawn_tls(redis.dir.path(), &redis.certs, redis.port, mutual);
        }
        let said = std::fs::read_to_string(redis.dir.path().join("redis.log")).unwrap_or_default();
        panic!("TLS redis-server did not start on 5 ports; its log:\n{said}");
    }

    fn ping(&self) -> bool {
        self.client()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// `rediss://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0", self.port)
    }

    /// The directory it keeps its files (and certificates) in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client that trusts the CA and presents the client certificate.
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        let read = |p: &Path| std::fs::read(p).expect("certificate file");
        redis::Client::build_with_tls(
            self.url(),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: read(&self.certs.client_cert),
                    client_key: read(&self.certs.client_key),
                }),
                root_cert: Some(read(&self.certs.ca)),
            },
        )
    }

    /// An async connection to it.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .expect("tls client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis over TLS")
    }
}

/// A TLS-only `redis-server` on `port` of 127.0.0.1, logging into `dir`.
fn spawn_tls(dir: &Path, certs: &Certificates, port: u16, mutual: bool) -> Child {
    Command::new(redis_server())
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--tls-cert-file")
        .arg(&certs.server_cert)
        .arg("--tls-key-file")
        .arg(&certs.server_key)
        .arg("--tls-ca-cert-file")
        .arg(&certs.ca)
        .args(["--tls-auth-clients", if mutual { "yes" } else { "no" }])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)")
}

impl Drop for TestTlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
