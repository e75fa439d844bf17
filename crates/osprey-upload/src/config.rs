//! Where profiles go and how they are tagged: from command-line flags, from
//! `OSPREY_*` variables (what `osprey exec` hands the preloaded agent), and
//! from each ecosystem's own variables, in that order of precedence.
//!
//! | setting | flag | `OSPREY_*` | ecosystem defaults |
//! |---|---|---|---|
//! | service | `--service` | `OSPREY_SERVICE` | `DD_SERVICE`, `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`), `PYROSCOPE_APPLICATION_NAME`; else the program's name |
//! | env | `--env` | `OSPREY_ENV` | `DD_ENV`, `deployment.environment(.name)` in `OTEL_RESOURCE_ATTRIBUTES` |
//! | version | `--version` | `OSPREY_VERSION` | `DD_VERSION`, `service.version` in `OTEL_RESOURCE_ATTRIBUTES` |
//! | tags | `--tag K:V` (repeatable) | `OSPREY_TAGS` (`k:v,k:v`) | `DD_TAGS` (`k:v` by commas or spaces), `PYROSCOPE_TAGS` (`k=v,k=v`) |
//! | Datadog | `--datadog [URL]` | `OSPREY_DATADOG` (empty: default URL) | `DD_TRACE_AGENT_URL`, else `http://$DD_AGENT_HOST:$DD_TRACE_AGENT_PORT`, else `http://localhost:8126`; `DD_API_KEY` -> `DD-API-KEY` header |
//! | Pyroscope | `--pyroscope [URL]` | `OSPREY_PYROSCOPE` | `PYROSCOPE_SERVER_ADDRESS`; `PYROSCOPE_TENANT_ID` -> `X-Scope-OrgID`; `PYROSCOPE_BASIC_AUTH_USER`/`_PASSWORD` or the URL's `user:password@` -> basic auth |
//! | OTLP | `--otlp [URL]` | `OSPREY_OTLP` | `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1development/profiles`, else `http://localhost:4318`; headers from `OTEL_EXPORTER_OTLP_PROFILES_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS` |
//! | files | `--out DIR` | `OSPREY_OUT`, `OSPREY_FILES` (`0`/`1`) | default `./profiles` when no backend is named; with a backend only if given |
//! | request timeout | `--upload-timeout S` | `OSPREY_UPLOAD_TIMEOUT` | 10 s |
//! | wait at exit | `--exit-wait S` | `OSPREY_EXIT_WAIT` | 5 s |
//! | queue bound | | `OSPREY_UPLOAD_QUEUE` (profiles), `OSPREY_UPLOAD_QUEUE_BYTES` | 5 profiles, 64 MiB |
//! | timeline | | `OSPREY_TIMELINE` (`0`/`1`) | on when Datadog or OTLP is named |
//! | TLS roots | | | `SSL_CERT_FILE` (PEM; replaces the defaults, as for OpenSSL), else the system bundle (`/etc/ssl/certs/ca-certificates.crt`, `/etc/pki/tls/certs/ca-bundle.crt`), else Mozilla's roots built in |
//! | proxy | | | `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` (and lower-case), minus `NO_PROXY` hosts |
//!
//! URL rules: `http` and `https` only; a URL without a path (or with `/`)
//! is the backend's base and gets `/profiling/v1/input`, `/ingest` or
//! `/v1development/profiles`; a URL with a path is used as given.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;

fn err<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Config(msg.into()))
}

/// What the command line said (None: not given). `Some("")` for a backend
/// flag given without a URL (`--datadog`).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// --service.
    pub service: Option<String>,
    /// --env.
    pub env: Option<String>,
    /// --version.
    pub version: Option<String>,
    /// --tag values, `KEY:VALUE` each.
    pub tags: Vec<String>,
    /// --datadog [URL].
    pub datadog: Option<String>,
    /// --pyroscope [URL].
    pub pyroscope: Option<String>,
    /// --otlp [URL].
    pub otlp: Option<String>,
    /// --out DIR.
    pub out: Option<PathBuf>,
    /// --upload-timeout, seconds.
    pub timeout: Option<f64>,
    /// --exit-wait, seconds.
    pub exit_wait: Option<f64>,
}

