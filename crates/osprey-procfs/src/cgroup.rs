//! `/proc/PID/cgroup`: the container and Kubernetes pod a process runs in.
//!
//! Each line is `hierarchy-id:controllers:path` (cgroup v1: one line per
//! hierarchy; v2: the single line `0::path`). Container runtimes name the
//! cgroup of a container after its 64-hex-digit id:
//!
//! | runtime | cgroupfs driver | systemd driver |
//! |---|---|---|
//! | Docker | `/docker/<id>` | `/system.slice/docker-<id>.scope` |
//! | containerd (CRI) | `/kubepods/<qos>/pod<uid>/<id>` | `.../cri-containerd-<id>.scope` |
//! | CRI-O | `/kubepods/<qos>/pod<uid>/crio-<id>` | `.../crio-<id>.scope` |
//! | Podman | `/libpod_parent/libpod-<id>` | `.../libpod-<id>.scope[/container]` |
//!
//! and Kubernetes names the pod's cgroup after its uid: `pod<uid>` under
//! `/kubepods[/<qos>]`, or `kubepods[-<qos>]-pod<uid with _ for ->.slice`.
//!
//! Invariants: parsing borrows its input and never allocates or panics; an
//! id is taken only when it has exactly the expected form (64 lowercase hex
//! digits, a canonical UUID), so a monitor scope such as `crio-conmon-<id>`
//! or `libpod-conmon-<id>` is never mistaken for the container. Inside a
//! private cgroup namespace (Docker's default on cgroup v2) the path is `/`
//! and nothing can be told from this file.

use std::io;

/// What the cgroup paths tell, borrowing the container id from the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement<'a> {
    /// The container's 64-hex-digit id.
    pub container_id: Option<&'a str>,
    /// The Kubernetes pod's uid.
    pub pod_uid: Option<PodUid>,
}

/// A pod uid in canonical form (`8-4-4-4-12` lowercase hex digits), held
/// by value since the systemd form writes it with `_` for `-`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PodUid([u8; 36]);

impl PodUid {
    /// The uid as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits and '-' are ever stored (see `parse`).
        std::str::from_utf8(&self.0).unwrap_or("")
    }

    /// `text` with `_` read as `-`, if it is a UUID.
    fn parse(text: &str) -> Option<PodUid> {
        let b = text.as_bytes();
        if b.len() != 36 {
            return None;
        }
        let mut out = [0u8; 36];
        for (i, (&c, o)) in b.iter().zip(out.iter_mut()).enumerate() {
            let dash = matches!(i, 8 | 13 | 18 | 23);
            *o = match c {
                b'-' | b'_' if dash => b'-',
                b'0'..=b'9' | b'a'..=b'f' if !dash => c,
                _ => return None,
            };
        }
        Some(PodUid(out))
    }
}

impl std::fmt::Debug for PodUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Prefixes runtimes put before a container id in a cgroup's name.
const RUNTIME_PREFIXES: [&str; 5] = ["docker-", "cri-containerd-", "crio-", "libpod-", "containerd-"];

/// Parses a whole `/proc/PID/cgroup` text. The first line naming a
/// container wins for the id, likewise for the pod uid.
pub fn parse(text: &str) -> Placement<'_> {
    let mut p = Placement::default();
    for line in text.lines() {
        // The path is everything after the second ':' (it may contain ':').
        let Some(path) = line.splitn(3, ':').nth(2) else { continue };
        let found = parse_path(path);
        p.container_id = p.container_id.or(found.container_id);
        p.pod_uid = p.pod_uid.or(found.pod_uid);
    }
    p
}

/// Parses one cgroup path: the deepest component that is a container id,
/// and the pod uid of a Kubernetes pod component.
pub fn parse_path(path: &str) -> Placement<'_> {
    let mut p = Placement::default();
    let kubepods = path.contains("kubepods");
    for part in path.split('/').rev() {
        if p.container_id.is_none() {
            p.container_id = container_id(part);
        }
        if p.pod_uid.is_none() && kubepods {
            p.pod_uid = pod_uid(part);
        }
    }
    p
}

