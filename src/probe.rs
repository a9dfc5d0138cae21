//! `probe`: an operator's view through the same RPCs the autoscaler uses — node groups,
//! target sizes, instances with their status and errors, and why a group cannot scale — and,
//! over TLS, the certificate the provider presented (its names and expiry).

use anyhow::Context;
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_proto::instance_status::InstanceState;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// `probe` flags.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The provider's gRPC address (host:port), as in the autoscaler's cloud-config.
    #[arg(long, env = "CKS_PROBE_ADDRESS", default_value = "127.0.0.1:8086")]
    pub address: String,
    /// CA (PEM) that signed the provider's certificate: connects with TLS.
    #[arg(long, env = "CKS_PROBE_CACERT")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, env = "CKS_PROBE_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, env = "CKS_PROBE_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Server name to verify (default: the host of --address).
    #[arg(long)]
    pub server_name: Option<String>,
    /// Skip the Refresh call (show the provider's current snapshot without asking it to
    /// fetch from CloudStack).
    #[arg(long)]
    pub no_refresh: bool,
    /// Deadline of each call.
    #[arg(long, default_value = "5s", value_parser = crate::grammar::parse_duration)]
    pub timeout: Duration,
}

/// The host part of `--address` (brackets of an IPv6 address removed).
fn host(address: &str) -> String {
    address
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(address)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

fn client_files(args: &ProbeArgs) -> Option<(&std::path::Path, &std::path::Path)> {
    match (&args.cert, &args.key) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        _ => None,
    }
}

/// The name the server's certificate is checked against.
fn server_name(args: &ProbeArgs) -> String {
    args.server_name
        .clone()
        .unwrap_or_else(|| host(&args.address))
}

async fn connect(args: &ProbeArgs) -> anyhow::Result<CloudProviderClient<Channel>> {
    let scheme = if args.cacert.is_some() {
        "https"
    } else {
        "http"
    };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{}", args.address))
        .with_context(|| format!("invalid --address {:?}", args.address))?
        .connect_timeout(args.timeout)
        .timeout(args.timeout);
    if let Some(ca) = &args.cacert {
        crate::tls::ensure_crypto_provider();
        ep = ep.tls_config(crate::tls::client_tls_config(
            ca,
            client_files(args),
            &server_name(args),
        )?)?;
    }
    let ch = ep
        .connect()
        .await
        .with_context(|| format!("connecting to {}", args.address))?;
    Ok(CloudProviderClient::new(ch))
}

fn state_name(s: Option<&pb::InstanceStatus>) -> &'static str {
    match s.and_then(|s| InstanceState::try_from(s.instance_state).ok()) {
        Some(InstanceState::InstanceRunning) => "running",
        Some(InstanceState::InstanceCreating) => "creating",
        Some(InstanceState::InstanceDeleting) => "deleting",
        _ => "unspecified",
    }
}

/// Runs the probe and prints the report on stdout. A reader that goes away before the end
/// (`probe | head`) ends it quietly, with success: the rest of the report has nowhere to go.
/// Only a failed write to stdout counts as that: a broken pipe under an RPC (the provider
/// closing a connection whose client certificate it refused) is the probe's failure.
pub async fn run(args: ProbeArgs) -> anyhow::Result<()> {
    // `Stdout` takes its lock for each line; unlike `println!`, a failed write is an error
    // returned here, not a panic.
    let mut out = ReportOut {
        inner: std::io::stdout(),
        reader_gone: false,
    };
    match report(&args, &mut out).await {
        Err(_) if out.reader_gone => Ok(()),
        other => other,
    }
}

/// Where the report goes, noting when its reader went away.
struct ReportOut<W: Write> {
    inner: W,
    reader_gone: bool,
}

impl<W: Write> ReportOut<W> {
    fn note<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if r.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            self.reader_gone = true;
        }
        r
    }
}

impl<W: Write> Write for ReportOut<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.inner.write(buf);
        self.note(r)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let r = self.inner.flush();
        self.note(r)
    }
}

/// With TLS, one handshake of its own before the RPCs, to show the certificate the provider
/// presented: its names (what `--address` or `--server-name` must be among) and its expiry.
/// Shown also when the handshake fails on it (an unknown name, an expired certificate), with
/// the reason; no certificate at all (nothing listening) is left to the connection's error.
async fn server_certificate(args: &ProbeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let Some(ca) = &args.cacert else {
        return Ok(());
    };
    crate::tls::ensure_crypto_provider();
    let (config, presented) = crate::tls::inspecting_client_config(ca, client_files(args))?;
    let name = server_name(args);
    let server = rustls::pki_types::ServerName::try_from(name.clone())
        .with_context(|| format!("server name {name:?} is no DNS name or IP address"))?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(&args.address).await?;
        tokio_rustls::TlsConnector::from(config)
            .connect(server, tcp)
            .await
            .map(drop)
    };
    let outcome = tokio::time::timeout(args.timeout, handshake).await;
    let Some(der) = presented.get() else {
        return Ok(());
    };
    for line in describe_certificate(&der, &name, time::OffsetDateTime::now_utc()) {
        writeln!(out, "{line}")?;
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => writeln!(out, "  TLS handshake failed: {e}")?,
        Err(_) => writeln!(out, "  TLS handshake: no answer within {:?}", args.timeout)?,
    }
    Ok(())
}