/// One backend's URL and extra headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The full URL requests go to.
    pub url: String,
    /// Sent with every request (credentials, tenant).
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
/// A kind of backend.
pub enum Backend {
    /// A Datadog agent or intake.
    Datadog,
    /// Grafana Pyroscope.
    Pyroscope,
    /// An OTLP/HTTP collector.
    Otlp,
}

impl Backend {
    /// `datadog`, `pyroscope`, `otlp`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Datadog => "datadog",
            Backend::Pyroscope => "pyroscope",
            Backend::Otlp => "otlp",
        }
    }
}

#[derive(Clone, Debug)]
/// Where profiles go and how they are tagged.
pub struct UploadConfig {
    /// The service name (never empty).
    pub service: String,
    /// The deployment environment.
    pub env: Option<String>,
    /// The program's version.
    pub version: Option<String>,
    /// User tags, in order, keys unique (a later one replaces an earlier one).
    pub tags: Vec<(String, String)>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, for the OTLP resource.
    pub resource_attributes: Vec<(String, String)>,
    /// The Datadog endpoint, when named.
    pub datadog: Option<Endpoint>,
    /// The Pyroscope endpoint, when named.
    pub pyroscope: Option<Endpoint>,
    /// The OTLP endpoint, when named.
    pub otlp: Option<Endpoint>,
    /// Local pprof files go here (None: none written).
    pub out: Option<PathBuf>,
    /// `out` is the spool of a live `osprey exec --children` (the agent's
    /// `spool` setting): profiles are appended to its journal
    /// (`osprey_pprof::journal`), unsynced, instead of written as files;
    /// `exec` merges them and syncs what it writes. A part then survives
    /// its writer's SIGKILL (page cache), not a machine crash.
    pub out_spool: bool,
    /// Per HTTP request.
    pub timeout: Duration,
    /// At most this long at exit to send what is queued.
    pub exit_wait: Duration,
    /// Queue bound per backend, in profiles.
    pub queue_profiles: usize,
    /// Queue bound per backend, in bytes of encoded pprof.
    pub queue_bytes: usize,
    /// First retry delay; doubles up to `retry_max` (each +-25% jitter).
    pub retry_base: Duration,
    /// Longest delay between two attempts (a longer Retry-After is honoured).
    pub retry_max: Duration,
    /// Samples carry their time (`end_timestamp_ns`): one sample per stack
    /// and moment instead of per stack, i.e. larger profiles.
    pub timeline: bool,
    /// PEM file of the certificate authorities `https://` backends are
    /// checked against (`SSL_CERT_FILE`; None: system bundle, else built in).
    pub ca_file: Option<PathBuf>,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            service: "unnamed-service".into(),
            env: None,
            version: None,
            tags: Vec::new(),
            resource_attributes: Vec::new(),
            datadog: None,
            pyroscope: None,
            otlp: None,
            out: Some(PathBuf::from("profiles")),
            out_spool: false,
            timeout: Duration::from_secs(10),
            exit_wait: Duration::from_secs(5),
            queue_profiles: 5,
            queue_bytes: 64 << 20,
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            timeline: false,
            ca_file: None,
        }
    }
}

/// Appended to a Datadog URL without a path.
pub const DATADOG_PATH: &str = "/profiling/v1/input";
/// Appended to a Pyroscope URL without a path.
pub const PYROSCOPE_PATH: &str = "/ingest";
/// Appended to an OTLP URL without a path.
pub const OTLP_PATH: &str = "/v1development/profiles";

/// A parsed `http(s)://[user[:password]@]host[:port][/path][?query]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `http` or `https`.
    pub scheme: String,
    /// `user:password@`, decoded.
    pub user: Option<(String, String)>,
    /// `host[:port]`.
    pub authority: String,
    /// Empty when the URL had no path (or just `/`).
    pub path_query: String,
}

