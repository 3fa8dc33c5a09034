//! A throwaway Redis Sentinel setup: a primary, a replica of it and one to
//! three sentinels (`redis-server <conf> --sentinel`), each on a free
//! loopback port, killed on drop. The sentinels watch the primary under the
//! name [`MASTER`].

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, redis_server};

/// The name the sentinels know the primary by.
pub const MASTER: &str = "mymaster";

/// Passwords of a [`TestRedisSentinel`].
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// `requirepass` of the primary and the replica.
    pub password: Option<String>,
    /// `requirepass` of the sentinels.
    pub sentinel_password: Option<String>,
}

/// One process of the setup.
#[derive(Debug)]
struct Process {
    port: u16,
    child: Option<Child>,
}

/// A primary, a replica and sentinels owned by one test.
#[derive(Debug)]
pub struct TestRedisSentinel {
    nodes: Vec<Process>,
    sentinels: Vec<Process>,
    auth: Auth,
    dir: tempfile::TempDir,
}

impl TestRedisSentinel {
    /// Starts a primary, a replica and `sentinels` sentinels (a majority
    /// quorum), and waits until every sentinel knows the replica.
    pub fn start(sentinels: usize) -> Self {
        Self::start_with(sentinels, Auth::default())
    }

    /// [`TestRedisSentinel::start`] with passwords.
    pub fn start_with(sentinels: usize, auth: Auth) -> Self {
        assert!((1..=3).contains(&sentinels), "one to three sentinels");
        let dir = tempfile::tempdir().expect("temp dir for the sentinel setup");
        let mut setup = Self {
            nodes: Vec::new(),
            sentinels: Vec::new(),
            auth,
            dir,
        };
        let primary = setup.start_node(None);
        setup.nodes.push(primary);
        let primary_port = setup.nodes[0].port;
        let replica = setup.start_node(Some(primary_port));
        setup.nodes.push(replica);
        setup.wait_for_link(setup.nodes[1].port);
        let quorum = sentinels / 2 + 1;
        for _ in 0..sentinels {
            let sentinel = setup.start_sentinel(primary_port, quorum);
            setup.sentinels.push(sentinel);
        }
        setup.wait_until_ready();
        setup
    }

