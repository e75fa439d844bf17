//! One POST: ureq with rustls (no system OpenSSL). Proxies come from the
//! environment as ureq reads it: `ALL_PROXY`, `HTTPS_PROXY`, `HTTP_PROXY`
//! (and lower-case), minus the hosts in `NO_PROXY`. `https://` servers are
//! checked against `SSL_CERT_FILE` when set, else the system's CA bundle,
//! else Mozilla's roots compiled in ([`roots`]).

use crate::Error;
use std::path::Path;
use std::time::Duration;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// CA bundles of the usual distributions (Debian/Ubuntu/Alpine, Fedora/RHEL).
const SYSTEM_BUNDLES: [&str; 2] = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];

/// The certificates of a PEM file; an error names what is wrong with it.
pub fn certificates(path: &Path) -> Result<Vec<Certificate<'static>>, Error> {
    let pem = std::fs::read(path).map_err(|e| Error::ReadPem(path.to_path_buf(), e))?;
    let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(Error::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// The roots `https://` backends are checked against: `ca_file` (from
/// `SSL_CERT_FILE`), else the first system bundle found, else Mozilla's.
pub fn roots(ca_file: Option<&Path>) -> RootCerts {
    let system = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.exists());
    match ca_file.or(system).map(certificates) {
        Some(Ok(certs)) => RootCerts::new_with_certs(&certs),
        _ => RootCerts::WebPki,
    }
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct Request {
    /// Full URL, query included.
    pub url: String,
    /// `Content-Type`.
    pub content_type: String,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What came of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx.
    Delivered(u16),
    /// Connection error, timeout, 5xx, 429, 408: try again (after the
    /// server's `Retry-After` when it gave one).
    Retry {
        /// What went wrong.
        why: String,
        /// The server's `Retry-After`.
        after: Option<Duration>,
    },
    /// Any other 4xx (or 3xx): not retried.
    Rejected(String),
}

/// An HTTP agent: statuses are answers, not errors; proxies from the
/// environment; TLS roots from [`roots`].
pub fn agent(ca_file: Option<&Path>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(TlsConfig::builder().root_certs(roots(ca_file)).build())
        .http_status_as_error(false)
        .user_agent(concat!("osprey/", env!("CARGO_PKG_VERSION")))
        .max_idle_connections_per_host(2)
        .build()
        .new_agent()
}

/// POSTs `req`, giving up after `timeout` in all.
pub fn post(agent: &ureq::Agent, req: &Request, timeout: Duration) -> Outcome {
    let mut r =
        agent.post(&req.url).config().timeout_global(Some(timeout)).build().header("Content-Type", &req.content_type);
    for (k, v) in &req.headers {
        r = r.header(k.as_str(), v.as_str());
    }
    match r.send(&req.body[..]) {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            if (200..300).contains(&status) {
                return Outcome::Delivered(status);
            }
            let after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s.min(3600.0)));
            let mut text = resp.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
            text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            if text.len() > 200 {
                let mut end = 200;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push('…');
            }
            let reason = resp.status().canonical_reason().unwrap_or("");
            let what = if text.is_empty() {
                format!("HTTP {status} {reason}")
            } else {
                format!("HTTP {status} {reason}: {text}")
            };
            if status == 429 || status == 408 || status >= 500 {
                Outcome::Retry { why: what, after }
            } else {
                Outcome::Rejected(what)
            }
        }
        Err(e) => Outcome::Retry { why: e.to_string(), after: None },
    }
}
