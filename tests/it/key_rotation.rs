//! A CloudStack key rotated while the provider runs (issue 38): the operator generates the
//! user's keys again in CloudStack (the old pair is refused at once, 401), then puts the new
//! pair in the Secret the provider mounts; the kubelet swaps the volume's files through its
//! `..data` symlink. Until the swap the autoscaler hears that CloudStack refuses the key
//! (PERMISSION_DENIED, not an outage) and how a rotated key is taken; after it, the very next
//! request is signed with the new key, without a restart. Both forms the keys come from files
//! in: the cloud-config's `[Global]` keys (CKS's `cloudstack-secret`, the deploy manifests'
//! form) and `--api-key-file`/`--secret-key-file`.
//!
//! The provider is built from `serve`'s flags (`App::build`), as the binary builds it, and
//! runs in the test's runtime on paused time.

use cks_autoscaler_provider::app::App;
use cks_autoscaler_provider::cli::{Command, ServeArgs, parse_args};
use cks_proto as pb;
use cks_sim::{ClusterSpec, Scenario};
use cks_testkit::*;
use std::time::Duration;

/// Where the keys are read from.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `[Global] api-key`, `secret-key` of the cloud-config.
    CloudConfig,
    /// `--api-key-file`, `--secret-key-file`.
    KeyFiles,
}

/// The volume's files holding `key` and `secret` in `form`.
fn secret_files(form: Form, api_url: &str, key: &str, secret: &str) -> Vec<(String, String)> {
    match form {
        Form::CloudConfig => vec![(
            "cloud-config".into(),
            format!("[Global]\napi-url = {api_url}\napi-key = {key}\nsecret-key = {secret}\n"),
        )],
        Form::KeyFiles => vec![
            (
                "cloud-config".into(),
                format!("[Global]\napi-url = {api_url}\n"),
            ),
            ("api-key".into(), format!("{key}\n")),
            ("secret-key".into(), format!("{secret}\n")),
        ],
    }
}

fn as_refs(files: &[(String, String)]) -> Vec<(&str, &str)> {
    files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect()
}

fn serve_args(argv: &[String]) -> ServeArgs {
    let mut all: Vec<std::ffi::OsString> = vec!["cks-autoscaler-provider".into(), "serve".into()];
    all.extend(argv.iter().map(Into::into));
    match parse_args(all).expect("parses").command {
        Command::Serve(s) => *s,
        other => panic!("not serve: {other:?}"),
    }
}

async fn rotation(form: Form, cluster: &str) {
    logs::capture();
    let mut cfg = sim_config();
    cfg.scenario = Scenario::with_cluster(ClusterSpec::new(cluster, 1, 2));
    let sim = start_sim(cfg).await;
    let cluster_id = sim.cluster_id(cluster).expect("the cluster");
    let mut volume = SecretVolume::new(
        cluster,
        &as_refs(&secret_files(
            form,
            &sim.api_url,
            &sim.api_key,
            &sim.secret_key,
        )),
    );
    let path = |f: &str| volume.path(f).to_string_lossy().to_string();
    let mut argv: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--nodes",
        &format!("1:5:{cluster_id}"),
        "--cloud-config",
        &path("cloud-config"),
        "--refresh-min-interval",
        "100ms",
        "--staleness-bound",
        "1s",
        "--cloudstack-timeout",
        "3s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Form::KeyFiles = form {
        for (flag, file) in [
            ("--api-key-file", "api-key"),
            ("--secret-key-file", "secret-key"),
        ] {
            argv.push(flag.into());
            argv.push(path(file));
        }
    }
    let app = App::build(&serve_args(&argv)).await.expect("builds");
    let listener = tokio::net::TcpListener::bind(loopback())
        .await
        .expect("bound");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(app.run(listener, None, async move {
        let _ = stopped.await;
    }));
    let mut client = grpc_client(addr).await;
    let refresh = async |client: &mut cks_proto::cloud_provider_client::CloudProviderClient<_>| {
        client.refresh(pb::RefreshRequest {}).await.map(|_| ())
    };

    // Signed with the key of the files at start.
    wait_until("the first snapshot", async || {
        refresh(&mut client).await.is_ok()
    })
    .await;

    // CloudStack generates the user's keys again: the old pair is refused from now on.
    let (new_key, new_secret) = (format!("{cluster}-api-2"), format!("{cluster}-secret-2"));
    sim.rotate_keys(&new_key, &new_secret);
    elapse(Duration::from_secs(2)).await;
    let refused = refresh(&mut client)
        .await
        .expect_err("the old key is refused");
    assert_eq!(
        refused.code(),
        tonic::Code::PermissionDenied,
        "a refused key, not an outage: {refused:?}"
    );
    for says in [
        "CloudStack refused this provider's API key",
        "(HTTP 401)",
        "without a restart",
    ] {
        assert!(
            refused.message().contains(says),
            "{says}: {}",
            refused.message()
        );
    }
    assert!(!refused.message().contains(&new_secret));
    let logged = logs::lines_mentioning(&format!("group={cluster}"))
        .into_iter()
        .filter(|l| {
            l.contains("refresh from CloudStack failed")
                && l.contains("CloudStack refused this provider's API key")
        })
        .count();
    assert!(logged >= 1, "the log says the key was refused");
    // A scale request hears the same.
    let scale = client
        .node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: cluster_id.clone(),
        })
        .await
        .expect_err("nothing can be sent with a refused key");
    assert_eq!(scale.code(), tonic::Code::PermissionDenied, "{scale:?}");

    // The operator puts the new pair in the Secret; the kubelet swaps the volume's files.
    volume.update(&as_refs(&secret_files(
        form,
        &sim.api_url,
        &new_key,
        &new_secret,
    )));
    // The very next request is signed with the new pair: the provider's next round (it retries
    // on its own, within its backoff's cap) gets an answer, and so does the autoscaler's
    // Refresh after it.
    let swapped = tokio::time::Instant::now();
    wait_until("a Refresh after the swap to work", async || {
        refresh(&mut client).await.is_ok()
    })
    .await;
    assert!(
        swapped.elapsed() <= Duration::from_secs(15),
        "{:?} after the swap",
        swapped.elapsed()
    );
    let taken = logs::lines_mentioning(&volume.dir().display().to_string())
        .into_iter()
        .filter(|l| l.contains("requests are signed with the new key"))
        .collect::<Vec<_>>();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(!taken[0].contains(&new_key) && !taken[0].contains(&new_secret));

    // And the provider scales again, with no restart.
    client
        .node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: cluster_id.clone(),
        })
        .await
        .expect("a scale-up with the new key");
    wait_until("three workers", async || {
        sim.cluster_json(&cluster_id)["size"] == 3
            && sim.cluster_json(&cluster_id)["state"] == "Running"
    })
    .await;

    let _ = stop.send(());
    let _ = tokio::time::timeout(WAIT, served).await;
    drop(volume);
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_rotated_key_in_the_cloud_config_is_taken_from_the_swapped_secret_without_a_restart() {
    rotation(Form::CloudConfig, "rotate-cloud-config").await;
}

#[tokio::test(start_paused = true)]
async fn a_rotated_key_in_key_files_is_taken_from_the_swapped_secret_without_a_restart() {
    rotation(Form::KeyFiles, "rotate-key-files").await;
}
