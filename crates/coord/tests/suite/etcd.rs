//! Starts etcd servers for a test: one, or a cluster of several on loopback, each in its own
//! data folder, killed when the test ends. Fast elections (50 ms heartbeats, 500 ms election
//! timeout) keep quorum tests short.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_coord::session::{MemberRecord, Session};
use strata_coord::Coord;

pub struct Etcd {
    dir: tempfile::TempDir,
    names: Vec<String>,
    client_urls: Vec<String>,
    peer_urls: Vec<String>,
    children: Vec<Option<Child>>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("a free loopback port")
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    pub fn single() -> Etcd {
        Etcd::cluster(1)
    }

    pub fn cluster(nodes: usize) -> Etcd {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let names = (0..nodes).map(|i| format!("node{i}")).collect();
        let client_urls = (0..nodes)
            .map(|_| format!("http://127.0.0.1:{}", free_port()))
            .collect();
        let peer_urls = (0..nodes)
            .map(|_| format!("http://127.0.0.1:{}", free_port()))
            .collect();
        let mut etcd = Etcd {
            dir,
            names,
            client_urls,
            peer_urls,
            children: (0..nodes).map(|_| None).collect(),
        };
        for node in 0..nodes {
            etcd.start(node);
        }
        etcd
    }

    fn data_dir(&self, node: usize) -> PathBuf {
        self.dir.path().join(&self.names[node])
    }

    /// Starts (or restarts, on its data folder) one node.
    pub fn start(&mut self, node: usize) {
        assert!(self.children[node].is_none(), "node {node} is running");
        let initial_cluster: Vec<String> = self
            .names
            .iter()
            .zip(&self.peer_urls)
            .map(|(name, url)| format!("{name}={url}"))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", self.names[node])))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--name")
            .arg(&self.names[node])
            .arg("--data-dir")
            .arg(self.data_dir(node))
            .args(["--listen-client-urls", &self.client_urls[node]])
            .args(["--advertise-client-urls", &self.client_urls[node]])
            .args(["--listen-peer-urls", &self.peer_urls[node]])
            .args(["--initial-advertise-peer-urls", &self.peer_urls[node]])
            .args(["--initial-cluster", &initial_cluster.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "strata-test"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (Debian's etcd-server; test.sh installs it)");
        self.children[node] = Some(child);
    }

    /// SIGKILL: the node stops at once, as in a crash.
    pub fn kill(&mut self, node: usize) {
        let mut child = self.children[node].take().expect("node is running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGSTOP: the node keeps its connections open and answers nothing, as a hung server
    /// or a black-holed network does. `resume` lets it go on. (The brick suite's tests use
    /// these two.)
    #[allow(dead_code)]
    pub fn pause(&self, node: usize) {
        self.signal(node, "-STOP");
    }

    #[allow(dead_code)]
    pub fn resume(&self, node: usize) {
        self.signal(node, "-CONT");
    }

    #[allow(dead_code)]
    fn signal(&self, node: usize, signal: &str) {
        let child = self.children[node].as_ref().expect("node is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} node {node}: {status}");
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.client_urls.clone()
    }

    /// A connection, once the cluster answers reads and writes (its first election can take
    /// a moment).
    pub async fn coord(&self, cluster: &str, timeout: Duration) -> Coord {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let coord = Coord::connect(&self.endpoints(), cluster, timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                // Writes too: a cluster just formed may answer reads before it has a leader.
                let mut raw = etcd_client::Client::connect(self.endpoints(), None)
                    .await
                    .map_err(|e| e.to_string())?;
                raw.put("/strata-test/ready", "", None)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(coord)
            };
            match attempt.await {
                Ok(coord) => return coord,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("etcd did not come up: {e}\n{}", self.logs()),
            }
        }
    }

    pub fn logs(&self) -> String {
        self.names
            .iter()
            .map(|name| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!(
                    "--- {name}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn member(name: &str) -> MemberRecord {
    MemberRecord {
        name: name.into(),
        role: "client".into(),
        address: String::new(),
    }
}

pub async fn join(coord: &Coord, name: &str, ttl_secs: u64) -> Session {
    Session::open(coord, member(name), Duration::from_secs(ttl_secs))
        .await
        .unwrap()
}

pub const TIMEOUT: Duration = Duration::from_secs(3);
