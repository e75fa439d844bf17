//! Fake backends: loopback HTTP/1.1 receivers with scripted answers, what
//! they received, and the profiles the delivery tests send.

pub use crate::profile::{gunzip, sample_count};

use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request a [`Receiver`] received.
#[derive(Clone, Debug)]
pub struct Req {
    /// `GET`, `POST`...
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Req {
    /// The value of header `k` (any case).
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers.iter().find(|(h, _)| h.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str())
    }
    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap()
    }
    /// Query parameter `k`, percent-decoded.
    pub fn query(&self, k: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (a, b) = kv.split_once('=')?;
            (a == k).then(|| percent_decode(b))
        })
    }
}

/// Decodes `%XX` escapes and `+` (a space) of a query value.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..(i + 3).min(s.len())], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// What the receiver answers to the n-th request (0-based).
pub enum Answer {
    /// This status, these headers, this body.
    Status(u16, Vec<(String, String)>, String),
    /// Reads the request, never answers (keeps the connection open).
    Hang,
}

/// A loopback HTTP/1.1 server answering as its script says, keeping
/// every request (a thread per connection, for the whole test binary).
pub struct Receiver {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its port.
    pub port: u16,
    /// What it received, in order.
    pub requests: Arc<Mutex<Vec<Req>>>,
}

impl Receiver {
    /// Listens on a free loopback port; `script(n, req)` answers the n-th request.
    pub fn start(script: impl Fn(usize, &Req) -> Answer + Send + Sync + 'static) -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        Self::start_on(l, script)
    }

    /// As [`Receiver::start`], on listener `l`.
    pub fn start_on(l: TcpListener, script: impl Fn(usize, &Req) -> Answer + Send + Sync + 'static) -> Receiver {
        let port = l.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (reqs, script) = (requests.clone(), Arc::new(script));
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (reqs, script) = (reqs.clone(), script.clone());
                std::thread::spawn(move || serve(s, &reqs, &*script));
            }
        });
        Receiver { url: format!("http://127.0.0.1:{port}"), port, requests }
    }

    /// How many requests it received.
    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// The requests received once there are `n`, or after `max`.
    pub fn wait_for(&self, n: usize, max: Duration) -> Vec<Req> {
        let t = std::time::Instant::now();
        while self.count() < n && t.elapsed() < max {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.requests.lock().unwrap().clone()
    }
}

fn serve(s: TcpStream, reqs: &Mutex<Vec<Req>>, script: &(dyn Fn(usize, &Req) -> Answer + Send + Sync)) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let req = Req { method, target, headers, body };
        let n = {
            let mut g = reqs.lock().unwrap();
            g.push(req.clone());
            g.len() - 1
        };
        match script(n, &req) {
            Answer::Hang => {
                std::thread::sleep(Duration::from_secs(3600));
                return;
            }
            Answer::Status(code, hs, text) => {
                let mut out = format!("HTTP/1.1 {code} X\r\nContent-Length: {}\r\n", text.len());
                for (k, v) in hs {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&text);
                if w.write_all(out.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// 200 with an empty body.
pub fn ok() -> Answer {
    Answer::Status(200, vec![], String::new())
}

/// A profile of `stacks` distinct 3-deep Python-like stacks, `per` samples
/// each, with thread, span, trace and (if `timeline`) timestamp labels.
pub fn profile(stacks: usize, per: i64, timeline: bool) -> ProfileData {
    let samples = (0..stacks)
        .map(|i| {
            let mut labels = vec![
                Label { key: "thread id".into(), value: LabelValue::Num(1000 + (i % 4) as i64) },
                Label { key: "thread name".into(), value: LabelValue::Str(format!("worker-{}", i % 4)) },
                Label { key: "state".into(), value: LabelValue::Str("running".into()) },
            ];
            if i % 2 == 0 {
                labels.push(Label { key: "span id".into(), value: LabelValue::Num(0x1234_5678 + i as i64) });
                labels.push(Label { key: "local root span id".into(), value: LabelValue::Num(0x42) });
                labels.push(Label {
                    key: "trace id".into(),
                    value: LabelValue::Str(format!("{:032x}", 0xabc0_0000u64 + i as u64)),
                });
            }
            let mut s = Sample {
                frames: vec![
                    Frame::Function { name: format!("leaf_{i}"), file: "app.py".into(), line: i as i64 + 1 },
                    Frame::Function { name: format!("mid_{}", i % 100), file: "app.py".into(), line: 500 },
                    Frame::Function { name: "main".into(), file: "app.py".into(), line: 1 },
                ],
                values: vec![per, per * 10_000_000],
                labels,
            };
            if timeline {
                s.set_timestamp_ns(1_700_000_000_000_000_000 + i as i64 * 1_000_000);
            }
            s
        })
        .collect();
    ProfileData { comments: vec!["runtime-id=test".into()], ..crate::profile::cpu_data(samples) }
}

/// `data` as an uncompressed pprof.
pub fn encoded(data: &ProfileData) -> Vec<u8> {
    prost::Message::encode_to_vec(&osprey_pprof::to_pprof(data))
}

/// Splits a multipart body: (name, filename, content type, data) per part.
pub fn multipart(content_type: &str, body: &[u8]) -> Vec<(String, String, String, Vec<u8>)> {
    let boundary = content_type.split("boundary=").nth(1).unwrap().trim_matches('"');
    let delim = format!("--{boundary}");
    let mut out = Vec::new();
    let text = body;
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
    };
    let mut pos = find(text, delim.as_bytes(), 0).unwrap() + delim.len();
    loop {
        if text[pos..].starts_with(b"--") {
            break;
        }
        pos += 2; // CRLF
        let hend = find(text, b"\r\n\r\n", pos).unwrap();
        let head = String::from_utf8_lossy(&text[pos..hend]).to_string();
        let next = find(text, format!("\r\n{delim}").as_bytes(), hend + 4).unwrap();
        let data = text[hend + 4..next].to_vec();
        let attr = |k: &str| {
            head.split(';')
                .find_map(|p| {
                    p.trim().strip_prefix(&format!("{k}=\"")).map(|v| v.split('"').next().unwrap().to_string())
                })
                .unwrap_or_default()
        };
        let ctype = head.lines().find_map(|l| l.strip_prefix("Content-Type: ")).unwrap_or("").to_string();
        out.push((attr("name"), attr("filename"), ctype, data));
        pos = next + 2 + delim.len();
    }
    out
}
