//! The deployment examples of docs/deploy/ (see docs/deploy.md) are valid:
//! the YAML files parse and hold what the page says, the systemd drop-in
//! passes `systemd-analyze verify` on a unit it extends, the collector
//! configuration passes the test collector's `validate`. A check whose
//! tool is missing is skipped with one line.

use osprey_testkit::paths::{osprey, otelcol, workspace_root};
use osprey_testkit::tempdir;
use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    workspace_root().join("docs/deploy").join(name)
}

/// `python3` with PyYAML prints `expr` evaluated on the document `y`.
fn yaml(file: &str, expr: &str) -> Option<String> {
    let script = format!("import json,sys,yaml\ny=yaml.safe_load(open(sys.argv[1]))\nprint(json.dumps({expr}))");
    let o = Command::new("python3").arg("-c").arg(script).arg(example(file)).output().ok()?;
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("No module named 'yaml'") {
        eprintln!("skipped: python3 has no PyYAML");
        return None;
    }
    assert!(o.status.success(), "{file}: {}", String::from_utf8_lossy(&o.stderr));
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[test]
fn the_pod_has_the_downward_api_variables_and_attach_capabilities() {
    let Some(env) = yaml("pod.yaml", "{e['name']: e['valueFrom']['fieldRef']['fieldPath'] for e in y['spec']['containers'][0]['env'] if 'valueFrom' in e}") else { return };
    assert_eq!(
        env,
        r#"{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "NODE_NAME": "spec.nodeName"}"#
    );
    let caps = yaml("pod.yaml", "y['spec']['containers'][1]['securityContext']['capabilities']['add']").unwrap();
    assert!(caps.contains("SYS_PTRACE"), "{caps}");
    assert_eq!(yaml("pod.yaml", "y['spec']['shareProcessNamespace']").unwrap(), "true");
}

#[test]
fn the_collector_pipeline_is_valid() {
    let Some(p) = yaml("collector.yaml", "y['service']['pipelines']['profiles']") else { return };
    assert_eq!(p, r#"{"receivers": ["otlp"], "exporters": ["debug"]}"#);
    let Some(col) = otelcol() else { return };
    let o = Command::new(col)
        .args(["validate", "--feature-gates=service.profilesSupport", "--config"])
        .arg(example("collector.yaml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_systemd_drop_in_verifies() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("skipped: no systemd-analyze");
        return;
    }
    // The unit it extends, and the drop-in with its programs made ones that exist here.
    let dir = tempdir("systemd");
    std::fs::write(dir.join("shop-api.service"), "[Unit]\nDescription=shop\n[Service]\nExecStart=/bin/true\n").unwrap();
    std::fs::create_dir(dir.join("shop-api.service.d")).unwrap();
    let conf = std::fs::read_to_string(example("osprey.conf")).unwrap();
    assert!(conf.contains("\nExecStart=\n"), "the drop-in clears the unit's ExecStart");
    let conf = conf
        .replace("/usr/local/bin/osprey", osprey().to_str().unwrap())
        .replace("/usr/local/bin/shop-api", "/bin/true");
    std::fs::write(dir.join("shop-api.service.d/osprey.conf"), conf).unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.join("shop-api.service"))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("shop-api"), "systemd-analyze verify: {err}");
}

#[test]
fn the_image_entrypoint_runs_osprey_exec() {
    let file = std::fs::read_to_string(example("Dockerfile")).unwrap();
    let line = file.lines().find_map(|l| l.strip_prefix("ENTRYPOINT ")).expect("an ENTRYPOINT");
    let argv: Vec<String> = serde_json::from_str(line).expect("exec form: a JSON array");
    assert_eq!(&argv[..3], ["/usr/local/bin/osprey", "exec", "--otlp"]);
    assert!(argv.contains(&"--".to_string()));
}