    /// Starts a data node; with `primary`, as its replica.
    fn start_node(&self, primary: Option<u16>) -> Process {
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(redis_server());
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--dbfilename")
                .arg(format!("dump-{port}.rdb"));
            if let Some(password) = &self.auth.password {
                cmd.args(["--requirepass", password, "--masterauth", password]);
            }
            if let Some(primary) = primary {
                cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
            }
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("redis-server must be installed (apt-get install redis-server)");
            if answers(port, self.auth.password.as_deref(), &mut child) {
                return Process {
                    port,
                    child: Some(child),
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("a redis-server did not start on 5 ports");
    }

    fn start_sentinel(&self, primary: u16, quorum: usize) -> Process {
        for _ in 0..5 {
            let port = free_port();
            let conf = self.dir.path().join(format!("sentinel-{port}.conf"));
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 10000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                dir = self.dir.path().display()
            );
            if let Some(password) = &self.auth.password {
                text.push_str(&format!("sentinel auth-pass {MASTER} {password}\n"));
            }
            if let Some(password) = &self.auth.sentinel_password {
                text.push_str(&format!(
                    "requirepass {password}\nsentinel sentinel-pass {password}\n"
                ));
            }
            std::fs::write(&conf, text).expect("write the sentinel's configuration");
            let mut child = Command::new(redis_server())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("redis-server must be installed (apt-get install redis-server)");
            if answers(port, self.auth.sentinel_password.as_deref(), &mut child) {
                return Process {
                    port,
                    child: Some(child),
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("a sentinel did not start on 5 ports");
    }

    /// Waits until the replica at `port` is in sync with its primary.
    fn wait_for_link(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: String = self.on_node(port, redis::cmd("INFO").arg("replication"));
            if info.contains("master_link_status:up") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not sync: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every sentinel names the primary and knows the replica
    /// (and, with several, the other sentinels): a failover can then pick it.
    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let others = self.sentinels.len() - 1;
        loop {
            let ready = self.sentinels.iter().all(|s| {
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    self.on_sentinel(s.port, redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER));
                let master: std::collections::HashMap<String, String> =
                    self.on_sentinel(s.port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER));
                let known_sentinels: usize = master
                    .get("num-other-sentinels")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                known_sentinels >= others
                    && replicas.iter().any(|r| {
                        r.get("flags").is_some_and(|f| f == "slave")
                            && r.get("master-link-status").is_some_and(|l| l == "ok")
                    })
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis+sentinel://[:password@]127.0.0.1:<p1>,…/mymaster/0`, with the
    /// sentinels' password as `sentinel_password` when they have one.
    pub fn url(&self) -> String {
        let credentials = self
            .auth
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let query = self
            .auth
            .sentinel_password
            .as_ref()
            .map(|p| format!("?sentinel_password={p}"))
            .unwrap_or_default();
        format!(
            "redis+sentinel://{credentials}{}/{MASTER}/0{query}",
            hosts.join(",")
        )
    }

    /// The data nodes' ports: the first primary, then its replica.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The sentinels' ports, in start order.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The port of the primary as the first running sentinel names it.
    pub fn primary_port(&self) -> u16 {
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.child.is_some())
            .expect("a running sentinel");
        let (_, port): (String, u16) = self.on_sentinel(
            sentinel.port,
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER),
        );
        port
    }

    /// `redis://[:password@]127.0.0.1:<port>/0` of the node at `port`.
    pub fn node_url(&self, port: u16) -> String {
        let credentials = self
            .auth
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        format!("redis://{credentials}127.0.0.1:{port}/0")
    }

    /// A connection to the current primary, for checks made by the test.
    pub async fn primary(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.node_url(self.primary_port()))
            .expect("node url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the primary")
    }

    /// Makes a sentinel promote the replica (`SENTINEL FAILOVER`), and waits
    /// until every running sentinel names it and it answers as the primary.
    /// Returns its port.
    pub fn fail_over(&self) -> u16 {
        let old = self.primary_port();
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.child.is_some())
            .expect("a running sentinel")
            .port;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // NOGOODSLAVE until the sentinel has fresh news of the replica.
            let asked = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER)
                .query::<String>(
                    &mut self.connect(sentinel, self.auth.sentinel_password.as_deref()),
                );
            match asked {
                Ok(_) => break,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "SENTINEL FAILOVER was refused: {e}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_for_new_primary(old)
    }

    /// Kills the primary (SIGKILL); the sentinels notice after their
    /// down-after window (1 s) and promote the replica. Waits for that and
    /// returns the new primary's port.
    pub fn kill_primary(&mut self) -> u16 {
        let old = self.primary_port();
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == old)
            .expect("the primary is one of the nodes");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.wait_for_new_primary(old)
    }

    fn wait_for_new_primary(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let named: Vec<u16> = self
                .sentinels
                .iter()
                .filter(|s| s.child.is_some())
                .map(|s| {
                    let (_, port): (String, u16) = self.on_sentinel(
                        s.port,
                        redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(MASTER),
                    );
                    port
                })
                .collect();
            if let Some(&new) = named.first()
                && new != old
                && named.iter().all(|p| *p == new)
            {
                let role: Vec<redis::Value> = self.on_node(new, &redis::cmd("ROLE"));
                if role.first() == Some(&redis::Value::BulkString(b"master".to_vec())) {
                    return new;
                }
            }
            assert!(Instant::now() < deadline, "the failover did not happen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A synchronous command on the data node at `port`.
    pub fn on_node<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connect(port, self.auth.password.as_deref()))
            .expect("node command")
    }

    /// A synchronous command on the sentinel at `port`.
    pub fn on_sentinel<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connect(port, self.auth.sentinel_password.as_deref()))
            .expect("sentinel command")
    }

    fn connect(&self, port: u16, password: Option<&str>) -> redis::Connection {
        redis::Client::open(url(port, password))
            .expect("valid url")
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to a test node")
    }

    /// The directory the processes keep their files in.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for TestRedisSentinel {
    fn drop(&mut self) {
        for p in self.sentinels.iter_mut().chain(self.nodes.iter_mut()) {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn url(port: u16, password: Option<&str>) -> String {
    match password {
        Some(p) => format!("redis://:{p}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    }
}

/// Whether a process just started answers `PING`; `false` when it exited
/// (its port was taken) or stayed silent for 10 s.
fn answers(port: u16, password: Option<&str>, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let pong = redis::Client::open(url(port, password))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
