//! [`Deployment`]: where the profiled process runs (container, Kubernetes
//! pod, node), read from the *target's* `/proc/PID/cgroup` and
//! `/proc/PID/environ` (so `attach` reports the attached process's, not
//! osprey's), and how each backend names it.
//!
//! | fact | from | OTLP resource | Datadog tag | Pyroscope label / pprof comment |
//! |---|---|---|---|---|
//! | container id | cgroup path (`osprey_procfs::cgroup`) | `container.id` | `container_id` | `container_id` |
//! | pod uid | cgroup path | `k8s.pod.uid` | (none) | `pod_uid` (comment only) |
//! | pod name | `k8s.pod.name` in `OTEL_RESOURCE_ATTRIBUTES`, else `POD_NAME` | `k8s.pod.name` | `pod_name` | `pod` |
//! | namespace | `k8s.namespace.name`, else `POD_NAMESPACE` | `k8s.namespace.name` | `kube_namespace` | `namespace` |
//! | node | `k8s.node.name`, else `NODE_NAME` | `k8s.node.name` | `kube_node` | `node` |
//!
//! The pod uid is left out of Pyroscope's series labels: it changes with
//! every pod, like the pod name, but adds nothing the name does not tell.

/// The container and Kubernetes facts of one process; every field may be
/// missing (a process on a host, a container with a private cgroup namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deployment {
    /// The container's 64-hex-digit id.
    pub container_id: Option<String>,
    /// The pod's uid.
    pub pod_uid: Option<String>,
    /// The pod's name.
    pub pod_name: Option<String>,
    /// The pod's namespace.
    pub namespace: Option<String>,
    /// The node's name.
    pub node_name: Option<String>,
}

impl Deployment {
    /// The facts of process `pid` (this process for `pid <= 0`); what
    /// cannot be read is missing.
    pub fn of(pid: i32) -> Deployment {
        let cgroup = osprey_procfs::cgroup::read(pid).unwrap_or_default();
        if pid <= 0 || pid as u32 == std::process::id() {
            // Its own environment is at hand: no `/proc` read, no parse of the whole block.
            return Deployment::from_vars(&cgroup, |k| std::env::var(k).ok());
        }
        let environ = osprey_procfs::read_file(&osprey_procfs::proc_dir(pid).join("environ")).unwrap_or_default();
        Deployment::parse(&cgroup, &environ)
    }

    /// From a `/proc/PID/cgroup` text and a `/proc/PID/environ` block
    /// (`KEY=value` entries separated by NUL bytes; the first of a repeated
    /// key counts, as `getenv` finds it).
    pub fn parse(cgroup: &str, environ: &[u8]) -> Deployment {
        let var = |key: &str| {
            environ.split(|b| *b == 0).find_map(|kv| {
                let v = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
                Some(String::from_utf8_lossy(v).into_owned())
            })
        };
        Deployment::from_vars(cgroup, var)
    }

    /// From a cgroup text and a lookup of the process's environment variables.
    fn from_vars(cgroup: &str, var: impl Fn(&str) -> Option<String>) -> Deployment {
        let placement = osprey_procfs::cgroup::parse(cgroup);
        let otel: Vec<(String, String)> =
            var("OTEL_RESOURCE_ATTRIBUTES").map(|a| crate::config::resource_attributes(&a)).unwrap_or_default();
        let pick = |attr: &str, name: &str| {
            otel.iter().find(|(k, _)| k == attr).map(|(_, v)| v.clone()).or_else(|| var(name)).filter(|v| !v.is_empty())
        };
        Deployment {
            container_id: placement.container_id.map(str::to_string),
            pod_uid: placement.pod_uid.map(|u| u.as_str().to_string()).or_else(|| pick("k8s.pod.uid", "POD_UID")),
            pod_name: pick("k8s.pod.name", "POD_NAME"),
            namespace: pick("k8s.namespace.name", "POD_NAMESPACE"),
            node_name: pick("k8s.node.name", "NODE_NAME"),
        }
    }

