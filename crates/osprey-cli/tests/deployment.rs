//! Container and Kubernetes metadata end to end: a program run inside a
//! cgroup named like a Docker container's systemd scope, with the downward
//! API's variables, gets `container.id` and the pod in its profile's
//! comments and in the Datadog tags; `attach` reports the target's, not
//! osprey's. Needs a writable cgroup v2 hierarchy (root); skipped with one
//! line without one.

use osprey_testkit::backends::{multipart, ok, Receiver};
use osprey_testkit::profile::expect_profiles;
use osprey_testkit::python::interpreter;
use osprey_testkit::{osprey, tempdir};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A new cgroup `docker-<id>.scope` under the first writable cgroup v2
/// mount, removed on drop.
struct Scope {
    dir: PathBuf,
    id: String,
}

impl Scope {
    fn new() -> Option<Scope> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let root =
            mounts.lines().map(|l| l.split(' ').collect::<Vec<_>>()).find(|f| f.len() > 2 && f[2] == "cgroup2")?[1]
                .to_string();
        let seed = osprey_testkit::tmp::unique_name("cg");
        // 64 hex digits from the unique name (FNV-1a of it, four times salted).
        let id: String = (0..4u64)
            .map(|salt| {
                let h = seed
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64 ^ salt, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
                format!("{h:016x}")
            })
            .collect();
        let dir = PathBuf::from(root).join(format!("docker-{id}.scope"));
        std::fs::create_dir(&dir).ok()?;
        Some(Scope { dir, id })
    }

    /// `cmd` run through `sh`, which first moves itself into this cgroup.
    fn command(&self, cmd: &[&str]) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(format!("echo $$ > {}/cgroup.procs && exec \"$@\"", self.dir.display())).arg("sh").args(cmd);
        c
    }

    /// `cmd` run in this cgroup with the downward API's pod variables;
    /// fails the test unless it succeeds.
    fn run_in_pod(&self, cmd: &[&str]) {
        let r = self
            .command(cmd)
            .env("POD_NAME", "web-7d4b9c")
            .env("POD_NAMESPACE", "shop")
            .env("NODE_NAME", "node-3")
            .output()
            .unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        // Empty once its processes have exited.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn comments(dir: &std::path::Path) -> Vec<String> {
    let ps = expect_profiles(dir);
    ps.iter().flat_map(|p| p.comment.iter().map(|&c| p.string_table[c as usize].clone())).collect()
}

#[test]
fn exec_in_a_container_names_the_container_and_the_pod() {
    let Some(scope) = Scope::new() else {
        eprintln!("skipped: no writable cgroup v2 hierarchy to make a container scope in");
        return;
    };
    let demo = osprey().parent().unwrap().join("osprey-demo");
    let (osprey, demo) = (osprey(), demo);
    let (o, d) = (osprey.to_str().unwrap(), demo.to_str().unwrap());
    let want = [
        format!("container.id={}", scope.id),
        "k8s.pod.name=web-7d4b9c".to_string(),
        "k8s.namespace.name=shop".to_string(),
        "k8s.node.name=node-3".to_string(),
    ];
    // Files only: the agent writes them itself.
    let out = tempdir("cg-files");
    scope.run_in_pod(&[o, "exec", "-q", "--out", out.to_str().unwrap(), "--", d, "--threads", "1", "--seconds", "0.5"]);
    let c = comments(&out);
    for w in &want {
        assert!(c.contains(w), "{w} in the comments: {c:?}");
    }
    // A tree: its agents leave the container and pod to `osprey exec`'s merge.
    let out = tempdir("cg-tree");
    let script = format!("{d} --threads 1 --seconds 0.3; /bin/true");
    scope.run_in_pod(&[o, "exec", "-q", "--children", "--out", out.to_str().unwrap(), "--", "/bin/sh", "-c", &script]);
    let c = comments(&out);
    for w in &want {
        assert_eq!(c.iter().filter(|x| *x == w).count(), 1, "{w} once in the comments: {c:?}");
    }
    // A backend as well: the Datadog tags, under Datadog's names.
    let dd = Receiver::start(|_, _| ok());
    let out = tempdir("cg-dd");
    let r = scope
        .command(&[o, "exec", "-q", "--out", out.to_str().unwrap(), "--datadog", &dd.url, "--", d, "--seconds", "0.5"])
        .env("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=web-7d4b9c,k8s.namespace.name=shop")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let c = comments(&out);
    assert!(c.contains(&want[0]) && c.contains(&want[1]) && c.contains(&want[2]), "{c:?}");
    let reqs = dd.wait_for(1, Duration::from_secs(5));
    assert!(!reqs.is_empty());
    for q in &reqs {
        let parts = multipart(q.header("Content-Type").unwrap(), &q.body);
        let event: serde_json::Value = serde_json::from_slice(&parts[0].3).unwrap();
        let tags: Vec<&str> = event["tags_profiler"].as_str().unwrap().split(',').collect();
        let container = format!("container_id:{}", scope.id);
        for t in [container.as_str(), "pod_name:web-7d4b9c", "kube_namespace:shop"] {
            assert!(tags.contains(&t), "{t} in {tags:?}");
        }
    }
}

#[test]
fn attach_reports_the_targets_container_not_osprey_s() {
    let Some(py) = interpreter("3.11") else { return };
    let Some(scope) = Scope::new() else {
        eprintln!("skipped: no writable cgroup v2 hierarchy to make a container scope in");
        return;
    };
    let py = py.to_str().unwrap().to_string();
    let mut target = scope
        .command(&[&py, "-c", "import time\nt=time.time()\nwhile time.time()-t < 20: sum(range(1000))"])
        .env("POD_NAME", "target-pod")
        .spawn()
        .unwrap();
    // The target is in the scope once its shell has exec'd the interpreter.
    let pid = target.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.to_string_lossy().contains("python"))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = tempdir("cg-attach");
    let r = Command::new(osprey())
        .args(["attach", "-q", "--pid", &pid.to_string(), "--duration", "1", "--out", out.to_str().unwrap()])
        .env("POD_NAME", "osprey-own-pod")
        .output()
        .unwrap();
    let _ = target.kill();
    let _ = target.wait();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let c = comments(&out);
    assert!(c.contains(&format!("container.id={}", scope.id)), "{c:?}");
    assert!(c.contains(&"k8s.pod.name=target-pod".to_string()), "{c:?}");
    assert!(!c.iter().any(|x| x.contains("osprey-own-pod")), "{c:?}");
}
