//! The output scanner: redacts real secret values the host knows and flags common
//! credential formats in anything that leaves a sandbox towards the caller. Also the
//! streaming helpers the proxy uses on request and response bodies.

use std::fmt;
use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use regex::bytes::Regex;

/// A secret the host knows, to be redacted from outputs. `Debug` never shows the value.
#[derive(Clone)]
pub struct KnownSecret {
    /// A name for findings (e.g. the grant name); never the value.
    pub name: String,
    value: zeroize::Zeroizing<Vec<u8>>,
}

impl KnownSecret {
    /// A named secret value.
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        KnownSecret {
            name: name.into(),
            value: zeroize::Zeroizing::new(value.into()),
        }
    }

    /// The encodings searched for: raw, hex (both cases), and base64 (standard and
    /// URL-safe) at each of the three alignments a secret can have inside a longer encoded
    /// string (`Basic base64("user:SECRET")` puts it at any offset): for each, the run of
    /// characters that only the secret's bytes decide.
    fn forms(&self) -> Vec<Vec<u8>> {
        let v: &[u8] = &self.value;
        let mut forms = vec![v.to_vec()];
        forms.push(hex::encode(v).into_bytes());
        forms.push(hex::encode_upper(v).into_bytes());
        for k in 0..3usize {
            let mut buf = vec![0u8; k];
            buf.extend_from_slice(v);
            // Character i covers bits [6i, 6i+6); the secret covers [8k, 8(k+len)).
            let first = (8 * k).div_ceil(6);
            let end = (8 * (k + v.len())) / 6;
            for enc in [STANDARD.encode(&buf), URL_SAFE_NO_PAD.encode(&buf)] {
                if let Some(core) = enc.as_bytes().get(first..end)
                    && core.len() >= 8
                {
                    forms.push(core.to_vec());
                }
            }
        }
        forms.sort();
        forms.dedup();
        forms
    }
}

/// The secrets a set of grants forwards, for redacting what a sandbox outputs. Minted
/// grants have none here: their tokens never reach the sandbox, and the proxy masks them.
pub fn known_secrets_of(grants: &[cordon_core::Grant]) -> Vec<KnownSecret> {
    grants
        .iter()
        .filter_map(|g| match &g.secret {
            cordon_core::GrantSecret::Value(v) => {
                Some(KnownSecret::new(g.name.clone(), v.expose().to_vec()))
            }
            cordon_core::GrantSecret::Minted(_) => None,
        })
        .collect()
}

/// An output sink with a streaming redactor in front: every encoded form of every known
/// secret is masked (same length) before the bytes reach `inner`, holding back only what
/// the longest form needs to be recognised across chunk boundaries. Call
/// [`RedactingSink::finish`] at the end to release what is held back.
pub struct RedactingSink<'a> {
    inner: &'a mut dyn cordon_core::OutputSink,
    redactor: Redactor,
}

impl<'a> RedactingSink<'a> {
    pub fn new(secrets: Vec<KnownSecret>, inner: &'a mut dyn cordon_core::OutputSink) -> Self {
        RedactingSink {
            inner,
            redactor: Redactor::new(&secrets),
        }
    }

    /// Releases what is held back on both streams.
    pub fn finish(&mut self) {
        for stream in [
            cordon_core::OutputStream::Stdout,
            cordon_core::OutputStream::Stderr,
        ] {
            let rest = self.redactor.finish(stream);
            if !rest.is_empty() {
                self.inner.output(stream, &rest);
            }
        }
    }
}

impl cordon_core::OutputSink for RedactingSink<'_> {
    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }

    fn output(&mut self, stream: cordon_core::OutputStream, data: &[u8]) {
        let out = self.redactor.push(stream, data);
        if !out.is_empty() {
            self.inner.output(stream, &out);
        }
    }
}

/// What [`RedactingSink`] does, owned (and `Send`): a caller that reads output in steps
/// across an `await` keeps one of these between them instead of a sink that borrows.
pub struct Redactor {
    streams: [StreamRedactor; 2],
}

