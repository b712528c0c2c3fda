//! The cgroup v2 leaf of one run of the command, where one can be made.

use std::io;
use std::path::{Path, PathBuf};

/// A cgroup v2 leaf made for one run of the command.
#[derive(Debug, Clone)]
pub(crate) struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Makes the leaf `name` under this process's own cgroup v2, if there is a cgroup2 mount
    /// and it can be written. The error says why not, for the log.
    pub(crate) fn create(name: &str) -> Result<Cgroup, String> {
        let own = own_cgroup_dir()?;
        let path = own.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        // Before Linux 5.14 there is no cgroup.kill: the leaf still contains, and its processes
        // are killed one by one.
        Ok(Cgroup { path })
    }

    /// Removes the empty leaves `leasehold-PID-TERM` under this process's cgroup whose
    /// `leasehold run` (PID) is gone: it and its guard were killed together, so nobody removed
    /// them. A leaf that still holds a process stays (the kernel refuses to remove it).
    pub(crate) fn sweep_stale() {
        let Ok(own) = own_cgroup_dir() else { return };
        let Ok(entries) = std::fs::read_dir(&own) else { return };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("leasehold-"))
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, _)| pid.parse::<i32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                Cgroup::at(entry.path()).remove();
            }
        }
    }

    /// A leaf made by someone else (`run`, for the guard).
    pub(crate) fn at(path: impl Into<PathBuf>) -> Cgroup {
        Cgroup { path: path.into() }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the kernel can kill the whole leaf in one step (`cgroup.kill`, Linux 5.14).
    pub(crate) fn can_kill(&self) -> bool {
        self.path.join("cgroup.kill").exists()
    }

    /// Moves the calling process into the leaf (what it starts afterwards is born there).
    pub(crate) fn enter(&self) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), "0")
    }

    /// The pids in the leaf and in any cgroup below it.
    pub(super) fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.path.clone()];
        while let Some(dir) = dirs.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        pids
    }

    /// Whether any process is left in the leaf or below it (`None`: cannot tell).
    pub(super) fn populated(&self) -> Option<bool> {
        let events = std::fs::read_to_string(self.path.join("cgroup.events")).ok()?;
        events
            .lines()
            .find_map(|line| line.strip_prefix("populated "))
            .map(|value| value.trim() != "0")
    }

    /// SIGKILL to every process in the leaf and below, by the kernel, in one step.
    pub(super) fn kill(&self) -> bool {
        std::fs::write(self.path.join("cgroup.kill"), "1").is_ok()
    }

    /// Removes the leaf (and any cgroups the command made below it) once it is empty.
    pub(crate) fn remove(&self) {
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.filter_map(Result::ok) {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&entry.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.path);
    }
}

/// This process's cgroup v2 directory: the cgroup2 mount point joined with the path in
/// `/proc/self/cgroup` (the `0::` line).
fn own_cgroup_dir() -> Result<PathBuf, String> {
    let cgroups =
        std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let own = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 hierarchy")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let (root, mount_point) = cgroup2_mount(&mounts).ok_or("no cgroup2 file system is mounted")?;
    // A mount of a subtree (a container's cgroup namespace shows "/") holds the paths below its root.
    let relative = own.strip_prefix(root.as_str()).unwrap_or(own).trim_start_matches('/');
    if own.contains("/../") || own.ends_with("/..") {
        return Err(format!(
            "this process's cgroup {own} is outside the mounted cgroup2 tree"
        ));
    }
    Ok(Path::new(&mount_point).join(relative))
}

/// The root and mount point of the first cgroup2 mount in `/proc/self/mountinfo`.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        if fstype != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = before.split_whitespace().collect();
        Some((unescape(fields.get(3)?), unescape(fields.get(4)?)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup2_mounts_are_found() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(("/".to_string(), "/sys/fs/cgroup/unified".to_string()))
        );
        assert_eq!(cgroup2_mount("30 25 0:26 / /x rw - ext4 /dev/sda rw"), None);
    }
}
