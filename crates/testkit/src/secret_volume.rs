//! A Secret volume laid out and updated as the kubelet does it (`AtomicWriter` in
//! `k8s.io/kubernetes/pkg/volume/util/atomic_writer.go`), so that a test swaps mounted files
//! exactly the way a Secret update reaches a pod:
//!
//! ```text
//! ..2026_12_06_12_00_00.000000001/api-key     the files of one version
//! ..data -> ..2026_12_06_12_00_00.000000001
//! api-key -> ..data/api-key                   what the container opens
//! ```
//!
//! An update writes the new version into a new timestamped directory, makes a `..data_tmp`
//! symlink to it, renames that over `..data` (the one atomic step), then removes the old
//! directory. A reader that opens `api-key` sees the old file or the new one, never half of one.

use crate::certs::TempDir;
use std::path::{Path, PathBuf};

/// A mounted Secret volume in a temporary directory (removed when dropped).
pub struct SecretVolume {
    dir: TempDir,
    /// The timestamped directory `..data` points at now.
    current: String,
    /// Versions written so far, for the next directory's name.
    versions: u32,
    /// The files the volume shows (their user-visible symlinks).
    names: Vec<String>,
    /// Versions `..data` no longer points at, removed by [`SecretVolume::finish`].
    old_versions: Vec<String>,
}

impl SecretVolume {
    /// A volume holding `files` (name, content) as its first version.
    pub fn new(name: &str, files: &[(&str, &str)]) -> SecretVolume {
        let mut volume = SecretVolume {
            dir: TempDir::new(name),
            current: String::new(),
            versions: 0,
            names: Vec::new(),
            old_versions: Vec::new(),
        };
        volume.update(files);
        volume
    }

    /// The path a container opens for `file` (the symlink through `..data`).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path(file)
    }

    /// The volume's directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path("")
    }

    /// The Secret's content becomes `files`, as the kubelet updates it: the new version in a
    /// new directory, `..data` swapped to it in one rename, the old version removed.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        let version = self.write_version(files);
        self.swap_data(&version);
        self.finish(files);
    }

    /// The first step of an update alone: the new version written, `..data` not swapped yet
    /// (the files the container opens are still the old ones). [`SecretVolume::swap_data`]
    /// and [`SecretVolume::finish`] are the rest.
    pub fn write_version(&mut self, files: &[(&str, &str)]) -> String {
        self.versions += 1;
        let version = format!("..2026_12_06_12_00_00.{:09}", self.versions);
        let dir = self.dir.path(&version);
        std::fs::create_dir_all(&dir).expect("version directory");
        for (name, content) in files {
            std::fs::write(dir.join(name), content).expect("secret file");
        }
        version
    }

    /// `..data` pointed at `version` through a `..data_tmp` symlink renamed over it.
    pub fn swap_data(&mut self, version: &str) {
        let tmp = self.dir.path("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(Path::new(version), &tmp);
        std::fs::rename(&tmp, self.dir.path("..data")).expect("swap ..data");
        let old = std::mem::replace(&mut self.current, version.to_string());
        if !old.is_empty() {
            self.old_versions.push(old);
        }
    }

    /// The end of an update: a symlink for each new file name, none for a file gone, and the
    /// old versions removed.
    pub fn finish(&mut self, files: &[(&str, &str)]) {
        let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
        for name in &names {
            let link = self.dir.path(name);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(&Path::new("..data").join(name), &link);
            }
        }
        for gone in self.names.iter().filter(|n| !names.contains(n)) {
            let _ = std::fs::remove_file(self.dir.path(gone));
        }
        self.names = names;
        for old in std::mem::take(&mut self.old_versions) {
            let _ = std::fs::remove_dir_all(self.dir.path(&old));
        }
    }
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}