impl Redactor {
    pub fn new(secrets: &[KnownSecret]) -> Self {
        let needles: Vec<zeroize::Zeroizing<Vec<u8>>> = secrets
            .iter()
            .flat_map(|s| s.forms())
            .map(zeroize::Zeroizing::new)
            .collect();
        Redactor {
            streams: [
                StreamRedactor::new(needles.clone()),
                StreamRedactor::new(needles),
            ],
        }
    }

    fn index(stream: cordon_core::OutputStream) -> usize {
        match stream {
            cordon_core::OutputStream::Stdout => 0,
            cordon_core::OutputStream::Stderr => 1,
        }
    }

    /// Feeds one stream's chunk; returns what can be released now (masked). No secret to
    /// look for (a sandbox without grants): the bytes pass straight on, nothing held back.
    pub fn push<'d>(
        &mut self,
        stream: cordon_core::OutputStream,
        data: &'d [u8],
    ) -> std::borrow::Cow<'d, [u8]> {
        let s = &mut self.streams[Self::index(stream)];
        if s.needles.is_empty() {
            return std::borrow::Cow::Borrowed(data);
        }
        std::borrow::Cow::Owned(s.push(data))
    }

    /// Releases what one stream holds back (its end).
    pub fn finish(&mut self, stream: cordon_core::OutputStream) -> Vec<u8> {
        self.streams[Self::index(stream)].finish()
    }
}

impl fmt::Debug for KnownSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KnownSecret({:?}, [{} bytes])",
            self.name,
            self.value.len()
        )
    }
}

pub use cordon_core::report::{Finding, FindingKind};

/// The result of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutput {
    /// The input with redactions applied.
    pub bytes: Vec<u8>,
    /// What was found, in input order.
    pub findings: Vec<Finding>,
}

impl ScanOutput {
    /// True if nothing was found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Scan options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanOptions {
    /// Also redact credential-format findings (not only known secrets).
    pub redact_patterns: bool,
}

