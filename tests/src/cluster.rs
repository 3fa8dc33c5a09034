//! A throwaway Redis Cluster: `redis-server --cluster-enabled yes` nodes on
//! free loopback ports, joined with `redis-cli --cluster create`, killed on
//! drop. Each node also binds its port + 10000 for the cluster bus.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, redis_server};

/// One node of a [`TestRedisCluster`].
#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A Redis Cluster owned by one test.
#[derive(Debug)]
pub struct TestRedisCluster {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

/// What `CLUSTER NODES` says of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id.
    pub id: String,
    /// Its client port.
    pub port: u16,
    /// Whether it is a primary.
    pub primary: bool,
    /// Slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    /// Whether it serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

impl TestRedisCluster {
    /// Starts `primaries` primaries, each with `replicas` replicas, and
    /// waits until every node sees the cluster as ok.
    pub fn start(primaries: usize, replicas: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for the cluster");
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..primaries * (1 + replicas) {
            // A port found free can be taken before the node binds it (by
            // another test's client socket): the node then exits, and
            // starts again on other ports.
            let node = (0..5).find_map(|_| {
                let port = cluster_port();
                let mut child = cluster.spawn(port);
                if answers(port, &mut child) {
                    return Some(Node {
                        port,
                        child: Some(child),
                    });
                }
                let _ = child.kill();
                let _ = child.wait();
                None
            });
            cluster
                .nodes
                .push(node.expect("a cluster node did not start on 5 ports"));
        }
        let mut create = Command::new(redis_cli());
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install redis-server)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_until_ok();
        cluster
    }

    fn spawn(&self, port: u16) -> Child {
        Command::new(redis_server())
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--cluster-enabled", "yes"])
            .args(["--cluster-node-timeout", "1000"])
            .arg("--cluster-config-file")
            .arg(format!("nodes-{port}.conf"))
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)")
    }

    /// Waits until every running node reports `cluster_state:ok` and knows
    /// every slot.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info: String = self.query(n.port, redis::cmd("CLUSTER").arg("INFO"));
                info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:<port>` of node `n`.
    pub fn url(&self, n: usize) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[n].port)
    }

    /// Node indexes in start order.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of a running primary that does not serve `slot`.
    pub fn primary_not_owning(&self, slot: u16) -> usize {
        let nodes = self.nodes_info();
        self.nodes
            .iter()
            .position(|n| {
                n.child.is_some()
                    && nodes
                        .iter()
                        .any(|i| i.port == n.port && i.primary && !i.owns(slot))
            })
            .expect("a primary that does not serve the slot")
    }

    /// The index of the primary serving `slot`.
    pub fn owner(&self, slot: u16) -> usize {
        let info = self
            .nodes_info()
            .into_iter()
            .find(|i| i.primary && i.owns(slot))
            .expect("an owner of the slot");
        self.index_of(info.port)
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// `CLUSTER NODES`, as seen from a running node.
    pub fn nodes_info(&self) -> Vec<NodeInfo> {
        let port = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a running node")
            .port;
        let text: String = self.query(port, redis::cmd("CLUSTER").arg("NODES"));
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let address = fields.get(1)?;
                let port = address.split(['@', ':']).nth(1)?.parse().ok()?;
                let flags = fields.get(2)?;
                let slots = fields
                    .iter()
                    .skip(8)
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|x| (x, x)),
                    })
                    .collect();
                Some(NodeInfo {
                    id: fields.first()?.to_string(),
                    port,
                    primary: flags.contains("master") && !flags.contains("fail"),
                    slots,
                })
            })
            .collect()
    }

    /// Moves `slot` to primary `to` while clients keep using it, the way
    /// `redis-cli --cluster reshard` moves each slot: mark it importing and
    /// migrating, `MIGRATE` its keys in batches, then give it to `to`.
    /// Returns how many keys moved.
    pub fn move_slot(&self, slot: u16, to: usize) -> usize {
        let nodes = self.nodes_info();
        let source = nodes
            .iter()
            .find(|i| i.primary && i.owns(slot))
            .expect("the slot's owner")
            .clone();
        let target = nodes
            .iter()
            .find(|i| i.port == self.nodes[to].port)
            .expect("the target node")
            .clone();
        assert_ne!(source.id, target.id, "the slot is already there");
        let setslot = |port: u16, state: &str, id: &str| {
            let _: String = self.query(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(id),
            );
        };
        setslot(target.port, "IMPORTING", &source.id);
        setslot(source.port, "MIGRATING", &target.id);
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = self.query(
                source.port,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            );
            if keys.is_empty() {
                break;
            }
            moved += keys.len();
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(target.port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(keys);
            let _: String = self.query(source.port, &migrate);
        }
        setslot(target.port, "NODE", &target.id);
        setslot(source.port, "NODE", &target.id);
        for other in nodes
            .iter()
            .filter(|i| i.primary && i.id != source.id && i.id != target.id)
        {
            setslot(other.port, "NODE", &target.id);
        }
        moved
    }

    /// Promotes a replica of the primary serving `slot` (`CLUSTER FAILOVER`
    /// on the replica) and waits until it serves the slot. Returns the
    /// index of the new primary.
    pub fn fail_over(&self, slot: u16) -> usize {
        let nodes = self.nodes_info();
        let primary = nodes
            .iter()
            .find(|i| i.primary && i.owns(slot))
            .expect("the slot's owner")
            .clone();
        let replicas: Vec<String> = self.query(
            primary.port,
            redis::cmd("CLUSTER").arg("REPLICAS").arg(&primary.id),
        );
        let replica_port: u16 = replicas
            .iter()
            .find_map(|line| {
                let address = line.split_whitespace().nth(1)?;
                address.split(['@', ':']).nth(1)?.parse().ok()
            })
            .expect("the primary has a replica");
        let _: String = self.query(replica_port, redis::cmd("CLUSTER").arg("FAILOVER"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.nodes_info();
            if now
                .iter()
                .any(|i| i.port == replica_port && i.primary && i.owns(slot))
            {
                return self.index_of(replica_port);
            }
            assert!(Instant::now() < deadline, "the failover did not happen");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A synchronous command on node `n`.
    pub fn on_node<T: redis::FromRedisValue>(&self, n: usize, cmd: &redis::Cmd) -> T {
        self.query(self.nodes[n].port, cmd)
    }

    /// A synchronous command on node `port`.
    fn query<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> T {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("node url is valid");
        let mut c = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to a cluster node");
        cmd.query(&mut c).expect("cluster command")
    }

    /// A cluster connection for checks made by the test.
    pub async fn conn(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(vec![self.url(0)])
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("connect to the test cluster")
    }
}

impl Drop for TestRedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A free port whose cluster bus port (+10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn pings(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

/// Whether a node just started answers; `false` when it exited (its port
/// was taken) or stayed silent for 10 s.
fn answers(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if pings(port) {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The `redis-cli` next to [`redis_server`]: `$REDIS_CLI`, else on `PATH`.
pub fn redis_cli() -> std::path::PathBuf {
    std::env::var_os("REDIS_CLI")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("redis-cli"))
}