/// The lines that show a server certificate, checked as `name`, at `now`.
fn describe_certificate(der: &[u8], name: &str, now: time::OffsetDateTime) -> Vec<String> {
    use crate::x509::{format_utc, summarize};
    let Some(s) = summarize(der) else {
        return vec![format!(
            "Server certificate (checked as {name}): not readable as X.509"
        )];
    };
    let names = s.names();
    let mut lines = vec![format!(
        "Server certificate (checked as {name}): names {}{}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        },
        s.common_name
            .as_deref()
            .map(|cn| format!(" (CN {cn})"))
            .unwrap_or_default()
    )];
    let days = (s.not_after - now).whole_days();
    let left = if s.not_after <= now {
        format!("EXPIRED {} days ago", -days)
    } else if s.not_before > now {
        format!("not valid before {}", format_utc(s.not_before))
    } else {
        format!("in {days} days")
    };
    lines.push(format!("  expires {} ({left})", format_utc(s.not_after)));
    lines
}

/// What the probe says when NodeGroups answers no group: why, from the response's headers
/// (`crate::grpc::CALLER_GROUPS_HEADER`): a client bound to no node group (and the names the
/// provider read from its certificate), a client shut out, or groups with no snapshot yet.
fn no_groups_line(headers: &tonic::metadata::MetadataMap, args: &ProbeArgs) -> String {
    let names: Vec<String> = headers
        .get_bin(crate::grpc::CALLER_NAMES_HEADER)
        .and_then(|v| v.to_bytes().ok())
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let presented = if names.is_empty() {
        "presented no client certificate".to_string()
    } else {
        format!(
            "presented a certificate naming {} (its DNS names, or its CN when it has none)",
            names.join(", ")
        )
    };
    let admin = "or run probe inside the provider's pod on its admin address, which sees every node group (kubectl exec … -- cks-autoscaler-provider probe --address 127.0.0.1:8087 --cacert …)";
    match headers
        .get(crate::grpc::CALLER_GROUPS_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        Some("unbound") if names.is_empty() => format!(
            "No node groups for this client: it {presented}, and every node group is bound to a client (--nodes MIN:MAX:CLUSTER@CLIENT). Give probe the certificate of the autoscaler a group is bound to (--cert, --key), {admin}."
        ),
        Some("unbound") => format!(
            "No node groups for this client: it {presented}, and no node group is bound to any of these names. Bind its group with --nodes MIN:MAX:CLUSTER@{} (the chart's nodes[].client), or give probe the certificate of the autoscaler a group is bound to (--cert, --key), {admin}.",
            names[0]
        ),
        Some("denied") => format!(
            "No node groups for this client: it {presented}, and --deny-client shuts one of these names out. Remove the name from --deny-client, or use another client's certificate."
        ),
        _ => format!(
            "No node groups yet: the provider has no CloudStack snapshot of {} clusters (Refresh above and the provider's log say why).",
            if args.cert.is_some() {
                "this client's"
            } else {
                "its"
            }
        ),
    }
}

