//! Where the store's bytes go (`--state-file` or `--state-configmap`): reading them back at
//! start and writing them, nothing about what they mean (that is `store`'s).
//!
//! The file is replaced atomically (written beside it, synced, renamed over it). The ConfigMap
//! holds the same text under one key ([`DATA_KEY`]) and is written with optimistic
//! concurrency: each PUT carries the `resourceVersion` this process read or wrote last, so a
//! write by anyone else since makes the API server answer 409 Conflict. The ConfigMap is then
//! read again: if it holds what this process wrote (its own earlier write, whose answer was
//! lost), writing goes on from there; otherwise another writer has it (a second provider on
//! the same ConfigMap, or a hand edit), and it is never overwritten: this process stops
//! writing (every later write fails, loudly) and so stops answering OK to new promises, until
//! it restarts and takes over what the ConfigMap holds. A ConfigMap that does not exist is
//! created at the first write.

use crate::kube::{ConfigMapRef, KubeClient, KubeError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The ConfigMap's one data key.
pub(crate) const DATA_KEY: &str = "state.json";

/// The verbs the provider's identity needs on its ConfigMap (the Role of `deploy/`).
const VERBS: [&str; 3] = ["get", "create", "update"];

pub(crate) enum Backend {
    File(PathBuf),
    ConfigMap(Box<ConfigMapBackend>),
}

/// What reading at start ended in, for `store` to word.
pub(crate) enum ReadError {
    /// The bytes could not be read.
    Unreadable(String),
    /// The provider's identity lacks a permission it needs.
    Refused(String),
}

impl Backend {
    /// For the logs: `state file PATH` or `configmap NS/NAME`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::File(p) => format!("state file {}", p.display()),
            Backend::ConfigMap(c) => format!("configmap {}/{}", c.target.namespace, c.target.name),
        }
    }

    /// The recorded text; `None` when nothing was ever recorded (no file, no ConfigMap, or a
    /// ConfigMap without the key). A ConfigMap's store also checks, before anything is
    /// served, that the provider may do all it will need.
    pub(crate) async fn read(&self) -> Result<Option<String>, ReadError> {
        match self {
            Backend::File(path) => match std::fs::read_to_string(path) {
                Ok(t) => Ok(Some(t)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(ReadError::Unreadable(e.to_string())),
            },
            Backend::ConfigMap(c) => c.read().await,
        }
    }

    /// Writes `text`; the error says why not, for the log.
    pub(crate) async fn write(&self, text: &str) -> Result<(), String> {
        match self {
            Backend::File(path) => {
                let target = path.clone();
                let body = text.to_string();
                match tokio::task::spawn_blocking(move || write_atomic(&target, &body)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(format!("the writing task failed: {e}")),
                }
            }
            Backend::ConfigMap(c) => c.write(text).await,
        }
    }
}

/// Writes `text` to `path` atomically: a file beside it, synced, renamed over it, and the
/// directory synced, so a crash leaves the old content or the new, never a mix.
pub(crate) fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    // The rename is durable once the directory is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The ConfigMap store: the client, and what this process knows of the object.
pub(crate) struct ConfigMapBackend {
    target: ConfigMapRef,
    /// The client, or why it could not be built (said when the state is read at start).
    client: Result<KubeClient, String>,
    /// Held only between awaits, never across one (one writer task writes at a time).
    seen: Mutex<Seen>,
    /// Another writer changed the ConfigMap: this process never writes it again.
    fenced: AtomicBool,
}

#[derive(Default)]
struct Seen {
    /// The `resourceVersion` read or written last; `None`: the ConfigMap is absent (the next
    /// write creates it).
    version: Option<String>,
    /// A text whose write got no answer: the API server may have stored it, and finding it
    /// there is finding this process's own write, not another writer's.
    unanswered: Option<String>,
}

