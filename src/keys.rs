//! The CloudStack key pair, re-read from its files when they change.
//!
//! The keys come from `--api-key-file` / `--secret-key-file`, from the environment
//! (`CKS_PROVIDER_API_KEY` / `CKS_PROVIDER_SECRET_KEY`), or from the cloud-config's `[Global]`
//! `api-key` / `secret-key`, each key on its own. In Kubernetes the files are a mounted Secret
//! (CKS's `cloudstack-secret`), which the kubelet updates in place when the operator puts a new
//! key in it: it writes the new files into a new timestamped directory, points the volume's
//! `..data` symlink at it with one rename, and removes the old directory. So when a key is
//! rotated in CloudStack, the provider takes the new one from its files without a restart.
//!
//! * [`KeyFiles`] says where each key comes from and reads the pair (failing fast at start,
//!   with an error naming the file and what is wrong with it).
//! * [`ReloadingKeys`] holds the pair in use and, as the CloudStack client's
//!   [`KeySource`], looks at the files before every request: their content, through whatever
//!   symlinks lead to them, so the `..data` swap is seen however it is done (a watch on the
//!   symlink would miss it). A request costs a round trip to CloudStack; re-reading two or
//!   three small files beside it costs nothing, and no request after the swap is signed with
//!   the old key. New files that cannot be used (missing for a moment, an empty key, a
//!   cloud-config cut short) are logged once and ignored: the previous pair keeps signing, and
//!   no request is ever signed with an empty key.
//!
//! Keys given in the environment are not files and never change while the process runs.

use crate::config::{self, CloudConfig, ConfigError};
use cks_cloudstack::{KeyPair, KeySource};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Where one key comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// A file of its own (`--api-key-file`, `--secret-key-file`), trimmed.
    File(PathBuf),
    /// A value given at start (the environment): never re-read.
    Given(String),
    /// The cloud-config's `[Global]` `api-key` or `secret-key`.
    CloudConfig,
}

impl std::fmt::Debug for KeyOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyOrigin::File(p) => f.debug_tuple("File").field(p).finish(),
            KeyOrigin::Given(_) => f.write_str("Given(***)"),
            KeyOrigin::CloudConfig => f.write_str("CloudConfig"),
        }
    }
}

/// The files the key pair is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFiles {
    /// The cloud-config (`--cloud-config`).
    pub cloud_config: PathBuf,
    pub api_key: KeyOrigin,
    pub secret_key: KeyOrigin,
}

