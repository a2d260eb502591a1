//! The start-up phase's subjects: each tier's cycle, whole `cordon` processes and the
//! peers, measured round by round.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cordon_core::Tier;

use cordon_policy::bench_doc::{Figure, FigureKind, PeerReport, Stats, Status, TierReport};

use super::live::{LiveTier, Out, Plan, cycle, fail, languages_of, short_name};
use super::peers;

/// The `cordon` front beside this binary (this binary when there is none).
pub(super) fn front_binary() -> Result<PathBuf> {
    let this = std::env::current_exe()?;
    Ok(this
        .parent()
        .map(|d| d.join("cordon"))
        .filter(|p| p.is_file())
        .unwrap_or(this))
}

/// A whole `cordon` process as a start-up subject (kind `cli`): `exe` with `args`, output
/// discarded, success required.
pub(super) fn cli_subject(
    name: &str,
    tier: Tier,
    exe: &std::path::Path,
    args: &[&str],
    note: &str,
) -> Subject {
    let shown = format!("cordon {}", args.join(" "));
    let (exe, args): (PathBuf, Vec<String>) = (
        exe.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    Subject {
        name: name.into(),
        kind: FigureKind::Cli,
        tier: Some(tier),
        what: format!("`{shown}`, {tier} tier, end to end (a whole CLI process; {note})"),
        run: Box::new(move || {
            let st = Command::new(&exe)
                .args(&args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                bail!("`{shown}` failed: {st}; try it by hand to see why");
            }
            Ok(())
        }),
        samples: Vec::new(),
        spent: Duration::ZERO,
        error: None,
    }
}

/// A subject of the interleaved start-up phase.
pub(super) struct Subject {
    pub(super) name: String,
    pub(super) kind: FigureKind,
    pub(super) tier: Option<Tier>,
    pub(super) what: String,
    pub(super) run: Box<dyn FnMut() -> Result<()>>,
    pub(super) samples: Vec<Duration>,
    pub(super) spent: Duration,
    pub(super) error: Option<String>,
}

/// Whether the ELF executable at `path` asks for a dynamic loader (has a `PT_INTERP`
/// program header); `None` when it cannot be read as a 64-bit little-endian ELF file.
pub(super) fn dynamically_linked(path: &std::path::Path) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    const PT_INTERP: u32 = 3;
    let mut f = std::fs::File::open(path).ok()?;
    let mut eh = [0u8; 64];
    f.read_exact(&mut eh).ok()?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(eh[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes(eh[54..56].try_into().ok()?) as usize;
    let phnum = u16::from_le_bytes(eh[56..58].try_into().ok()?) as usize;
    if phentsize < 4 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; phentsize * phnum];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut ph).ok()?;
    Some(ph.chunks(phentsize).any(|h| {
        h.get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            == Some(PT_INTERP)
    }))
}

/// The start-up phase: each live tier's cycle, whole `cordon` processes and the peers,
/// measured round by round; each tier's cold start goes into its report. Returns the
/// figures and the peers' reports.
pub(super) fn measure(
    plan: &Plan,
    live: &[LiveTier],
    (peer_names, scratch): (&[String], &Path),
    template: Option<&str>,
    tiers: &mut [TierReport],
    out: &Out,
) -> Result<(Vec<Figure>, Vec<PeerReport>)> {
    let (peer_list, missing) = peers::build(peer_names, scratch);
    let mut peer_reports: Vec<PeerReport> = Vec::new();
    for m in missing {
        out.note(&format!(
            "cordon bench: SKIPPING peer {}: {}",
            m.name, m.reason
        ));
        peer_reports.push(PeerReport {
            peer: m.name.to_string(),
            status: Status::Skipped,
            reason: Some(m.reason),
            what: String::new(),
            counterpart_of: Vec::new(),
            cold_start: None,
            measured_unix: None,
        });
    }
    let mut subjects: Vec<Subject> = Vec::new();
    for lt in live {
        subjects.extend(tier_subjects(lt, template)?);
    }
    let counterparts = peer_subjects(peer_list, &mut subjects, &mut peer_reports, out);
    rounds(&mut subjects, plan, out);
    let figures = figures_of(&subjects, &counterparts, tiers, &mut peer_reports, out);
    peer_reports.sort_by_key(|p| {
        peers::NAMES
            .iter()
            .position(|n| *n == p.peer)
            .unwrap_or(usize::MAX)
    });

    Ok((figures, peer_reports))
}