    /// `(name, value)` of the facts present, with `names` giving each
    /// fact's name in order (container id, pod uid, pod name, namespace,
    /// node); a `None` name leaves the fact out.
    fn named(&self, names: [Option<&'static str>; 5]) -> Vec<(&'static str, String)> {
        let values = [&self.container_id, &self.pod_uid, &self.pod_name, &self.namespace, &self.node_name];
        names.into_iter().zip(values).filter_map(|(n, v)| Some((n?, v.clone()?))).collect()
    }

    /// OpenTelemetry semantic-convention resource attributes.
    pub fn otel_attributes(&self) -> Vec<(&'static str, String)> {
        self.named([
            Some("container.id"),
            Some("k8s.pod.uid"),
            Some("k8s.pod.name"),
            Some("k8s.namespace.name"),
            Some("k8s.node.name"),
        ])
    }

    /// Datadog's names (its Kubernetes tag extraction's).
    pub fn datadog_tags(&self) -> Vec<(&'static str, String)> {
        self.named([Some("container_id"), None, Some("pod_name"), Some("kube_namespace"), Some("kube_node")])
    }

    /// Pyroscope series labels (Grafana's Kubernetes label names).
    pub fn pyroscope_labels(&self) -> Vec<(&'static str, String)> {
        self.named([Some("container_id"), None, Some("pod"), Some("namespace"), Some("node")])
    }

    /// `key=value` comments for a profile file, with the OTel names.
    pub fn comments(&self) -> Vec<String> {
        self.otel_attributes().into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "1f3c5a7e9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f2a4c6e8b0d1f3a";

    #[test]
    fn cgroup_and_downward_api_variables() {
        let cgroup = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8a1e3b5d_7f9c_4e2a_b6d8_0f1a3c5e7b9d.slice/cri-containerd-{ID}.scope\n"
        );
        let env = b"PATH=/bin\0POD_NAME=web-7d4b9c\0POD_NAMESPACE=shop\0NODE_NAME=node-3\0";
        let d = Deployment::parse(&cgroup, env);
        assert_eq!(
            d.otel_attributes(),
            vec![
                ("container.id", ID.to_string()),
                ("k8s.pod.uid", "8a1e3b5d-7f9c-4e2a-b6d8-0f1a3c5e7b9d".to_string()),
                ("k8s.pod.name", "web-7d4b9c".to_string()),
                ("k8s.namespace.name", "shop".to_string()),
                ("k8s.node.name", "node-3".to_string()),
            ]
        );
        let dd: Vec<String> = d.datadog_tags().into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
        assert_eq!(
            dd,
            [
                format!("container_id:{ID}"),
                "pod_name:web-7d4b9c".into(),
                "kube_namespace:shop".into(),
                "kube_node:node-3".into()
            ]
        );
        let py: Vec<&str> = d.pyroscope_labels().into_iter().map(|(k, _)| k).collect();
        assert_eq!(py, ["container_id", "pod", "namespace", "node"]);
    }

    #[test]
    fn otel_resource_attributes_win_over_the_plain_variables() {
        let env = b"OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=from-otel,k8s.namespace.name=ns%20a\0POD_NAME=plain\0";
        let d = Deployment::parse("0::/\n", env);
        assert_eq!(d.pod_name.as_deref(), Some("from-otel"));
        assert_eq!(d.namespace.as_deref(), Some("ns a"), "values are percent-decoded");
        assert_eq!(d.container_id, None);
        assert_eq!(d.comments(), ["k8s.pod.name=from-otel", "k8s.namespace.name=ns a"]);
    }

    /// Its own process's facts come from its environment, as `/proc` has them.
    #[test]
    fn own_process_reads_as_its_proc_files() {
        let cgroup = osprey_procfs::cgroup::read(0).unwrap_or_default();
        let environ = osprey_procfs::read_file(std::path::Path::new("/proc/self/environ")).unwrap();
        assert_eq!(Deployment::of(0), Deployment::parse(&cgroup, &environ));
    }

    #[test]
    fn a_host_process_has_nothing() {
        let d = Deployment::parse("0::/user.slice/user-1000.slice/session-3.scope\n", b"HOME=/root\0POD_NAME=\0");
        assert_eq!(d, Deployment::default());
        assert!(d.otel_attributes().is_empty() && d.comments().is_empty());
    }
}