static PATTERNS: LazyLock<Vec<(FindingKind, Regex)>> = LazyLock::new(|| {
    let src: [(FindingKind, &str); 12] = [
        (
            FindingKind::PrivateKey,
            r"(?-u)-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.){0,16384}?-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----",
        ),
        (
            FindingKind::PrivateKey,
            r"(?-u)-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----",
        ),
        (
            FindingKind::AwsAccessKeyId,
            r"(?-u)\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|A3T[A-Z0-9])[A-Z0-9]{16}\b",
        ),
        (
            FindingKind::GithubToken,
            r"(?-u)\bgh[pousr]_[A-Za-z0-9]{36,251}\b",
        ),
        (
            FindingKind::GithubToken,
            r"(?-u)\bgithub_pat_[A-Za-z0-9_]{22,255}\b",
        ),
        (
            FindingKind::GitlabToken,
            r"(?-u)\bglpat-[A-Za-z0-9_\-]{20,}",
        ),
        (
            FindingKind::SlackToken,
            r"(?-u)\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        ),
        (
            FindingKind::SlackToken,
            r"(?-u)https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]{20,}",
        ),
        (
            FindingKind::StripeKey,
            r"(?-u)\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}\b",
        ),
        (FindingKind::GoogleApiKey, r"(?-u)\bAIza[0-9A-Za-z_\-]{35}"),
        (
            FindingKind::AiApiKey,
            r"(?-u)\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{32,}",
        ),
        (
            FindingKind::Jwt,
            r"(?-u)\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
        ),
    ];
    src.into_iter()
        .filter_map(|(k, re)| Regex::new(re).ok().map(|r| (k, r)))
        .collect()
});

/// Literal fragments at least one of which every credential pattern contains. Input without
/// any of them cannot match, so the patterns (costly to compile, especially the bounded
/// private-key block) are not even built for it: most output never pays for them.
const MARKERS: [&[u8]; 24] = [
    b"PRIVATE KEY",
    b"AKIA",
    b"ASIA",
    b"ABIA",
    b"ACCA",
    b"AGPA",
    b"AIDA",
    b"AROA",
    b"A3T",
    b"ghp_",
    b"gho_",
    b"ghu_",
    b"ghs_",
    b"ghr_",
    b"github_pat_",
    b"glpat-",
    b"xox",
    b"hooks.slack.com",
    b"k_live_",
    b"k_test_",
    b"AIza",
    b"sk-",
    b"eyJ",
    b"-----BEGIN",
];

fn may_hold_credentials(input: &[u8]) -> bool {
    MARKERS
        .iter()
        .any(|m| memchr::memmem::find(input, m).is_some())
}

/// Scans `input`: every known secret (raw, base64, hex) is replaced by
/// `[REDACTED:<name>]` and reported; credential formats are reported (not redacted).
pub fn scan(input: &[u8], secrets: &[KnownSecret]) -> ScanOutput {
    scan_with(input, secrets, ScanOptions::default())
}

/// [`scan`] with options.
pub fn scan_with(input: &[u8], secrets: &[KnownSecret], opts: ScanOptions) -> ScanOutput {
    // (start, end, finding, replacement)
    let mut spans: Vec<(usize, usize, Finding, Option<Vec<u8>>)> = Vec::new();
    for s in secrets {
        if s.value.is_empty() {
            continue;
        }
        for form in s.forms() {
            for pos in memchr::memmem::find_iter(input, &form) {
                spans.push((
                    pos,
                    pos + form.len(),
                    Finding {
                        kind: FindingKind::KnownSecret,
                        name: Some(s.name.clone()),
                        offset: pos,
                        len: form.len(),
                        redacted: true,
                        stream: None,
                        file: None,
                    },
                    Some(format!("[REDACTED:{}]", s.name).into_bytes()),
                ));
            }
        }
    }
    let patterns: &[(FindingKind, Regex)] = if may_hold_credentials(input) {
        &PATTERNS
    } else {
        &[]
    };
    for (kind, re) in patterns {
        for m in re.find_iter(input) {
            spans.push((
                m.start(),
                m.end(),
                Finding {
                    kind: *kind,
                    name: None,
                    offset: m.start(),
                    len: m.len(),
                    redacted: opts.redact_patterns,
                    stream: None,
                    file: None,
                },
                opts.redact_patterns
                    .then(|| format!("[REDACTED:{kind:?}]").into_bytes()),
            ));
        }
    }
    // Known secrets before patterns at the same start; longer spans first.
    spans.sort_by(|a, b| {
        a.0.cmp(&b.0).then((b.1 - b.0).cmp(&(a.1 - a.0))).then(
            (a.2.kind != FindingKind::KnownSecret).cmp(&(b.2.kind != FindingKind::KnownSecret)),
        )
    });
    let mut out = Vec::with_capacity(input.len());
    let mut findings = Vec::new();
    let mut cursor = 0usize;
    let mut covered_to = 0usize;
    for (start, end, finding, repl) in spans {
        if start < covered_to {
            // Overlaps an earlier finding. A known secret inside a pattern match must still
            // be redacted, so widen the earlier redaction instead of skipping it.
            if finding.kind == FindingKind::KnownSecret && end > cursor {
                if start > cursor {
                    out.extend_from_slice(&input[cursor..start]);
                }
                out.extend_from_slice(repl.as_deref().unwrap_or(b"[REDACTED]"));
                cursor = end;
                covered_to = covered_to.max(end);
                findings.push(finding);
            }
            continue;
        }
        findings.push(finding);
        covered_to = end;
        if let Some(r) = repl {
            out.extend_from_slice(&input[cursor..start]);
            out.extend_from_slice(&r);
            cursor = end;
        }
    }
    out.extend_from_slice(&input[cursor.min(input.len())..]);
    ScanOutput {
        bytes: out,
        findings,
    }
}

/// Streaming detector: reports whether any needle appears in a byte stream fed in chunks,
/// across chunk boundaries.
#[derive(Debug, Clone)]
pub(crate) struct StreamDetector {
    needles: Vec<(usize, Vec<u8>)>,
    tail: Vec<u8>,
    keep: usize,
}

impl StreamDetector {
    pub(crate) fn new(needles: Vec<(usize, Vec<u8>)>) -> Self {
        let keep = needles
            .iter()
            .map(|(_, n)| n.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        StreamDetector {
            needles,
            tail: Vec::new(),
            keep,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Feeds a chunk; returns the id of a needle that is now complete, if any.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Option<usize> {
        if self.needles.is_empty() {
            return None;
        }
        // boundary region: tail + start of chunk
        let head = &chunk[..chunk.len().min(self.keep)];
        let mut joint = std::mem::take(&mut self.tail);
        joint.extend_from_slice(head);
        for (id, n) in &self.needles {
            if memchr::memmem::find(&joint, n).is_some() || memchr::memmem::find(chunk, n).is_some()
            {
                return Some(*id);
            }
        }
        // new tail: last `keep` bytes of (old tail + chunk)
        if chunk.len() >= self.keep {
            self.tail = chunk[chunk.len() - self.keep..].to_vec();
        } else {
            let drop = joint.len().saturating_sub(head.len());
            let mut t = joint[..drop].to_vec();
            t.extend_from_slice(chunk);
            let start = t.len().saturating_sub(self.keep);
            self.tail = t[start..].to_vec();
        }
        None
    }
}

/// Streaming redactor: replaces each needle by a same-length mask in a byte stream fed in
/// chunks, holding back just enough bytes to catch a needle split across chunks.
pub(crate) struct StreamRedactor {
    needles: Vec<zeroize::Zeroizing<Vec<u8>>>,
    pending: Vec<u8>,
    keep: usize,
    pub(crate) hits: usize,
}

impl StreamRedactor {
    pub(crate) fn new(needles: Vec<zeroize::Zeroizing<Vec<u8>>>) -> Self {
        let keep = needles
            .iter()
            .map(|n| n.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        StreamRedactor {
            needles,
            pending: Vec::new(),
            keep,
            hits: 0,
        }
    }

    /// Feeds a chunk, returns what can be released now.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        self.redact_pending();
        let release = self.pending.len().saturating_sub(self.keep);
        let rest = self.pending.split_off(release);
        std::mem::replace(&mut self.pending, rest)
    }

    /// Releases everything held back (end of stream).
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        self.redact_pending();
        std::mem::take(&mut self.pending)
    }

    fn redact_pending(&mut self) {
        for n in &self.needles {
            if n.is_empty() {
                continue;
            }
            let positions: Vec<usize> =
                memchr::memmem::find_iter(&self.pending, n.as_slice()).collect();
            for p in positions {
                // a previous replacement in this pass may have covered it already
                if self.pending[p..p + n.len()] == n[..] {
                    self.pending[p..p + n.len()].fill(b'*');
                    self.hits += 1;
                }
            }
        }
    }
}

/// Redacts needles in a complete byte string with the same-length mask.
pub(crate) fn redact_bytes(
    input: &[u8],
    needles: &[zeroize::Zeroizing<Vec<u8>>],
) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for n in needles {
        if n.is_empty() {
            continue;
        }
        let cur = out.as_deref().unwrap_or(input);
        if memchr::memmem::find(cur, n.as_slice()).is_some() {
            let mask = vec![b'*'; n.len()];
            out = Some(crate::secrets::replace_all(cur, n.as_slice(), &mask));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_secrets_redacted_in_every_form() {
        let s = KnownSecret::new("gh", "s3cr3t-value-XYZ");
        let b64 = STANDARD.encode("s3cr3t-value-XYZ");
        let hexs = hex::encode("s3cr3t-value-XYZ");
        let input = format!("a s3cr3t-value-XYZ b {b64} c {hexs} d");
        let out = scan(input.as_bytes(), &[s]);
        let text = String::from_utf8(out.bytes).unwrap();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains(&hexs));
        assert!(!text.contains(b64.trim_end_matches('=')));
        assert_eq!(text.matches("[REDACTED:gh]").count(), 3, "{text}");
        assert_eq!(out.findings.len(), 3);
        assert!(
            out.findings
                .iter()
                .all(|f| f.redacted && f.kind == FindingKind::KnownSecret)
        );
        assert!(!format!("{:?}", out.findings).contains("s3cr3t"));
    }

    #[test]
    fn credential_formats_flagged() {
        let cases: &[(&str, FindingKind)] = &[
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
                FindingKind::PrivateKey,
            ),
            (
                "-----BEGIN OPENSSH PRIVATE KEY-----\ntruncated",
                FindingKind::PrivateKey,
            ),
            (
                "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----",
                FindingKind::PrivateKey,
            ),
            ("key=AKIAIOSFODNN7EXAMPLE;", FindingKind::AwsAccessKeyId),
            (
                "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
                FindingKind::GithubToken,
            ),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
                FindingKind::GithubToken,
            ),
            ("glpat-abcdefghij0123456789", FindingKind::GitlabToken),
            ("xoxb-1234567890-abcdefghij", FindingKind::SlackToken),
            ("sk_live_abcdefghijklmnop1234", FindingKind::StripeKey),
            (
                "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
                FindingKind::GoogleApiKey,
            ),
            (
                "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789",
                FindingKind::AiApiKey,
            ),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJlX2hlcmU",
                FindingKind::Jwt,
            ),
        ];
        for (text, kind) in cases {
            // The cheap prefilter must never hide a credential the patterns would find.
            assert!(may_hold_credentials(text.as_bytes()), "{text}");
            let out = scan(text.as_bytes(), &[]);
            assert!(
                out.findings.iter().any(|f| f.kind == *kind),
                "{text}: {:?}",
                out.findings
            );
            // flagged, not redacted, by default
            assert_eq!(out.bytes, text.as_bytes());
            let out = scan_with(
                text.as_bytes(),
                &[],
                ScanOptions {
                    redact_patterns: true,
                },
            );
            assert_ne!(out.bytes, text.as_bytes(), "{text}");
        }
        // one finding for a full private key block, not two
        let out = scan(cases[0].0.as_bytes(), &[]);
        assert_eq!(out.findings.len(), 1, "{:?}", out.findings);
    }

    #[test]
    fn ordinary_text_is_clean() {
        let text = "hello world, sk-short, AKIA lowercase akiaiosfodnn7example, ghp_short, eyJ.x.y, task-1234";
        let out = scan(
            text.as_bytes(),
            &[KnownSecret::new("x", "not-present-value")],
        );
        assert!(out.is_clean(), "{:?}", out.findings);
        assert_eq!(out.bytes, text.as_bytes());
    }

    #[test]
    fn known_secret_inside_pattern_still_redacted() {
        let tok = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
        let out = scan(
            format!("x {tok} y").as_bytes(),
            &[KnownSecret::new("gh", tok)],
        );
        let text = String::from_utf8(out.bytes).unwrap();
        assert!(!text.contains(tok), "{text}");
    }

    #[test]
    fn binary_input_is_fine() {
        let mut input: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        input.extend_from_slice(b"s3cr3t-value-XYZ");
        let out = scan(&input, &[KnownSecret::new("k", "s3cr3t-value-XYZ")]);
        assert_eq!(out.findings.len(), 1);
        assert!(out.bytes.ends_with(b"[REDACTED:k]"));
    }

    #[test]
    fn detector_across_chunks() {
        let needle = b"cordon-ph-0123456789abcdef".to_vec();
        for split in 0..=needle.len() {
            for pre in [0usize, 3, 40] {
                let mut d = StreamDetector::new(vec![(7, needle.clone())]);
                let mut data = vec![b'x'; pre];
                data.extend_from_slice(&needle);
                data.extend_from_slice(b"tail");
                let cut = pre + split;
                let a = d.feed(&data[..cut]);
                let b = d.feed(&data[cut..]);
                assert_eq!(a.or(b), Some(7), "split {split} pre {pre}");
            }
        }
        // byte by byte
        let mut d = StreamDetector::new(vec![(1, needle.clone())]);
        let mut seen = None;
        for b in b"zzz".iter().chain(needle.iter()) {
            seen = seen.or(d.feed(std::slice::from_ref(b)));
        }
        assert_eq!(seen, Some(1));
        let mut d = StreamDetector::new(vec![(1, needle.clone())]);
        assert_eq!(d.feed(b"cordon-ph-0123456789abcde"), None);
        assert_eq!(d.feed(b"Xf"), None);
    }

    #[test]
    fn streaming_detector_agrees_with_batch_search() {
        let needle = b"cordon-ph-abcdef".to_vec();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2_000 {
            // random text over a small alphabet with the needle sometimes planted
            let len = (next() % 200) as usize;
            let mut data: Vec<u8> = (0..len)
                .map(|_| b"cordn-phabef"[(next() % 12) as usize])
                .collect();
            if next() % 2 == 0 {
                let at = (next() as usize) % (data.len() + 1);
                data.splice(at..at, needle.iter().copied());
            }
            let want = memchr::memmem::find(&data, &needle).is_some();
            let mut d = StreamDetector::new(vec![(0, needle.clone())]);
            let mut got = false;
            let mut i = 0;
            while i < data.len() {
                let step = 1 + (next() % 20) as usize;
                let end = (i + step).min(data.len());
                got |= d.feed(&data[i..end]).is_some();
                i = end;
            }
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&data));
        }
    }

    #[test]
    fn redactor_across_chunks() {
        let secret = b"real-secret-value".to_vec();
        for split in 0..=secret.len() + 5 {
            let mut r = StreamRedactor::new(vec![zeroize::Zeroizing::new(secret.clone())]);
            let data = b"abc real-secret-value def real-secret-value".to_vec();
            let cut = (4 + split).min(data.len());
            let mut out = r.push(&data[..cut]);
            out.extend(r.push(&data[cut..]));
            out.extend(r.finish());
            assert_eq!(out.len(), data.len());
            assert!(
                memchr::memmem::find(&out, &secret).is_none(),
                "split {split}"
            );
            assert_eq!(r.hits, 2);
        }
    }

    #[test]
    fn redacting_sink_masks_secrets_split_across_chunks_in_every_encoding() {
        let secret = "s3cr3t-value-XYZ-0123";
        let basic = STANDARD.encode(format!("user:{secret}"));
        let text = format!("a {secret} b Basic {basic} c {} d", hex::encode(secret));
        let mut got: Vec<(cordon_core::OutputStream, Vec<u8>)> = Vec::new();
        let mut inner = |s: cordon_core::OutputStream, d: &[u8]| got.push((s, d.to_vec()));
        {
            let mut sink = RedactingSink::new(vec![KnownSecret::new("k", secret)], &mut inner);
            // One byte at a time: every needle is split across chunk boundaries.
            for b in text.as_bytes() {
                cordon_core::OutputSink::output(
                    &mut sink,
                    cordon_core::OutputStream::Stdout,
                    &[*b],
                );
            }
            sink.finish();
        }
        let out: Vec<u8> = got.iter().flat_map(|(_, d)| d.clone()).collect();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.len(), text.len(), "same length: {out}");
        assert!(!out.contains(secret), "{out}");
        assert!(!out.contains(&hex::encode(secret)), "{out}");
        // the characters of the Basic value that only the secret decides are masked
        assert!(!out.contains(&basic[8..basic.len() - 4]), "{out}");
        assert!(out.starts_with("a ****"), "{out}");
        assert!(out.ends_with(" d"), "{out}");
    }
}