/// A live tier's start-up subjects: its in-process cycle, and the whole `cordon` processes
/// that run on it (the front's `cordon run`, from a template too, and each language).
fn tier_subjects(lt: &LiveTier, template: Option<&str>) -> Result<Vec<Subject>> {
    let mut subjects = Vec::new();
    let (b, spec, req) = (lt.backend.clone(), lt.spec.clone(), lt.trivial.clone());
    subjects.push(Subject {
        name: lt.spec.tier.to_string(),
        kind: FigureKind::Tier,
        tier: None,
        what: format!(
            "{} tier in-process: create + trivial exec + destroy",
            lt.spec.tier
        ),
        run: Box::new(move || cycle(b.as_ref(), &spec, &req)),
        samples: Vec::new(),
        spent: Duration::ZERO,
        error: None,
    });
    // The whole CLI, end to end: what a user pays per `cordon run` (the `cordon` front
    // beside this binary; the container tier runs without cordon-full).
    let exe = front_binary()?;
    if lt.spec.tier.features().front_runs {
        let init = exe.with_file_name(cordon_container::INIT_BINARY);
        let linked = match (dynamically_linked(&exe), dynamically_linked(&init)) {
            (Some(false), Some(false)) => "static front and init".to_string(),
            (Some(true), _) | (_, Some(true)) => {
                "dynamically linked front or init: `make build` makes both static".to_string()
            }
            _ => "linkage unknown".to_string(),
        };
        subjects.push(cli_subject(
            "cordon-run",
            Tier::Container,
            &exe,
            &["run", "--", "sh", "-c", "true"],
            &linked,
        ));
        if let Some(t) = template {
            subjects.push(cli_subject(
                "cordon-run-template",
                Tier::Container,
                &exe,
                &["run", "--template", t, "--", "sh", "-c", "true"],
                &format!("the root made from template {t}; {linked}"),
            ));
        }
    }
    let languages = languages_of(lt.spec.tier);
    if !languages.is_empty() {
        // What a user's `cordon run` goes through is the front; without one beside this
        // binary the figure is this binary's own start, and says so.
        let via = if exe.file_name().is_some_and(|n| n == "cordon") {
            "a new process each time, through the `cordon` front"
        } else {
            "a new process each time, of this binary itself: there is no `cordon` front \
             beside it (`make build` makes one)"
        };
        let tier = lt.spec.tier;
        for (lang, code) in languages {
            subjects.push(cli_subject(
                &format!("cordon-run-{tier}-{}", short_name(lang)),
                tier,
                &exe,
                &[
                    "run",
                    "--tier",
                    tier.as_str(),
                    "--lang",
                    lang.as_str(),
                    "-c",
                    code,
                ],
                via,
            ));
        }
    }
    Ok(subjects)
}

/// Warms each peer up: those that run become subjects (their counterparts returned), those
/// that do not are reported skipped.
fn peer_subjects(
    peer_list: Vec<peers::Peer>,
    subjects: &mut Vec<Subject>,
    peer_reports: &mut Vec<PeerReport>,
    out: &Out,
) -> Vec<(String, Vec<Tier>)> {
    let mut counterparts = Vec::new();
    for mut p in peer_list {
        out.step(format!("peer {}: warm-up", p.name));
        match p.run() {
            Ok(()) => {
                counterparts.push((p.name.to_string(), p.counterpart_of.clone()));
                subjects.push(Subject {
                    name: p.name.to_string(),
                    kind: FigureKind::Peer,
                    tier: None,
                    what: p.what.clone(),
                    run: Box::new(move || p.run()),
                    samples: Vec::new(),
                    spent: Duration::ZERO,
                    error: None,
                });
            }
            Err(e) => {
                let reason = format!("does not run here: {e:#}");
                out.note(&format!("cordon bench: SKIPPING peer {}: {reason}", p.name));
                peer_reports.push(PeerReport {
                    peer: p.name.to_string(),
                    status: Status::Skipped,
                    reason: Some(reason),
                    what: p.what.clone(),
                    counterpart_of: p.counterpart_of.clone(),
                    cold_start: None,
                    measured_unix: None,
                });
            }
        }
    }
    counterparts
}