impl Url {
    /// Parses `s`; errors name `what` (the flag or variable).
    pub fn parse(s: &str, what: &str) -> Result<Url, Error> {
        let s = s.trim();
        let Some((scheme, rest)) = s.split_once("://") else {
            return err(format!("{what}: {s:?} is not a URL (expected http://HOST[:PORT][/PATH])"));
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return err(format!("{what}: unsupported scheme {scheme:?} in {s:?} (http or https)"));
        }
        let (auth, path) = match rest.find(['/', '?', '#']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (user, host) = match auth.rsplit_once('@') {
            Some((u, h)) => {
                let (n, p) = u.split_once(':').unwrap_or((u, ""));
                (Some((percent_decode(n), percent_decode(p))), h)
            }
            None => (None, auth),
        };
        let bad = |why: &str| err(format!("{what}: {s:?} is not a valid URL ({why})"));
        if host.is_empty() {
            return bad("no host");
        }
        if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad("bad host");
        }
        // host:port, [v6]:port
        let port = if host.starts_with('[') {
            match host.find(']') {
                Some(i) => host[i + 1..].strip_prefix(':'),
                None => return bad("unclosed ["),
            }
        } else {
            host.rsplit_once(':').map(|(_, p)| p)
        };
        if let Some(p) = port {
            if p.parse::<u16>().is_err() {
                return bad("bad port");
            }
        }
        let path = path.split('#').next().unwrap_or("");
        let path_query = if path == "/" { String::new() } else { path.to_string() };
        let url = Url { scheme, user, authority: host.to_string(), path_query };
        if ureq::http::Uri::try_from(url.with_path("").as_str()).is_err() {
            return bad("unparseable");
        }
        Ok(url)
    }

    /// A path other than `/`?
    pub fn has_path(&self) -> bool {
        !self.path_query.is_empty() && !self.path_query.starts_with('?')
    }

    /// The URL without credentials; `default_path` appended when it has no path.
    pub fn with_path(&self, default_path: &str) -> String {
        let p = if self.has_path() { self.path_query.clone() } else { format!("{default_path}{}", self.path_query) };
        format!("{}://{}{}", self.scheme, self.authority, p)
    }

    /// A base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`): `path` always appended.
    pub fn join(&self, path: &str) -> String {
        let (p, q) = self.path_query.split_once('?').map_or((self.path_query.as_str(), ""), |(p, q)| (p, q));
        let q = if q.is_empty() { String::new() } else { format!("?{q}") };
        format!("{}://{}{}{path}{q}", self.scheme, self.authority, p.trim_end_matches('/'))
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `KEY:VALUE` (or `KEY=VALUE` with `sep = '='`).
fn parse_tag(t: &str, sep: char, what: &str) -> Result<(String, String), Error> {
    match t.split_once(sep) {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => err(format!("{what}: tag {t:?} is not KEY{sep}VALUE")),
    }
}

fn parse_list(s: &str, seps: &[char], sep: char, what: &str) -> Result<Vec<(String, String)>, Error> {
    s.split(seps).map(str::trim).filter(|t| !t.is_empty()).map(|t| parse_tag(t, sep, what)).collect()
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `k=v` by commas, keys and values percent-decoded.
fn parse_resource_attributes(v: &str) -> Result<Vec<(String, String)>, Error> {
    let list = parse_list(v, &[','], '=', "OTEL_RESOURCE_ATTRIBUTES")?;
    Ok(list.into_iter().map(|(k, v)| (percent_decode(&k), percent_decode(&v))).collect())
}

/// [`parse_resource_attributes`] of another process's value: a malformed
/// entry is skipped instead of refused (it is not ours to report).
pub(crate) fn resource_attributes(v: &str) -> Vec<(String, String)> {
    v.split(',').filter_map(|t| parse_resource_attributes(t).ok()).flatten().collect()
}

fn parse_secs(v: &str, what: &str) -> Result<Duration, Error> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => err(format!("{what}: {v:?} is not a number of seconds (0-3600)")),
    }
}

fn parse_bool(v: &str, what: &str) -> Result<bool, Error> {
    match v.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => err(format!("{what}: {v:?} is not 0 or 1")),
    }
}