/// Why the key files could not be used. Every variant names the file at fault, never a key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// (The cause is in the message, not a `source`: a chain printed whole says it once.)
    #[error("cannot read the {what} file {}: {cause}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error("the {what} file {} is empty", path.display())]
    Empty { what: &'static str, path: PathBuf },
    #[error("the {what} file {} is not UTF-8 text", path.display())]
    NotText { what: &'static str, path: PathBuf },
    /// Transparent: the chain the binary prints whole says the cause once.
    #[error(transparent)]
    CloudConfig(#[from] ConfigError),
    #[error("no API key or no secret key in {files}")]
    Incomplete { files: String },
}

const API_KEY: &str = "API key";
const SECRET_KEY: &str = "secret key";
const CLOUD_CONFIG: &str = "cloud-config";

/// The raw bytes of the files the keys come from, read together so that a check compares one
/// snapshot; in the order of [`KeyFiles::watched`].
struct FileContents(Vec<Vec<u8>>);

impl FileContents {
    /// A digest to tell whether the files changed, so no second copy of the keys is kept
    /// around. Collisions would need someone who can already write the key files.
    fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.0.hash(&mut hasher);
        hasher.finish()
    }
}

impl KeyFiles {
    /// The files the keys come from, each with what it holds: the key files, and the
    /// cloud-config when a key is read from it.
    pub fn watched(&self) -> Vec<(&'static str, &Path)> {
        let mut files = Vec::new();
        if let KeyOrigin::File(p) = &self.api_key {
            files.push((API_KEY, p.as_path()));
        }
        if let KeyOrigin::File(p) = &self.secret_key {
            files.push((SECRET_KEY, p.as_path()));
        }
        if self.api_key == KeyOrigin::CloudConfig || self.secret_key == KeyOrigin::CloudConfig {
            files.push((CLOUD_CONFIG, self.cloud_config.as_path()));
        }
        files
    }

    /// The keys that do not come from the cloud-config (read from their files now), for the
    /// cloud-config reader, whose own keys these replace.
    pub fn keys_from_elsewhere(&self) -> Result<(Option<String>, Option<String>), KeyError> {
        let read = |what: &'static str, origin: &KeyOrigin| -> Result<Option<String>, KeyError> {
            match origin {
                KeyOrigin::File(path) => {
                    let bytes = read_file(what, path)?;
                    key_text(what, path, &bytes).map(Some)
                }
                KeyOrigin::Given(value) => Ok(Some(value.clone())),
                KeyOrigin::CloudConfig => Ok(None),
            }
        };
        Ok((
            read(API_KEY, &self.api_key)?,
            read(SECRET_KEY, &self.secret_key)?,
        ))
    }

    /// Reads the files now and returns the pair they hold, with the cloud-config read too
    /// (the keys replaced by those from elsewhere).
    pub fn load(&self) -> Result<CloudConfig, KeyError> {
        let (api_key, secret_key) = self.keys_from_elsewhere()?;
        Ok(config::load_cloud_config_with_keys(
            &self.cloud_config,
            api_key,
            secret_key,
        )?)
    }

    fn read(&self) -> Result<FileContents, KeyError> {
        self.watched()
            .into_iter()
            .map(|(what, path)| read_file(what, path))
            .collect::<Result<_, _>>()
            .map(FileContents)
    }

    /// The pair `contents` holds, and the cloud-config's other settings when it was read.
    fn pair(&self, contents: &FileContents) -> Result<(KeyPair, Option<Settings>), KeyError> {
        let mut files = self.watched().into_iter().zip(&contents.0);
        let mut from = |origin: &KeyOrigin| -> Result<Option<String>, KeyError> {
            match origin {
                KeyOrigin::File(_) => match files.next() {
                    Some(((what, path), bytes)) => key_text(what, path, bytes).map(Some),
                    None => Ok(None),
                },
                KeyOrigin::Given(value) => Ok(Some(value.clone())),
                KeyOrigin::CloudConfig => Ok(None),
            }
        };
        let api_key = from(&self.api_key)?;
        let secret_key = from(&self.secret_key)?;
        match (api_key, secret_key, files.next()) {
            (Some(api_key), Some(secret_key), _) => Ok((KeyPair::new(api_key, secret_key), None)),
            (api_key, secret_key, Some(((_, path), bytes))) => {
                let name = path.display().to_string();
                let text = std::str::from_utf8(bytes).map_err(|_| KeyError::NotText {
                    what: CLOUD_CONFIG,
                    path: path.to_owned(),
                })?;
                let cc = config::parse_cloud_config_with_keys(text, &name, api_key, secret_key)?;
                let settings = Settings::of(&cc);
                Ok((KeyPair::new(cc.api_key, cc.secret_key), Some(settings)))
            }
            // `watched` lists the cloud-config whenever a key comes from it.
            (_, _, None) => Err(KeyError::Incomplete {
                files: watched_list(self),
            }),
        }
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|cause| KeyError::Read {
        what,
        path: path.to_owned(),
        cause,
    })
}

/// A key file's key: its text, trimmed (a Secret written with `echo` ends in a newline).
fn key_text(what: &'static str, path: &Path, bytes: &[u8]) -> Result<String, KeyError> {
    let text = std::str::from_utf8(bytes).map_err(|_| KeyError::NotText {
        what,
        path: path.to_owned(),
    })?;
    let key = text.trim();
    if key.is_empty() {
        return Err(KeyError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    Ok(key.to_string())
}

/// What of the cloud-config besides the keys the provider reads only at start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    api_url: String,
    project_id: Option<String>,
    ssl_no_verify: bool,
}

impl Settings {
    fn of(cc: &CloudConfig) -> Self {
        Settings {
            api_url: cc.api_url.clone(),
            project_id: cc.project_id.clone(),
            ssl_no_verify: cc.ssl_no_verify,
        }
    }
}

/// The key pair in use, re-read from its files before each request when they changed.
/// Cheap to clone; clones share the pair.
#[derive(Clone)]
pub struct ReloadingKeys {
    inner: Arc<Inner>,
}

struct Inner {
    files: KeyFiles,
    /// Read for every request, written only by a successful reload. A std lock: it is never
    /// held across an await and only guards an `Arc` clone.
    current: RwLock<Arc<KeyPair>>,
    /// Serialises file checks; held only while the files are read.
    check: Mutex<CheckState>,
    reloads: AtomicU64,
}

struct CheckState {
    /// Digest of the files the current pair was read from.
    loaded: u64,
    /// The cloud-config's other settings at start, to say that a change of them needs a
    /// restart (`None`: the cloud-config is not watched).
    settings: Option<Settings>,
    /// The last failure logged, so a file that stays broken is reported once, not every
    /// request.
    last_failure: Option<(Option<u64>, String)>,
    /// Digest of the last files whose other settings were said to need a restart.
    settings_warned: Option<u64>,
}

impl std::fmt::Debug for ReloadingKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingKeys")
            .field("files", &self.inner.files)
            .field("current", &self.current_pair())
            .field("reloads", &self.reloads())
            .finish_non_exhaustive()
    }
}

