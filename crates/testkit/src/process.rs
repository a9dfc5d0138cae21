//! The provider as its own process: the `cks-autoscaler-provider serve` binary started against
//! a simulator, so that its memory can be read from `/proc/<pid>/status` apart from the
//! simulator and the load generator, and so that it can be killed (SIGKILL) or frozen
//! (SIGSTOP/SIGCONT) like a real pod. Shared by the benchmarks and the fault and soak tests.
//!
//! A process keeps its own (wall) clock: the waits here are on `std::time`, and a test driving
//! a provider process runs on real time.

use cks_proto::cloud_provider_client::CloudProviderClient;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// How to start one provider process.
#[derive(Debug, Clone)]
pub struct ProviderArgs {
    /// The CloudStack API endpoint (the simulator's `api_url`).
    pub api_url: String,
    pub api_key: String,
    pub secret_key: String,
    /// `--nodes` specs (`MIN:MAX:CLUSTER`).
    pub nodes: Vec<String>,
    /// Further `serve` flags, e.g. `["--job-poll-interval", "50ms"]`.
    pub flags: Vec<String>,
    /// Also serve `/metrics` on a loopback port.
    pub metrics: bool,
    /// gRPC port to listen on; 0 picks a free one. A restarted provider reuses its port, as a
    /// Kubernetes Service would keep the autoscaler's address.
    pub port: u16,
    /// Extra environment variables (e.g. allocator settings).
    pub env: Vec<(String, String)>,
    /// Serve mutual TLS with these certificates, and connect presenting the client one: a
    /// provider for several clusters must bind each group to its client (`--nodes …@CLIENT`),
    /// which needs client certificates.
    pub tls: Option<TestTls>,
}

/// PEM texts for a provider over mutual TLS: one CA signs the server certificate (valid for
/// `localhost`) and the client certificate the harness presents.
#[derive(Debug, Clone)]
pub struct TestTls {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl ProviderArgs {
    pub fn new(api_url: &str, api_key: &str, secret_key: &str, nodes: Vec<String>) -> Self {
        ProviderArgs {
            api_url: api_url.to_string(),
            api_key: api_key.to_string(),
            secret_key: secret_key.to_string(),
            nodes,
            flags: Vec::new(),
            metrics: false,
            port: 0,
            env: Vec::new(),
            tls: None,
        }
    }

    /// Binds every group to `client` (`MIN:MAX:CLUSTER@client`) and serves mutual TLS with
    /// `tls`, whose client certificate must name `client`.
    pub fn bound_to(mut self, client: &str, tls: TestTls) -> Self {
        for n in &mut self.nodes {
            if !n.contains('@') {
                n.push('@');
                n.push_str(client);
            }
        }
        self.tls = Some(tls);
        self
    }