/// Writes the report to `out`.
async fn report(args: &ProbeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    server_certificate(args, out).await?;
    let mut c = connect(args).await?;
    if !args.no_refresh {
        match c.refresh(pb::RefreshRequest {}).await {
            Ok(_) => writeln!(out, "Refresh: ok")?,
            Err(e) => writeln!(out, "Refresh: {:?}: {}", e.code(), e.message())?,
        }
    }
    let answer = c
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .context("NodeGroups")?;
    let why_none = no_groups_line(answer.metadata(), args);
    let groups = answer.into_inner().node_groups;
    if groups.is_empty() {
        writeln!(out, "{why_none}")?;
    }
    for g in groups {
        writeln!(
            out,
            "\nnode group {} (min {}, max {})",
            g.id, g.min_size, g.max_size
        )?;
        writeln!(out, "  {}", g.debug)?;
        match c
            .node_group_target_size(pb::NodeGroupTargetSizeRequest { id: g.id.clone() })
            .await
        {
            Ok(t) => writeln!(out, "  target size: {}", t.into_inner().target_size)?,
            Err(e) => writeln!(out, "  target size: {:?}: {}", e.code(), e.message())?,
        }
        match c
            .node_group_nodes(pb::NodeGroupNodesRequest { id: g.id.clone() })
            .await
        {
            Ok(n) => {
                let instances = n.into_inner().instances;
                writeln!(out, "  instances: {}", instances.len())?;
                for i in instances {
                    let state = state_name(i.status.as_ref());
                    match i
                        .status
                        .as_ref()
                        .and_then(|s| s.error_info.as_ref())
                        .filter(|e| !e.error_code.is_empty())
                    {
                        Some(e) => writeln!(
                            out,
                            "    {:<60} {:<9} error {} (class {}): {}",
                            i.id, state, e.error_code, e.instance_error_class, e.error_message
                        )?,
                        None => writeln!(out, "    {:<60} {state}", i.id)?,
                    }
                }
            }
            Err(e) => writeln!(out, "  instances: {:?}: {}", e.code(), e.message())?,
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_lines_name_what_it_covers_and_when_it_ends() {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("params");
        let day = time::Duration::days(1);
        let now = time::OffsetDateTime::from_unix_timestamp(1_900_000_000).expect("now");
        params.not_before = now - day * 10;
        params.not_after = now + day * 30;
        let key = rcgen::KeyPair::generate().expect("key");
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        let lines = describe_certificate(&der, "localhost", now);
        assert_eq!(
            lines[0],
            "Server certificate (checked as localhost): names localhost, 127.0.0.1 (CN rcgen self signed cert)"
        );
        assert_eq!(lines[1], "  expires 2030-04-16 17:46:40 UTC (in 30 days)");
        let later = describe_certificate(&der, "localhost", now + day * 33);
        assert_eq!(
            later[1],
            "  expires 2030-04-16 17:46:40 UTC (EXPIRED 3 days ago)"
        );
        let garbage = describe_certificate(&[0x30, 0x00], "x", now);
        assert_eq!(
            garbage,
            ["Server certificate (checked as x): not readable as X.509"]
        );
    }

    #[test]
    fn no_group_is_explained_by_the_providers_headers() {
        use tonic::metadata::{MetadataMap, MetadataValue};
        let args = |cert: bool| ProbeArgs {
            address: "localhost:8086".into(),
            cacert: None,
            cert: cert.then(|| "c.pem".into()),
            key: cert.then(|| "k.pem".into()),
            server_name: None,
            no_refresh: false,
            timeout: Duration::from_secs(5),
        };
        let mut anonymous = MetadataMap::new();
        anonymous.insert(
            crate::grpc::CALLER_GROUPS_HEADER,
            MetadataValue::from_static("unbound"),
        );
        let line = no_groups_line(&anonymous, &args(false));
        assert!(
            line.starts_with("No node groups for this client: it presented no client certificate, and every node group is bound to a client"),
            "{line}"
        );
        assert!(line.contains("--address 127.0.0.1:8087"), "{line}");
        let mut named = anonymous.clone();
        named.insert_bin(
            crate::grpc::CALLER_NAMES_HEADER,
            MetadataValue::from_bytes("autoscaler.x\nalias.x".as_bytes()),
        );
        let line = no_groups_line(&named, &args(true));
        assert!(
            line.contains("naming autoscaler.x, alias.x")
                && line.contains("--nodes MIN:MAX:CLUSTER@autoscaler.x"),
            "{line}"
        );
        let line = no_groups_line(&MetadataMap::new(), &args(true));
        assert!(
            line.starts_with("No node groups yet: the provider has no CloudStack snapshot of this client's clusters"),
            "{line}"
        );
    }

    #[test]
    fn only_a_broken_pipe_on_the_report_counts_as_the_reader_gone() {
        use std::io::{Error, ErrorKind};
        struct Fails(ErrorKind);
        impl Write for Fails {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(Error::from(self.0))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut gone = ReportOut {
            inner: Fails(ErrorKind::BrokenPipe),
            reader_gone: false,
        };
        assert!(writeln!(gone, "line").is_err());
        assert!(gone.reader_gone);
        let mut full = ReportOut {
            inner: Fails(ErrorKind::StorageFull),
            reader_gone: false,
        };
        assert!(writeln!(full, "line").is_err());
        assert!(!full.reader_gone);
        // A broken pipe under an RPC never passes through the report's writer: the probe's
        // own failure, whatever its cause chain holds.
        let mut fine = ReportOut {
            inner: Vec::new(),
            reader_gone: false,
        };
        assert!(writeln!(fine, "line").is_ok());
        assert!(!fine.reader_gone);
    }
}