/// What one look at the files found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyReload {
    /// The files are as they were (or hold the pair in use).
    Unchanged,
    /// The files changed and the new pair is in use.
    Reloaded,
    /// The files changed but cannot be used (or were caught changing); the previous pair
    /// stays in use.
    Failed,
}

impl ReloadingKeys {
    /// Reads the pair now (failing fast like [`KeyFiles::load`]); afterwards the files are
    /// looked at before every request.
    pub fn new(files: KeyFiles) -> Result<Self, KeyError> {
        let contents = files.read()?;
        let (pair, settings) = files.pair(&contents)?;
        // The cloud-config reader and `key_text` refuse empty keys, and an empty one from
        // the environment counts as none; said here too, so an empty pair can never sign.
        if !pair.is_complete() {
            return Err(KeyError::Incomplete {
                files: watched_list(&files),
            });
        }
        Ok(ReloadingKeys {
            inner: Arc::new(Inner {
                files,
                current: RwLock::new(Arc::new(pair)),
                check: Mutex::new(CheckState {
                    loaded: contents.digest(),
                    settings,
                    last_failure: None,
                    settings_warned: None,
                }),
                reloads: AtomicU64::new(0),
            }),
        })
    }

    /// The files this pair is read from.
    pub fn files(&self) -> &KeyFiles {
        &self.inner.files
    }

    /// How many times changed files gave a new pair that was put in use.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }

    fn current_pair(&self) -> Arc<KeyPair> {
        // A poisoned lock still holds a complete Arc: the writer only swaps it.
        self.inner
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Looks at the files now and takes the pair they hold if they changed.
    pub fn check_now(&self) -> KeyReload {
        let mut state = self
            .inner
            .check
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.check_locked(&mut state)
    }

    fn check_locked(&self, state: &mut CheckState) -> KeyReload {
        let files = &self.inner.files;
        let (digest, result) = match files.read() {
            Ok(contents) => {
                let digest = contents.digest();
                if digest == state.loaded {
                    state.last_failure = None;
                    return KeyReload::Unchanged;
                }
                if matches!(&state.last_failure, Some((Some(failed), _)) if *failed == digest) {
                    return KeyReload::Failed;
                }
                // Read again: two files read while the kubelet swaps `..data` may be one old
                // and one new. One swap is one rename, so two reads that agree are both after
                // it (or both before); files still moving are looked at again next request.
                match files.read() {
                    Ok(again) if again.digest() == digest => {}
                    _ => return KeyReload::Failed,
                }
                (Some(digest), files.pair(&contents))
            }
            Err(e) => (None, Err(e)),
        };
        match result {
            Ok((pair, settings)) if pair.is_complete() => {
                let digest = digest.unwrap_or_default();
                state.loaded = digest;
                state.last_failure = None;
                if settings.is_some()
                    && state.settings.is_some()
                    && settings != state.settings
                    && state.settings_warned != Some(digest)
                {
                    state.settings_warned = Some(digest);
                    tracing::warn!(
                        cloud_config = %files.cloud_config.display(),
                        "the cloud-config changed besides its keys (api-url, project-id or ssl-no-verify): only the keys are taken while the provider runs; restart it to use the rest"
                    );
                }
                let current = self.current_pair();
                if *current == pair {
                    return KeyReload::Unchanged;
                }
                let api_key_changed = current.api_key != pair.api_key;
                let api_key = cks_cloudstack::redact::mask(&pair.api_key);
                *self
                    .inner
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(pair);
                self.inner.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    files = %watched_list(files),
                    %api_key,
                    api_key_changed,
                    "CloudStack key files changed; requests are signed with the new key"
                );
                KeyReload::Reloaded
            }
            Ok(_) => {
                let error = KeyError::Incomplete {
                    files: watched_list(files),
                };
                self.failed(state, digest, error.to_string())
            }
            Err(e) => self.failed(state, digest, e.to_string()),
        }
    }