    pub fn flag(mut self, name: &str, value: &str) -> Self {
        self.flags.push(name.to_string());
        self.flags.push(value.to_string());
        self
    }
}

/// Where [`TestTls`] is written in a provider's work dir.
struct TlsPaths {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// Files named after the process's `stamp`: a provider re-reads its TLS files when they
/// change, so a second process sharing the work dir would otherwise hand its certificates to
/// the first, whose clients then refuse them.
fn write_tls(dir: &Path, tls: &TestTls, stamp: &str) -> TlsPaths {
    let write = |name: &str, pem: &str| {
        let path = dir.join(format!("{name}-{stamp}.pem"));
        std::fs::write(&path, pem).expect("writing a test certificate");
        path
    };
    TlsPaths {
        ca: write("tls-ca", &tls.ca),
        server_cert: write("tls-server", &tls.server_cert),
        server_key: write("tls-server-key", &tls.server_key),
        client_cert: write("tls-client", &tls.client_cert),
        client_key: write("tls-client-key", &tls.client_key),
    }
}

/// A running provider process. Killed when dropped.
pub struct ProviderProcess {
    child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// Where the process's stderr goes (quoted when something fails).
    pub log_path: PathBuf,
    pub args: ProviderArgs,
    /// Names this process's files in its work dir, which other processes may share.
    stamp: String,
}

/// A free loopback port. The listener is closed before the port is used, so another process
/// could take it in between; [`ProviderProcess::spawn`] notices an early exit.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Reads a `Vm*` line (kB) from `/proc/<pid>/status`.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {sig} {pid} failed");
}

impl ProviderProcess {
    /// Writes the cloud-config into `dir` and starts `bin serve`. Returns once the gRPC port
    /// accepts connections (not necessarily SERVING: see [`ProviderProcess::wait_serving`]).
    pub async fn spawn(bin: &Path, dir: &Path, mut args: ProviderArgs) -> Self {
        std::fs::create_dir_all(dir).expect("creating the provider's work dir");
        let mut last_log = String::new();
        for attempt in 0..5 {
            let port = if args.port == 0 {
                free_port()
            } else {
                args.port
            };
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            let stamp = format!("{}-{port}-{attempt}", std::process::id());
            let config_path = dir.join(format!("cloud-config-{stamp}.ini"));
            std::fs::write(
                &config_path,
                format!(
                    "[Global]\napi-url = {}\napi-key = {}\nsecret-key = {}\n",
                    args.api_url, args.api_key, args.secret_key
                ),
            )
            .expect("writing the cloud-config");
            let log_path = dir.join(format!("provider-{stamp}.log"));
            let log = std::fs::File::create(&log_path).expect("creating the provider log");
            let mut cmd = Command::new(bin);
            // Nothing from the caller's environment configures the provider but these flags.
            for (k, _) in std::env::vars() {
                if k.starts_with("CKS_PROVIDER_") {
                    cmd.env_remove(k);
                }
            }
            cmd.env(
                "RUST_LOG",
                std::env::var("PROVIDER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--cloud-config")
            .arg(&config_path);
            for n in &args.nodes {
                cmd.arg("--nodes").arg(n);
            }
            if let Some(tls) = &args.tls {
                let files = write_tls(dir, tls, &stamp);
                cmd.arg("--tls-cert")
                    .arg(&files.server_cert)
                    .arg("--tls-key")
                    .arg(&files.server_key)
                    .arg("--tls-client-ca")
                    .arg(&files.ca);
            }
            let metrics_addr = if args.metrics {
                let m: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
                cmd.arg("--metrics-listen").arg(m.to_string());
                Some(m)
            } else {
                None
            };
            cmd.envs(args.env.iter().map(|(k, v)| (k, v)));
            cmd.args(&args.flags)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log);
            let mut child = cmd.spawn().expect("starting cks-autoscaler-provider serve");
            let started = Instant::now();
            let mut exited = false;
            while started.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true;
                    break;
                }
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    args.port = port;
                    return ProviderProcess {
                        child,
                        addr,
                        metrics_addr,
                        log_path,
                        args,
                        stamp,
                    };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
            last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if !exited {
                break;
            }
        }
        panic!("the provider process did not start listening; its log:\n{last_log}");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid(), "VmRSS")
    }

    /// Peak resident memory, in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid(), "VmHWM")
    }

    /// A gRPC client; the channel connects lazily and reconnects after a restart on the
    /// same port.
    pub fn client(&self) -> CloudProviderClient<Channel> {
        CloudProviderClient::new(self.channel())
    }

    pub fn channel(&self) -> Channel {
        let scheme = if self.args.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.addr))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if let Some(tls) = &self.args.tls {
            let dir = self.log_path.parent().unwrap_or(Path::new("."));
            let files = write_tls(dir, tls, &self.stamp);
            let config = cks_autoscaler_provider::tls::client_tls_config(
                &files.ca,
                Some((&files.client_cert, &files.client_key)),
                "localhost",
            )
            .expect("client TLS config");
            endpoint = endpoint.tls_config(config).expect("TLS endpoint");
        }
        endpoint.connect_lazy()
    }

    /// Waits until gRPC health reports SERVING (every group has a snapshot).
    pub async fn wait_serving(&self, timeout: Duration) {
        let mut health = HealthClient::new(self.channel());
        let started = Instant::now();
        loop {
            // The CloudProvider service's health: SERVING once every group has a snapshot
            // (the whole server's, "", is readiness, SERVING from the start).
            let status = health
                .check(HealthCheckRequest {
                    service: "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
                        .to_string(),
                })
                .await
                .map(|r| r.into_inner().status);
            if status.as_ref().ok() == Some(&(ServingStatus::Serving as i32)) {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "provider not SERVING after {timeout:?} (last: {status:?}); log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `Some` once the process has exited (it should not while a test runs).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// SIGKILL, as when a node dies or the pod is OOM-killed: no cleanup runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process stops; its monotonic clock keeps running.
    pub fn freeze(&self) {
        signal(self.pid(), "-STOP");
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        signal(self.pid(), "-CONT");
    }

    /// Kills this process and starts a new one with the same arguments on the same port.
    pub async fn restart(&mut self, bin: &Path, dir: &Path) {
        self.kill();
        let next = ProviderProcess::spawn(bin, dir, self.args.clone()).await;
        let old = std::mem::replace(self, next);
        drop(old);
    }

    /// The Prometheus page (requires `metrics`).
    pub async fn metrics(&self) -> String {
        let addr = self.metrics_addr.expect("started with metrics");
        reqwest::get(format!("http://{addr}/metrics"))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("reading /metrics")
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        // A frozen process must be thawed to die promptly on some kernels' job control.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sum and count of a Prometheus histogram series with this exact label set (e.g.
/// `method="NodeGroupForNode",code="Ok"`), read from an exposition page.
pub fn histogram_sum_count(page: &str, name: &str, labels: &str) -> (f64, u64) {
    let mut sum = 0.0;
    let mut count = 0;
    for line in page.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let matches_labels = |suffix: &str| {
            series
                .strip_prefix(&format!("{name}{suffix}{{"))
                .and_then(|rest| rest.strip_suffix('}'))
                .is_some_and(|l| label_set_eq(l, labels))
        };
        if matches_labels("_sum") {
            sum += value.parse::<f64>().unwrap_or(0.0);
        } else if matches_labels("_count") {
            count += value.parse::<u64>().unwrap_or(0);
        }
    }
    (sum, count)
}

fn label_set_eq(a: &str, b: &str) -> bool {
    let mut x: Vec<&str> = a.split(',').map(str::trim).collect();
    let mut y: Vec<&str> = b.split(',').map(str::trim).collect();
    x.sort_unstable();
    y.sort_unstable();
    x == y
}
