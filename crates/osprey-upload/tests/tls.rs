//! `https://` backends and proxies, on loopback: a certificate authority
//! and a server certificate made with `openssl`, a Python HTTPS backend
//! (`py/tls_server.py`) and a Python CONNECT proxy (`py/connect_proxy.py`).
//! - with `SSL_CERT_FILE` naming the authority, the profile is delivered;
//!   without it the server is refused (unknown issuer), retried, never sent;
//! - `HTTPS_PROXY` tunnels the request through the proxy; `NO_PROXY`
//!   naming the host goes around it;
//! - an `SSL_CERT_FILE` without certificates is a one-line configuration error.
//!
//! One test: it sets proxy variables in this process.

use osprey_testkit::backends::*;
use osprey_upload::{Flags, Language, Meta, UploadConfig, Uploader};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver as Lines};
use std::time::Duration;

fn openssl(dir: &Path, args: &str) {
    let st = Command::new("openssl").current_dir(dir).args(args.split_whitespace()).stderr(Stdio::null()).status();
    assert!(st.expect("openssl (Debian package openssl)").success(), "openssl {args}");
}

/// A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, srv.pem, srv.key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(dir, &format!("req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=osprey-test-ca"));
    openssl(dir, &format!("req {ec} -keyout srv.key -out srv.csr -subj /CN=127.0.0.1"));
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        "x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile ext.cnf",
    );
    (dir.join("ca.pem"), dir.join("srv.pem"), dir.join("srv.key"))
}

/// Starts a Python helper; returns it, its port and its later output lines.
fn python(script: &str, args: &[&Path]) -> (Child, u16, Lines<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py").join(script);
    let mut child = Command::new("python3").arg(path).args(args).stdout(Stdio::piped()).spawn().expect("python3");
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = out.next().unwrap().unwrap().trim().parse().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in out.map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    (child, port, rx)
}

fn config(url: &str, vars: &[(&str, String)]) -> Result<UploadConfig, String> {
    let flags = Flags { pyroscope: Some(url.into()), service: Some("svc".into()), ..Default::default() };
    let vars = vars.to_vec();
    let mut c =
        UploadConfig::resolve(&flags, "test", &move |k| vars.iter().find(|(v, _)| *v == k).map(|(_, x)| x.clone()))
            .map_err(|e| e.to_string())?;
    c.retry_base = Duration::from_millis(50);
    c.retry_max = Duration::from_millis(200);
    c.timeout = Duration::from_secs(3);
    Ok(c)
}

/// Sends one profile; returns the uploader's stats after at most `wait`.
fn send(cfg: UploadConfig, wait: Duration) -> osprey_upload::BackendStats {
    let mut u = Uploader::start(cfg, Meta::new("rt-tls", 1, Language::Native), Duration::from_secs(60));
    u.submit_profile(&osprey_pprof::to_pprof(&profile(20, 1, false)));
    u.shutdown(wait).remove(0)
}

fn drain(rx: &Lines<String>) -> Vec<String> {
    let mut v = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(300)) {
        v.push(l);
    }
    v
}

#[test]
fn https_backends_with_authorities_and_proxies() {
    let dir = osprey_testkit::tempdir("tls");
    let (ca, srv, key) = certificates(&dir);
    let (mut server, port, received) = python("tls_server.py", &[&srv, &key]);
    let url = format!("https://127.0.0.1:{port}");
    let ca_var = [("SSL_CERT_FILE", ca.display().to_string())];

    // Trusted through SSL_CERT_FILE.
    let s = send(config(&url, &ca_var).unwrap(), Duration::from_secs(5));
    assert_eq!(s.delivered, 1, "{s:?}");
    let got = drain(&received);
    assert!(got.iter().any(|l| l.starts_with("POST /ingest?")), "{got:?}");

    // Not trusted by the system bundle: refused, never delivered.
    let s = send(config(&url, &[]).unwrap(), Duration::from_millis(800));
    assert_eq!(s.delivered, 0, "{s:?}");
    let why = s.last_error.unwrap_or_default();
    assert!(why.to_lowercase().contains("certificate") || why.contains("UnknownIssuer"), "{why}");
    assert!(drain(&received).is_empty());

    // Through a CONNECT proxy; NO_PROXY goes around it.
    let (mut proxy, proxy_port, tunnels) = python("connect_proxy.py", &[]);
    // SAFETY: this test binary runs this one test; no other thread reads the environment now.
    unsafe { std::env::set_var("HTTPS_PROXY", format!("http://127.0.0.1:{proxy_port}")) };
    let s = send(config(&url, &ca_var).unwrap(), Duration::from_secs(5));
    assert_eq!(s.delivered, 1, "through the proxy: {s:?}");
    assert_eq!(drain(&tunnels), vec![format!("CONNECT 127.0.0.1:{port}")]);
    assert_eq!(drain(&received).len(), 1);
    // SAFETY: as above.
    unsafe { std::env::set_var("NO_PROXY", "127.0.0.1") };
    let s = send(config(&url, &ca_var).unwrap(), Duration::from_secs(5));
    assert_eq!(s.delivered, 1, "around the proxy: {s:?}");
    assert!(drain(&tunnels).is_empty(), "NO_PROXY host went through the proxy");
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("HTTPS_PROXY");
        std::env::remove_var("NO_PROXY");
    }

    // A bundle without certificates: a configuration error naming the variable.
    std::fs::write(dir.join("empty.pem"), "not a certificate\n").unwrap();
    let e = config(&url, &[("SSL_CERT_FILE", dir.join("empty.pem").display().to_string())]).unwrap_err();
    assert!(e.starts_with("SSL_CERT_FILE: no PEM certificate"), "{e}");

    let _ = (server.kill(), proxy.kill(), server.wait(), proxy.wait());
    let _ = std::fs::remove_dir_all(&dir);
}