fn push_tag(tags: &mut Vec<(String, String)>, (k, v): (String, String)) {
    tags.retain(|(k2, _)| *k2 != k);
    tags.push((k, v));
}

impl UploadConfig {
    /// The preloaded agent's configuration: `OSPREY_*` and ecosystem
    /// variables of this process. `program`: the service when none is set.
    pub fn from_env(program: &str) -> Result<UploadConfig, Error> {
        Self::resolve(&Flags::default(), program, &|k| std::env::var(k).ok())
    }

    /// Flags, then `OSPREY_*`, then ecosystem variables, through `get`.
    pub fn resolve(flags: &Flags, program: &str, get: &dyn Fn(&str) -> Option<String>) -> Result<UploadConfig, Error> {
        let raw = |k: &str| get(k);
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut c = UploadConfig::default();
        let resource_attributes = match get("OTEL_RESOURCE_ATTRIBUTES") {
            Some(v) => parse_resource_attributes(&v)?,
            None => Vec::new(),
        };
        let attr = |k: &str| resource_attributes.iter().find(|(k2, _)| k2 == k).map(|(_, v)| v.clone());
        let first = |f: &Option<String>, vars: &[&str]| -> Option<String> {
            f.clone().filter(|v| !v.is_empty()).or_else(|| vars.iter().find_map(|k| get(k)))
        };
        c.service = first(&flags.service, &["OSPREY_SERVICE", "DD_SERVICE", "OTEL_SERVICE_NAME"])
            .or_else(|| attr("service.name"))
            .or_else(|| get("PYROSCOPE_APPLICATION_NAME"))
            .unwrap_or_else(|| if program.is_empty() { "unnamed-service".into() } else { program.to_string() });
        c.env = first(&flags.env, &["OSPREY_ENV", "DD_ENV"])
            .or_else(|| attr("deployment.environment.name"))
            .or_else(|| attr("deployment.environment"));
        c.version = first(&flags.version, &["OSPREY_VERSION", "DD_VERSION"]).or_else(|| attr("service.version"));
        c.resource_attributes = resource_attributes;

        if let Some(v) = get("PYROSCOPE_TAGS") {
            for t in parse_list(&v, &[','], '=', "PYROSCOPE_TAGS")? {
                push_tag(&mut c.tags, t);
            }
        }
        if let Some(v) = get("DD_TAGS") {
            for t in parse_list(&v, &[',', ' '], ':', "DD_TAGS")? {
                push_tag(&mut c.tags, t);
            }
        }
        if let Some(v) = get("OSPREY_TAGS") {
            for t in parse_list(&v, &[','], ':', "OSPREY_TAGS")? {
                push_tag(&mut c.tags, t);
            }
        }
        for t in &flags.tags {
            push_tag(&mut c.tags, parse_tag(t, ':', "--tag")?);
        }

        // Backends: named by a flag or an OSPREY_* variable (set, maybe empty).
        let named = |flag: &Option<String>, flag_name: &str, var: &str| -> Option<(String, String)> {
            match flag {
                Some(v) => Some((v.clone(), flag_name.to_string())),
                None => raw(var).map(|v| (v, var.to_string())),
            }
        };
        if let Some((v, what)) = named(&flags.datadog, "--datadog", "OSPREY_DATADOG") {
            let url = if !v.trim().is_empty() {
                Url::parse(&v, &what)?
            } else if let Some(u) = get("DD_TRACE_AGENT_URL") {
                Url::parse(&u, "DD_TRACE_AGENT_URL")?
            } else {
                let host = get("DD_AGENT_HOST").unwrap_or_else(|| "localhost".into());
                let port = get("DD_TRACE_AGENT_PORT").unwrap_or_else(|| "8126".into());
                let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host };
                Url::parse(&format!("http://{host}:{port}"), "DD_AGENT_HOST/DD_TRACE_AGENT_PORT")?
            };
            let mut headers = Vec::new();
            if let Some(k) = get("DD_API_KEY") {
                headers.push(("DD-API-KEY".to_string(), k));
            }
            c.datadog = Some(Endpoint { url: url.with_path(DATADOG_PATH), headers });
        }
        if let Some((v, what)) = named(&flags.pyroscope, "--pyroscope", "OSPREY_PYROSCOPE") {
            let url = if !v.trim().is_empty() {
                Url::parse(&v, &what)?
            } else if let Some(u) = get("PYROSCOPE_SERVER_ADDRESS") {
                Url::parse(&u, "PYROSCOPE_SERVER_ADDRESS")?
            } else {
                return err(format!("{what}: no URL given and PYROSCOPE_SERVER_ADDRESS is not set"));
            };
            let mut headers = Vec::new();
            if let Some(t) = get("OSPREY_PYROSCOPE_TENANT").or_else(|| get("PYROSCOPE_TENANT_ID")) {
                headers.push(("X-Scope-OrgID".to_string(), t));
            }
            let user =
                get("PYROSCOPE_BASIC_AUTH_USER").map(|u| (u, get("PYROSCOPE_BASIC_AUTH_PASSWORD").unwrap_or_default()));
            if let Some((u, p)) = user.or(url.user.clone()) {
                headers.push((
                    "Authorization".to_string(),
                    format!("Basic {}", crate::base64(format!("{u}:{p}").as_bytes())),
                ));
            }
            c.pyroscope = Some(Endpoint { url: url.with_path(PYROSCOPE_PATH), headers });
        }
        if let Some((v, what)) = named(&flags.otlp, "--otlp", "OSPREY_OTLP") {
            let url = if !v.trim().is_empty() {
                Url::parse(&v, &what)?.with_path(OTLP_PATH)
            } else if let Some(u) = get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
                Url::parse(&u, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT")?.with_path(OTLP_PATH)
            } else if let Some(u) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Url::parse(&u, "OTEL_EXPORTER_OTLP_ENDPOINT")?.join(OTLP_PATH)
            } else {
                format!("http://localhost:4318{OTLP_PATH}")
            };
            let headers = match get("OTEL_EXPORTER_OTLP_PROFILES_HEADERS")
                .map(|h| (h, "OTEL_EXPORTER_OTLP_PROFILES_HEADERS"))
                .or_else(|| get("OTEL_EXPORTER_OTLP_HEADERS").map(|h| (h, "OTEL_EXPORTER_OTLP_HEADERS")))
            {
                Some((h, what)) => parse_list(&h, &[','], '=', what)?
                    .into_iter()
                    .map(|(k, v)| (percent_decode(&k), percent_decode(&v)))
                    .collect(),
                None => Vec::new(),
            };
            c.otlp = Some(Endpoint { url, headers });
        }

        let any_backend = c.uploads();
        // Checked only when something will be sent: the variable is often set
        // machine-wide, and every profiled process would read the bundle.
        if let Some(f) = get("SSL_CERT_FILE").filter(|_| any_backend) {
            crate::http::certificates(std::path::Path::new(&f))
                .map_err(|e| Error::Config(format!("SSL_CERT_FILE: {e}")))?;
            c.ca_file = Some(PathBuf::from(f));
        }
        let files = match raw("OSPREY_FILES") {
            Some(v) => Some(parse_bool(&v, "OSPREY_FILES")?),
            None => None,
        };
        let out = flags.out.clone().or_else(|| get("OSPREY_OUT").map(PathBuf::from));
        c.out = match (any_backend, files, out) {
            (_, Some(false), _) => None,
            (false, _, out) | (true, Some(true), out) => Some(out.unwrap_or_else(|| PathBuf::from("profiles"))),
            (true, None, out) => out,
        };
        if let Some(v) = flags
            .timeout
            .map(|t| t.to_string())
            .map(|t| (t, "--upload-timeout"))
            .or_else(|| get("OSPREY_UPLOAD_TIMEOUT").map(|t| (t, "OSPREY_UPLOAD_TIMEOUT")))
        {
            c.timeout = parse_secs(&v.0, v.1)?.max(Duration::from_millis(1));
        }
        if let Some(v) = flags
            .exit_wait
            .map(|t| t.to_string())
            .map(|t| (t, "--exit-wait"))
            .or_else(|| get("OSPREY_EXIT_WAIT").map(|t| (t, "OSPREY_EXIT_WAIT")))
        {
            c.exit_wait = parse_secs(&v.0, v.1)?;
        }
        if let Some(v) = get("OSPREY_UPLOAD_QUEUE") {
            c.queue_profiles = match v.trim().parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => return err(format!("OSPREY_UPLOAD_QUEUE: {v:?} is not a number of profiles (1-1000)")),
            };
        }
        if let Some(v) = get("OSPREY_UPLOAD_QUEUE_BYTES") {
            c.queue_bytes = match parse_size(&v) {
                Some(n) if n >= 1024 => n,
                _ => return err(format!("OSPREY_UPLOAD_QUEUE_BYTES: {v:?} is not a size (e.g. 64M)")),
            };
        }
        if let Some(v) = get("OSPREY_UPLOAD_RETRY_MS") {
            match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => c.retry_base = Duration::from_millis(ms),
                _ => return err(format!("OSPREY_UPLOAD_RETRY_MS: {v:?} is not a number of milliseconds")),
            }
        }
        c.timeline = match raw("OSPREY_TIMELINE") {
            Some(v) => parse_bool(&v, "OSPREY_TIMELINE")?,
            None => c.datadog.is_some() || c.otlp.is_some(),
        };
        Ok(c)
    }

    /// Any backend named?
    pub fn uploads(&self) -> bool {
        self.datadog.is_some() || self.pyroscope.is_some() || self.otlp.is_some()
    }

    /// The named backends with their endpoints.
    pub fn endpoints(&self) -> Vec<(Backend, Endpoint)> {
        let mut v = Vec::new();
        if let Some(e) = &self.datadog {
            v.push((Backend::Datadog, e.clone()));
        }
        if let Some(e) = &self.pyroscope {
            v.push((Backend::Pyroscope, e.clone()));
        }
        if let Some(e) = &self.otlp {
            v.push((Backend::Otlp, e.clone()));
        }
        v
    }

    /// The `OSPREY_*` variables that make [`UploadConfig::from_env`] in
    /// another process (the preloaded agent) come back with this config.
    /// Credentials and headers are not copied: the program inherits the
    /// variables they came from.
    pub fn to_env(&self) -> Vec<(String, String)> {
        let mut v = vec![("OSPREY_SERVICE".to_string(), self.service.clone())];
        if let Some(e) = &self.env {
            v.push(("OSPREY_ENV".into(), e.clone()));
        }
        if let Some(e) = &self.version {
            v.push(("OSPREY_VERSION".into(), e.clone()));
        }
        if !self.tags.is_empty() {
            let t: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            v.push(("OSPREY_TAGS".into(), t.join(",")));
        }
        for (b, e) in self.endpoints() {
            v.push((format!("OSPREY_{}", b.name().to_uppercase()), e.url.clone()));
        }
        match &self.out {
            Some(d) => {
                v.push(("OSPREY_OUT".into(), d.display().to_string()));
                v.push(("OSPREY_FILES".into(), "1".into()));
            }
            None => v.push(("OSPREY_FILES".into(), "0".into())),
        }
        v.push(("OSPREY_UPLOAD_TIMEOUT".into(), self.timeout.as_secs_f64().to_string()));
        v.push(("OSPREY_EXIT_WAIT".into(), self.exit_wait.as_secs_f64().to_string()));
        v.push(("OSPREY_TIMELINE".into(), if self.timeline { "1" } else { "0" }.into()));
        v
    }

    /// `key:value` tags every backend gets: service, env, version, then the user's.
    pub fn all_tags(&self) -> Vec<(String, String)> {
        let mut t = vec![("service".to_string(), self.service.clone())];
        if let Some(e) = &self.env {
            t.push(("env".into(), e.clone()));
        }
        if let Some(e) = &self.version {
            t.push(("version".into(), e.clone()));
        }
        for (k, v) in &self.tags {
            if !matches!(k.as_str(), "service" | "env" | "version") {
                t.push((k.clone(), v.clone()));
            }
        }
        t
    }
}

fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (n, mul) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 1usize << 10),
        'M' => (&v[..v.len() - 1], 1 << 20),
        'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    n.trim().parse::<usize>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(flags: &Flags, vars: &[(&str, &str)]) -> Result<UploadConfig, Error> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        UploadConfig::resolve(flags, "prog", &move |k| vars.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone()))
    }

    fn dd(v: &str) -> Flags {
        Flags { datadog: Some(v.into()), ..Default::default() }
    }

    #[test]
    fn url_rules() {
        let url = |f: Flags, vars: &[(&str, &str)]| {
            let c = resolve(&f, vars).unwrap();
            c.datadog.or(c.pyroscope).or(c.otlp).unwrap().url
        };
        assert_eq!(url(dd(""), &[]), "http://localhost:8126/profiling/v1/input");
        assert_eq!(url(dd("http://agent:9126"), &[]), "http://agent:9126/profiling/v1/input");
        assert_eq!(url(dd("http://agent:9126/"), &[]), "http://agent:9126/profiling/v1/input");
        assert_eq!(url(dd("https://intake.example/api/v2/profile"), &[]), "https://intake.example/api/v2/profile");
        assert_eq!(url(dd(""), &[("DD_TRACE_AGENT_URL", "http://x:1")]), "http://x:1/profiling/v1/input");
        assert_eq!(
            url(dd(""), &[("DD_AGENT_HOST", "dd"), ("DD_TRACE_AGENT_PORT", "18126")]),
            "http://dd:18126/profiling/v1/input"
        );
        assert_eq!(url(dd(""), &[("DD_AGENT_HOST", "dd")]), "http://dd:8126/profiling/v1/input");
        let py = |v: &str| Flags { pyroscope: Some(v.into()), ..Default::default() };
        assert_eq!(url(py("http://p:4040"), &[]), "http://p:4040/ingest");
        assert_eq!(url(py(""), &[("PYROSCOPE_SERVER_ADDRESS", "http://p:4040")]), "http://p:4040/ingest");
        assert_eq!(url(py("http://p:4040/custom"), &[]), "http://p:4040/custom");
        let ot = |v: &str| Flags { otlp: Some(v.into()), ..Default::default() };
        assert_eq!(url(ot(""), &[]), "http://localhost:4318/v1development/profiles");
        assert_eq!(url(ot("http://c:4318"), &[]), "http://c:4318/v1development/profiles");
        assert_eq!(url(ot("http://c:4318/p"), &[]), "http://c:4318/p");
        assert_eq!(
            url(ot(""), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/base/")]),
            "http://c:4318/base/v1development/profiles"
        );
        assert_eq!(
            url(
                ot(""),
                &[
                    ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://c:1/x"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://d:2")
                ]
            ),
            "http://c:1/x"
        );
        // OSPREY_* names a backend (empty: default URL) for the preloaded agent.
        assert_eq!(url(Flags::default(), &[("OSPREY_DATADOG", "")]), "http://localhost:8126/profiling/v1/input");
    }

    #[test]
    fn bad_configuration_is_one_line_naming_its_source() {
        let e = |f: Flags, vars: &[(&str, &str)]| resolve(&f, vars).unwrap_err().to_string();
        assert!(e(dd("ftp://x"), &[]).starts_with("--datadog: unsupported scheme \"ftp\""));
        assert!(e(dd("localhost:8126"), &[]).starts_with("--datadog: \"localhost:8126\" is not a URL"));
        assert!(e(dd("http://h:99999"), &[]).contains("bad port"));
        assert!(e(dd(""), &[("DD_TRACE_AGENT_URL", "unix:///var/run/datadog/apm.socket")])
            .starts_with("DD_TRACE_AGENT_URL: unsupported scheme"));
        assert!(
            e(Flags { tags: vec!["nocolon".into()], ..Default::default() }, &[]).starts_with("--tag: tag \"nocolon\"")
        );
        assert!(e(Flags::default(), &[("DD_TAGS", "a:b nocolon")]).starts_with("DD_TAGS:"));
        assert!(e(Flags::default(), &[("OSPREY_OTLP", "http//x")]).starts_with("OSPREY_OTLP:"));
        assert!(
            e(Flags { pyroscope: Some(String::new()), ..Default::default() }, &[]).contains("PYROSCOPE_SERVER_ADDRESS")
        );
        for err in [e(dd("ftp://x"), &[]), e(Flags::default(), &[("OSPREY_UPLOAD_TIMEOUT", "soon")])] {
            assert!(!err.contains('\n'));
        }
    }

    #[test]
    fn precedence_tags_and_files() {
        let c = resolve(
            &Flags { tags: vec!["team:a".into()], ..Default::default() },
            &[
                ("DD_SERVICE", "dd-svc"),
                ("OTEL_SERVICE_NAME", "otel"),
                ("DD_ENV", "prod"),
                ("DD_TAGS", "team:b,zone:z1 rack:r"),
                ("PYROSCOPE_TAGS", "zone=z0"),
            ],
        )
        .unwrap();
        assert_eq!(c.service, "dd-svc");
        assert_eq!(c.env.as_deref(), Some("prod"));
        assert_eq!(c.tags, [("zone", "z1"), ("rack", "r"), ("team", "a")].map(|(a, b)| (a.to_string(), b.to_string())));
        assert_eq!(c.out, Some(PathBuf::from("profiles")), "files by default when no backend");
        let c = resolve(
            &Flags { service: Some("flag".into()), ..dd("") },
            &[
                ("OSPREY_SERVICE", "env"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.version=9,deployment.environment.name=qa"),
            ],
        )
        .unwrap();
        assert_eq!((c.service.as_str(), c.version.as_deref(), c.env.as_deref()), ("flag", Some("9"), Some("qa")));
        assert_eq!(c.out, None, "no files with a backend unless --out");
        assert!(c.timeline);
        let c = resolve(&Flags { out: Some("d".into()), ..dd("") }, &[]).unwrap();
        assert_eq!(c.out, Some(PathBuf::from("d")));
        assert_eq!(resolve(&Flags::default(), &[]).unwrap().service, "prog");
    }

    #[test]
    fn to_env_round_trips() {
        let flags = Flags {
            tags: vec!["a:1".into(), "b:x:y".into()],
            env: Some("e".into()),
            out: Some("o".into()),
            ..dd("http://h:1")
        };
        let c = resolve(&flags, &[]).unwrap();
        let vars = c.to_env();
        let back = UploadConfig::resolve(&Flags::default(), "other", &|k| {
            vars.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
        })
        .unwrap();
        assert_eq!(
            (back.service, back.env, back.tags, back.datadog, back.out),
            (c.service, c.env, c.tags, c.datadog, c.out)
        );
        let c = resolve(&dd(""), &[]).unwrap();
        let vars = c.to_env();
        let back = UploadConfig::resolve(&Flags::default(), "p", &|k| {
            vars.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
        })
        .unwrap();
        assert_eq!(back.out, None);
    }
}