impl ConfigMapBackend {
    pub(crate) fn new(target: ConfigMapRef) -> ConfigMapBackend {
        let client = KubeClient::new(&target.api).map_err(|e| e.to_string());
        ConfigMapBackend {
            target,
            client,
            seen: Mutex::new(Seen::default()),
            fenced: AtomicBool::new(false),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn client(&self) -> Result<&KubeClient, String> {
        self.client.as_ref().map_err(Clone::clone)
    }

    fn shown(&self) -> String {
        format!("configmap {}/{}", self.target.namespace, self.target.name)
    }

    /// The error of a permission the Role does not grant.
    fn refused(&self, verb: &str, detail: &str) -> ReadError {
        let ConfigMapRef {
            namespace, name, ..
        } = &self.target;
        ReadError::Refused(format!(
            "the provider's service account may not {verb} configmaps ({verb} configmap {namespace}/{name}){detail}: its Role in namespace {namespace} needs the verbs get and update on configmaps with resourceNames [{name}], and create on configmaps (create cannot be limited to a name); the chart and the kustomize base grant exactly these"
        ))
    }

    async fn read(&self) -> Result<Option<String>, ReadError> {
        let client = self.client().map_err(ReadError::Unreadable)?;
        let ConfigMapRef {
            namespace, name, ..
        } = &self.target;
        let found = match client.get_configmap(namespace, name).await {
            Ok(found) => found,
            Err(e) if e.is_refused() => return Err(self.refused("get", &format!(": {e}"))),
            Err(e) => return Err(ReadError::Unreadable(e.to_string())),
        };
        // What the writes will need, asked now rather than found out at the first promise.
        for verb in VERBS.into_iter().filter(|v| *v != "get") {
            match client.may(verb, namespace, name).await {
                Ok(true) => {}
                Ok(false) => return Err(self.refused(verb, "")),
                Err(e) => return Err(ReadError::Unreadable(e.to_string())),
            }
        }
        let mut seen = self.seen();
        seen.version = found.as_ref().map(|cm| cm.resource_version.clone());
        Ok(found.and_then(|mut cm| cm.data.remove(DATA_KEY)))
    }

    async fn write(&self, text: &str) -> Result<(), String> {
        let client = self.client()?;
        if self.fenced.load(Ordering::Acquire) {
            return Err(format!(
                "{} was changed by another writer and is not overwritten: this process records nothing more, and promises it makes are not answered OK; restart it to take over what the ConfigMap holds (and make sure one provider only uses it)",
                self.shown()
            ));
        }
        let ConfigMapRef {
            namespace, name, ..
        } = &self.target;
        let data = BTreeMap::from([(DATA_KEY.to_string(), text.to_string())]);
        let version = self.seen().version.clone();
        let written = match &version {
            None => client.create_configmap(namespace, name, &data).await,
            Some(v) => client.replace_configmap(namespace, name, v, &data).await,
        };
        match written {
            Ok(cm) => {
                let mut seen = self.seen();
                seen.version = Some(cm.resource_version);
                seen.unanswered = None;
                Ok(())
            }
            Err(e) if e.is_conflict() => self.after_conflict(client, text, version).await,
            Err(e) if e.is_not_found() => {
                // Deleted since: created again at the next try, nothing of anyone's lost.
                self.seen().version = None;
                Err(format!("{e}; it is created again"))
            }
            Err(e @ KubeError::Transport { .. }) => {
                self.seen().unanswered = Some(text.to_string());
                Err(e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// A 409: someone wrote (or created) the ConfigMap since `version`. Read it again: this
    /// process's own unanswered write, or `text` itself, go on from there; anything else is
    /// another writer's, and fences this process off.
    async fn after_conflict(
        &self,
        client: &KubeClient,
        text: &str,
        version: Option<String>,
    ) -> Result<(), String> {
        let ConfigMapRef {
            namespace, name, ..
        } = &self.target;
        let now = client.get_configmap(namespace, name).await.map_err(|e| {
            format!(
                "{} changed since it was read (409 Conflict), and reading it again failed: {e}",
                self.shown()
            )
        })?;
        let Some(cm) = now else {
            self.seen().version = None;
            return Err(format!(
                "{} changed since it was read (409 Conflict) and is gone now; it is created again",
                self.shown()
            ));
        };
        let held = cm.data.get(DATA_KEY).map(String::as_str);
        let mut seen = self.seen();
        if held == Some(text) {
            seen.version = Some(cm.resource_version);
            seen.unanswered = None;
            return Ok(());
        }
        if held.is_some() && held == seen.unanswered.as_deref() {
            seen.version = Some(cm.resource_version);
            seen.unanswered = None;
            return Err(format!(
                "{} holds this process's own earlier write, whose answer was lost; writing again",
                self.shown()
            ));
        }
        drop(seen);
        self.fenced.store(true, Ordering::Release);
        Err(format!(
            "ANOTHER WRITER changed {} (resourceVersion {} when this process last read or wrote it, {} now, 409 Conflict): it is NOT overwritten. Two providers use the same ConfigMap, or it was edited by hand. This process records nothing more and does not answer OK to new promises until it restarts and takes over what the ConfigMap holds",
            self.shown(),
            version.as_deref().unwrap_or("none: it did not exist"),
            cm.resource_version
        ))
    }
}

/// For `store`: the file of `--state-file`, the ConfigMap of `--state-configmap`.
pub(crate) fn backend(file: Option<PathBuf>, configmap: Option<ConfigMapRef>) -> Option<Backend> {
    match (configmap, file) {
        (Some(c), _) => Some(Backend::ConfigMap(Box::new(ConfigMapBackend::new(c)))),
        (None, Some(f)) => Some(Backend::File(f)),
        (None, None) => None,
    }
}