    fn failed(&self, state: &mut CheckState, digest: Option<u64>, error: String) -> KeyReload {
        let failure = (digest, error);
        if state.last_failure.as_ref() != Some(&failure) {
            tracing::warn!(
                error = %failure.1,
                "CloudStack key files changed but cannot be used; requests are still signed with the previous key"
            );
            state.last_failure = Some(failure);
        }
        KeyReload::Failed
    }
}

/// The watched files, for a log line.
fn watched_list(files: &KeyFiles) -> String {
    files
        .watched()
        .iter()
        .map(|(_, p)| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl KeySource for ReloadingKeys {
    fn current(&self) -> Arc<KeyPair> {
        self.check_now();
        self.current_pair()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cks_testkit::{SecretVolume, logs};

    const URL: &str = "http://127.0.0.1:1/client/api";

    fn cloud_config(api_key: &str, secret_key: &str) -> String {
        format!("[Global]\napi-url = {URL}\napi-key = {api_key}\nsecret-key = {secret_key}\n")
    }

    fn key_files(volume: &SecretVolume) -> KeyFiles {
        KeyFiles {
            cloud_config: volume.path("cloud-config"),
            api_key: KeyOrigin::File(volume.path("api-key")),
            secret_key: KeyOrigin::File(volume.path("secret-key")),
        }
    }

    fn pair(keys: &ReloadingKeys) -> (String, String) {
        let p = keys.current();
        (p.api_key.clone(), p.secret_key.clone())
    }

    fn owned(a: &str, s: &str) -> (String, String) {
        (a.to_string(), s.to_string())
    }

    #[test]
    fn key_files_swapped_as_the_kubelet_swaps_a_secret_give_the_new_pair() {
        let mut volume = SecretVolume::new(
            "keys-files",
            &[
                ("cloud-config", &format!("[Global]\napi-url = {URL}\n")),
                ("api-key", "old-api\n"),
                ("secret-key", "old-secret\n"),
            ],
        );
        let keys = ReloadingKeys::new(key_files(&volume)).expect("the first pair");
        assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        assert_eq!(keys.check_now(), KeyReload::Unchanged);

        // The new version written but `..data` not swapped yet: still the old files.
        let next = [
            ("cloud-config", format!("[Global]\napi-url = {URL}\n")),
            ("api-key", "new-api\n".to_string()),
            ("secret-key", "new-secret\n".to_string()),
        ];
        let next: Vec<(&str, &str)> = next.iter().map(|(n, c)| (*n, c.as_str())).collect();
        let version = volume.write_version(&next);
        assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        volume.swap_data(&version);
        assert_eq!(pair(&keys), owned("new-api", "new-secret"), "the next use");
        volume.finish(&next);
        assert_eq!(pair(&keys), owned("new-api", "new-secret"));
        assert_eq!(keys.reloads(), 1);
    }

    #[test]
    fn the_cloud_configs_keys_are_taken_anew_and_a_change_of_the_rest_is_said_to_need_a_restart() {
        let log = logs::Scoped::start();
        let mut volume = SecretVolume::new(
            "keys-cloud-config",
            &[("cloud-config", &cloud_config("old-api", "old-secret"))],
        );
        let files = KeyFiles {
            cloud_config: volume.path("cloud-config"),
            api_key: KeyOrigin::CloudConfig,
            secret_key: KeyOrigin::CloudConfig,
        };
        let keys = ReloadingKeys::new(files).expect("the first pair");
        assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        volume.update(&[("cloud-config", &cloud_config("new-api", "new-secret"))]);
        assert_eq!(pair(&keys), owned("new-api", "new-secret"));
        let dir = volume.dir().display().to_string();
        let taken = log
            .lines_mentioning(&dir)
            .into_iter()
            .filter(|l| l.contains("requests are signed with the new key"))
            .collect::<Vec<_>>();
        assert_eq!(taken.len(), 1, "one INFO line: {taken:?}");
        assert!(taken[0].contains("INFO"), "{taken:?}");
        assert!(!taken[0].contains("new-secret"), "{taken:?}");

        let moved = "[Global]\napi-url = http://127.0.0.2:1/client/api\napi-key = new-api\nsecret-key = new-secret\n";
        volume.update(&[("cloud-config", moved)]);
        assert_eq!(keys.check_now(), KeyReload::Unchanged, "the same keys");
        assert_eq!(pair(&keys), owned("new-api", "new-secret"));
        let said = log
            .lines_mentioning(&dir)
            .into_iter()
            .filter(|l| l.contains("restart it to use the rest"))
            .count();
        assert_eq!(said, 1);
    }

    #[test]
    fn a_missing_empty_or_half_written_file_keeps_the_old_pair_and_is_said_once() {
        let log = logs::Scoped::start();
        let mut volume = SecretVolume::new(
            "keys-broken",
            &[
                ("cloud-config", &cloud_config("old-api", "old-secret")),
                ("secret-key", "old-secret\n"),
            ],
        );
        let files = KeyFiles {
            cloud_config: volume.path("cloud-config"),
            api_key: KeyOrigin::CloudConfig,
            secret_key: KeyOrigin::File(volume.path("secret-key")),
        };
        let keys = ReloadingKeys::new(files).expect("the first pair");
        let dir = volume.dir().display().to_string();
        let warnings = |what: &str| {
            log.lines_mentioning(&dir)
                .into_iter()
                .filter(|l| l.contains("WARN") && l.contains(what))
                .count()
        };

        // Missing for a moment: `..data` gone (between two steps of a hand-made update).
        let data = volume.path("..data");
        let target = std::fs::read_link(&data).expect("..data is a symlink");
        std::fs::remove_file(&data).expect("remove ..data");
        for _ in 0..3 {
            assert_eq!(keys.check_now(), KeyReload::Failed);
            assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        }
        assert_eq!(warnings("No such file"), 1, "said once, not every request");
        std::os::unix::fs::symlink(&target, &data).expect("..data back");
        assert_eq!(keys.check_now(), KeyReload::Unchanged);

        // An empty key file.
        volume.update(&[
            ("cloud-config", &cloud_config("new-api", "unused")),
            ("secret-key", "\n"),
        ]);
        for _ in 0..3 {
            assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        }
        assert_eq!(warnings("is empty"), 1);

        // A cloud-config cut short while written in place (not the kubelet's way).
        std::fs::write(volume.path("secret-key"), "new-secret\n").expect("secret written");
        std::fs::write(
            volume.path("cloud-config"),
            format!("[Global]\napi-url = {URL}\napi-"),
        )
        .expect("half a cloud-config");
        for _ in 0..3 {
            assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        }
        // And an empty key in it.
        std::fs::write(
            volume.path("cloud-config"),
            format!("[Global]\napi-url = {URL}\napi-key =\n"),
        )
        .expect("an empty api-key");
        assert_eq!(pair(&keys), owned("old-api", "old-secret"));
        assert_eq!(warnings("api-key"), 2, "each broken version said once");
        assert_eq!(keys.reloads(), 0);

        std::fs::write(
            volume.path("cloud-config"),
            cloud_config("new-api", "unused"),
        )
        .expect("the whole cloud-config");
        assert_eq!(pair(&keys), owned("new-api", "new-secret"));
        assert_eq!(keys.reloads(), 1);
    }

    #[test]
    fn keys_from_the_environment_are_not_files_and_a_debug_print_shows_none() {
        let files = KeyFiles {
            cloud_config: "/nonexistent/cloud-config".into(),
            api_key: KeyOrigin::Given("env-api-key".into()),
            secret_key: KeyOrigin::Given("env-secret-key".into()),
        };
        assert!(files.watched().is_empty());
        let shown = format!("{files:?}");
        assert!(
            !shown.contains("env-api-key") && !shown.contains("env-secret-key"),
            "{shown}"
        );
    }
}