/// `<id>`, `<prefix><id>` or `<prefix><id>.scope`, with `<id>` 64 hex digits.
fn container_id(part: &str) -> Option<&str> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    let id = RUNTIME_PREFIXES.iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))).then_some(id)
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice`
/// (systemd; also under a `kubelet-` prefix).
fn pod_uid(part: &str) -> Option<PodUid> {
    if let Some(uid) = part.strip_prefix("pod") {
        return PodUid::parse(uid);
    }
    let slice = part.strip_suffix(".slice")?;
    let (_, uid) = slice.rsplit_once("-pod")?;
    PodUid::parse(uid)
}

/// Reads `/proc/<pid>/cgroup` (`/proc/self/cgroup` for `pid <= 0`).
pub fn read(pid: i32) -> io::Result<String> {
    String::from_utf8(crate::read_file(&crate::proc_dir(pid).join("cgroup"))?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/cgroup/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn ids(name: &str) -> (Option<String>, Option<String>) {
        let text = fixture(name);
        let p = parse(&text);
        (p.container_id.map(str::to_string), p.pod_uid.map(|u| u.as_str().to_string()))
    }

    const DOCKER: &str = "5c1ba3a3e1c2e9b8f0f7de3e0bd7b0c5f6a3c8a0e4b2d1f9e8c7b6a5d4c3b2a1";

    #[test]
    fn docker() {
        for f in ["docker-v1-cgroupfs.txt", "docker-v1-systemd.txt", "docker-v2-systemd.txt", "docker-v2-cgroupfs.txt"]
        {
            assert_eq!(ids(f), (Some(DOCKER.into()), None), "{f}");
        }
    }

    #[test]
    fn private_cgroup_namespace_tells_nothing() {
        assert_eq!(ids("docker-v2-cgroupns-private.txt"), (None, None));
        assert_eq!(ids("host-v2-user-session.txt"), (None, None));
        assert_eq!(ids("host-v1-systemd.txt"), (None, None));
    }

    #[test]
    fn kubernetes() {
        let cases = [
            (
                "containerd-v1-cgroupfs-burstable.txt",
                "1f3c5a7e9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f2a4c6e8b0d1f3a",
                "8a1e3b5d-7f9c-4e2a-b6d8-0f1a3c5e7b9d",
            ),
            (
                "containerd-v2-systemd-burstable.txt",
                "1f3c5a7e9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f2a4c6e8b0d1f3a",
                "8a1e3b5d-7f9c-4e2a-b6d8-0f1a3c5e7b9d",
            ),
            (
                "containerd-v2-systemd-guaranteed.txt",
                "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d",
                "c4e6a8b0-2d4f-4a6c-8e0b-2d4f6a8c0e1b",
            ),
            (
                "crio-v2-systemd-besteffort.txt",
                "3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c1e3b5d",
                "2f4a6c8e-0b2d-4f6a-8c0e-1b3d5f7a9c2e",
            ),
            (
                "crio-v1-systemd.txt",
                "3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c1e3b5d",
                "2f4a6c8e-0b2d-4f6a-8c0e-1b3d5f7a9c2e",
            ),
            (
                "kind-v2-kubelet-slice.txt",
                "7a9c1e3b5d7f9a2c4e6b8d0f2a4c6e8b0d2f4a6c8e0b2d4f6a8c0e2b4d6f8a0c",
                "5d7f9a1c-3e5b-4d9f-8a1c-3e5b7d9f1a3c",
            ),
        ];
        for (f, container, pod) in cases {
            assert_eq!(ids(f), (Some(container.into()), Some(pod.into())), "{f}");
        }
    }

    #[test]
    fn podman() {
        let id = "d2f4a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4";
        for f in ["podman-v2-rootless.txt", "podman-v2-root-container-subgroup.txt", "podman-v1-cgroupfs.txt"] {
            assert_eq!(ids(f), (Some(id.into()), None), "{f}");
        }
    }

    #[test]
    fn monitors_and_near_misses_are_not_containers() {
        // conmon's own scope names the container but is not in it.
        assert_eq!(ids("crio-conmon-v2.txt").0, None);
        assert_eq!(ids("podman-conmon-v2.txt").0, None);
        assert_eq!(parse_path("/docker/5c1ba3a3").container_id, None);
        assert_eq!(parse_path(&format!("/docker/{}", DOCKER.to_uppercase())).container_id, None);
        assert_eq!(parse_path("/kubepods/burstable/podnot-a-uid/x").pod_uid, None);
        // A `pod...` directory outside kubepods is not a pod.
        assert_eq!(parse_path("/user.slice/pod8a1e3b5d-7f9c-4e2a-b6d8-0f1a3c5e7b9d").pod_uid, None);
        assert_eq!(parse(""), Placement::default());
        assert_eq!(parse("garbage\n::\n0:"), Placement::default());
    }
}