/// Runs the subjects round by round until each has its samples (or failed).
fn rounds(subjects: &mut [Subject], plan: &Plan, out: &Out) {
    // The cordon-run subject has had no warm-up yet.
    for s in subjects.iter_mut().filter(|s| s.kind == FigureKind::Cli) {
        if let Err(e) = (s.run)() {
            s.error = Some(format!("{e:#}"));
        }
    }
    let mut round = 0;
    loop {
        let mut any = false;
        round += 1;
        for s in subjects.iter_mut() {
            if s.error.is_some() || !plan.samples.wants_more(s.samples.len(), s.spent) {
                continue;
            }
            any = true;
            out.step(format!("start-up round {round}: {}", s.name));
            let t = Instant::now();
            let r = (s.run)();
            let el = t.elapsed();
            s.spent += el;
            match r {
                Ok(()) => s.samples.push(el),
                Err(e) => s.error = Some(format!("{e:#}")),
            }
        }
        if !any {
            break;
        }
    }
    out.done();
}

/// The figures of the subjects that ran; each tier's cold start (or its failure) goes into
/// its report, each peer's into a peer report.
fn figures_of(
    subjects: &[Subject],
    counterparts: &[(String, Vec<Tier>)],
    tiers: &mut [TierReport],
    peer_reports: &mut Vec<PeerReport>,
    out: &Out,
) -> Vec<Figure> {
    let mut figures = Vec::new();
    for s in subjects {
        let stats = Stats::of(&s.samples);
        if let Some(st) = stats
            && s.error.is_none()
        {
            figures.push(Figure {
                subject: s.name.clone(),
                kind: s.kind,
                tier: s.tier,
                what: s.what.clone(),
                median_us: st.median_us,
                p90_us: st.p90_us,
                min_us: st.min_us,
                samples: st.samples,
                measured_unix: None,
            });
        }
        match s.kind {
            FigureKind::Tier => {
                if let Some(rep) = tiers.iter_mut().find(|r| r.tier.as_str() == s.name) {
                    match &s.error {
                        Some(e) => fail(rep, "cold start", &anyhow::anyhow!("{e}"), out),
                        None => rep.cold_start = stats,
                    }
                }
            }
            FigureKind::Peer => {
                if let Some(e) = &s.error {
                    out.note(&format!("cordon bench: peer {} failed: {e}", s.name));
                }
                peer_reports.push(PeerReport {
                    peer: s.name.clone(),
                    status: if s.error.is_some() {
                        Status::Failed
                    } else {
                        Status::Measured
                    },
                    reason: s.error.clone(),
                    what: s.what.clone(),
                    counterpart_of: counterparts
                        .iter()
                        .find(|(n, _)| *n == s.name)
                        .map(|(_, c)| c.clone())
                        .unwrap_or_default(),
                    cold_start: if s.error.is_some() { None } else { stats },
                    measured_unix: None,
                });
            }
            _ => {
                if let Some(e) = &s.error {
                    out.note(&format!("cordon bench: {} failed: {e}", s.name));
                }
            }
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::dynamically_linked;

    #[test]
    fn linkage_is_read_from_the_program_headers() {
        // This test binary is a dynamically linked glibc program.
        let me = std::env::current_exe().unwrap();
        assert_eq!(dynamically_linked(&me), Some(true));
        // A file that is not ELF, and one that is too short, are unknown, not static.
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\necho hi\n".repeat(10)).unwrap();
        assert_eq!(dynamically_linked(&text), None);
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x7fELF\x02\x01").unwrap();
        assert_eq!(dynamically_linked(&short), None);
        // An ELF header whose program headers have no PT_INTERP reads as static.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        let fake = dir.path().join("static");
        std::fs::write(&fake, &elf).unwrap();
        assert_eq!(dynamically_linked(&fake), Some(false));
        elf[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        std::fs::write(&fake, &elf).unwrap();
        assert_eq!(dynamically_linked(&fake), Some(true));
    }
}
