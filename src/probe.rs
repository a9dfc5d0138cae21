//! `probe`: an operator's view through the same RPCs the autoscaler uses — node groups,
//! target sizes, instances with their status and errors, and why a group cannot scale.

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

async fn connect(args: &ProbeArgs) -> anyhow::Result<CloudProviderClient<Channel>> {
    let host = args
        .address
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(&args.address)
        .to_string();
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
        let client = match (&args.cert, &args.key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        let name = args.server_name.clone().unwrap_or(host);
        ep = ep.tls_config(crate::tls::client_tls_config(ca, client, &name)?)?;
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
pub async fn run(args: ProbeArgs) -> anyhow::Result<()> {
    // `Stdout` takes its lock for each line; unlike `println!`, a failed write is an error
    // returned here, not a panic.
    match report(&args, &mut std::io::stdout()).await {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// Whether an error is the reader of the report having gone away.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes the report to `out`.
async fn report(args: &ProbeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = connect(args).await?;
    if !args.no_refresh {
        match c.refresh(pb::RefreshRequest {}).await {
            Ok(_) => writeln!(out, "Refresh: ok")?,
            Err(e) => writeln!(out, "Refresh: {:?}: {}", e.code(), e.message())?,
        }
    }
    let groups = c
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .context("NodeGroups")?
        .into_inner()
        .node_groups;
    if groups.is_empty() {
        writeln!(
            out,
            "No node groups (no CloudStack snapshot yet, or no cluster resolved)."
        )?;
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
    fn only_a_broken_pipe_counts_as_the_reader_gone() {
        use std::io::{Error, ErrorKind};
        let gone = anyhow::Error::from(Error::from(ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&gone));
        assert!(is_broken_pipe(&gone.context("writing the report")));
        let full = anyhow::Error::from(Error::from(ErrorKind::StorageFull));
        assert!(!is_broken_pipe(&full));
        assert!(!is_broken_pipe(&anyhow::anyhow!(
            "connecting to 127.0.0.1:1"
        )));
    }
}
