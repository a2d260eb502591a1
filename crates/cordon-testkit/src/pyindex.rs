//! A Python package index on the host's loopback, for template builds that `pip install`:
//! a wheel the test makes itself (a zip holding the package's files, `METADATA`, `WHEEL`
//! and `RECORD`) served from a PEP 503 "simple" index.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// CRC-32 (IEEE) of `data`, as zip records it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zip archive of `files` (stored, not compressed).
pub fn zip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let offset = out.len() as u32;
        let crc = crc32(data);
        let size = data.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&0u16.to_le_bytes()); // stored
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&0x5821u16.to_le_bytes()); // date (2024-01-01)
            v.extend_from_slice(&crc.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&0u16.to_le_bytes()); // comment
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        central.extend_from_slice(&(0o100644u32 << 16).to_le_bytes()); // external (mode)
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // disks
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// URL-safe base64 without padding (a wheel's `RECORD` hashes).
fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut s = String::new();
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=c.len() {
            s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    s
}

/// A pure-Python wheel of the module `name` (its `__init__.py` is `source`), version 1.0:
/// its file name and bytes.
pub fn wheel(name: &str, source: &str) -> (String, Vec<u8>) {
    let info = format!("{name}-1.0.dist-info");
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (format!("{name}/__init__.py"), source.as_bytes().to_vec()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n").into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: cordon-testkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
    ];
    let mut record = String::new();
    for (path, data) in &files {
        let hash = b64url(&Sha256::digest(data));
        record.push_str(&format!("{path},sha256={hash},{}\n", data.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    files.push((format!("{info}/RECORD"), record.into_bytes()));
    (format!("{name}-1.0-py3-none-any.whl"), zip(&files))
}

/// A PEP 503 index on `127.0.0.1`: `/simple/`, `/simple/<project>/`, `/files/<wheel>`.
/// Records the path of every request it answered.
pub struct PyIndex {
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl PyIndex {
    /// Serves the wheels (file name, bytes) of the projects named before their first `-`.
    pub fn start(wheels: Vec<(String, Vec<u8>)>) -> PyIndex {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the index");
        let port = listener.local_addr().expect("its address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let Ok(clone) = conn.try_clone() else {
                    continue;
                };
                let mut reader = BufReader::new(clone);
                let mut first = String::new();
                if reader.read_line(&mut first).unwrap_or(0) == 0 {
                    continue;
                }
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                // Origin form, or absolute form from a proxy.
                let target = first.split_whitespace().nth(1).unwrap_or("/").to_string();
                let path = match target.strip_prefix("http://") {
                    Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
                    None => target,
                };
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(path.clone());
                let project = |w: &str| w.split('-').next().unwrap_or("").to_string();
                let (status, body): (&str, Vec<u8>) = if path == "/simple/" {
                    let links: String = wheels
                        .iter()
                        .map(|(f, _)| format!("<a href=\"{0}/\">{0}</a>\n", project(f)))
                        .collect();
                    (
                        "200 OK",
                        format!("<html><body>\n{links}</body></html>\n").into_bytes(),
                    )
                } else if let Some(p) = path
                    .strip_prefix("/simple/")
                    .and_then(|p| p.strip_suffix('/'))
                {
                    let links: String = wheels
                        .iter()
                        .filter(|(f, _)| project(f) == p)
                        .map(|(f, data)| {
                            format!(
                                "<a href=\"/files/{f}#sha256={}\">{f}</a>\n",
                                hex::encode(Sha256::digest(data))
                            )
                        })
                        .collect();
                    if links.is_empty() {
                        ("404 Not Found", Vec::new())
                    } else {
                        (
                            "200 OK",
                            format!("<html><body>\n{links}</body></html>\n").into_bytes(),
                        )
                    }
                } else if let Some((_, data)) = path
                    .strip_prefix("/files/")
                    .and_then(|f| wheels.iter().find(|(w, _)| w == f))
                {
                    ("200 OK", data.clone())
                } else {
                    ("404 Not Found", Vec::new())
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&body);
            }
        });
        PyIndex { port, seen }
    }

    /// Paths of the requests answered so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_known_values() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(b64url(b"\xfb\xff"), "-_8");
        assert_eq!(b64url(b"foobar"), "Zm9vYmFy");
    }
}
