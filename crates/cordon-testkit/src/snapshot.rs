//! Full snapshots and forks, the same on every tier that has them (issue 46): a Python
//! variable, a running background process's counter and a file written before the
//! snapshot are in each of three sandboxes started from it; a change in one is seen by no
//! other nor by the source; each one's random stream is its own.

use std::time::{Duration, Instant};

use cordon_core::{
    Backend, ExecRequest, Language, OutputStream, Sandbox, SandboxSpec, SnapshotDir, SnapshotImage,
    SnapshotMode,
};

/// A Python process holding a variable, answering `get`, `set V` and `rand` (16 bytes of
/// `os.urandom`, drawn by this very process) one line each.
const STATE_SERVER: &str = r#"
import os, sys
state = "before-" + os.urandom(8).hex()
print("ready", state, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "get":
        print("state", state, flush=True)
    elif cmd[0] == "set":
        state = cmd[1]
        print("set", state, flush=True)
    elif cmd[0] == "rand":
        print("rand", os.urandom(16).hex(), flush=True)
"#;

/// A process counting up, one line a tick.
const COUNTER: &str = r#"
import time
i = 0
while True:
    i += 1
    print(i, flush=True)
    time.sleep(0.1)
"#;

fn python_bg(source: &str) -> ExecRequest {
    ExecRequest::argv(["python3", "-u", "-c", source])
}

/// A shell command's stdout (it must exit 0).
pub fn sh(sb: &mut dyn Sandbox, script: &str) -> String {
    let o = sb
        .exec(
            &ExecRequest::code(Language::Bash, script),
            &mut |_: OutputStream, _: &[u8]| {},
        )
        .unwrap();
    assert_eq!(
        o.exit_code,
        Some(0),
        "{script}: {} {:?}",
        String::from_utf8_lossy(&o.stderr),
        o.termination
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A background exec's whole stdout so far, once `done` holds of it (30 s at most).
fn stdout_until(sb: &mut dyn Sandbox, id: u64, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    loop {
        let got = sb
            .read_background(id, [out.len() as u64, 0], 1 << 20)
            .unwrap();
        out.extend_from_slice(&got.stdout);
        let text = String::from_utf8_lossy(&out).into_owned();
        if done(&text) {
            return text;
        }
        assert!(
            got.exit.is_none() && Instant::now() < deadline,
            "background exec {id} said only {text:?} (exit {:?})",
            got.exit
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The whole lines of `text` (a line still being written is not one yet).
fn whole_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
}

/// One request to the state server: the answer's line.
fn ask(sb: &mut dyn Sandbox, id: u64, request: &str, answer: &str) -> String {
    let before = stdout_until(sb, id, |_| true).len();
    sb.write_background(id, format!("{request}\n").as_bytes())
        .unwrap();
    let answered = |new: &str| whole_lines(new).find(|l| l.starts_with(answer)).is_some();
    let all = stdout_until(sb, id, |t| t.get(before..).is_some_and(answered));
    let line = whole_lines(&all[before..])
        .find(|l| l.starts_with(answer))
        .unwrap_or_default();
    line.trim_start_matches(answer).trim().to_string()
}

/// The counter's lines so far, checked to be 1, 2, 3, … with no gap: one process counting
/// on, never started again.
fn counted(sb: &mut dyn Sandbox, id: u64, past: u64) -> u64 {
    let text = stdout_until(sb, id, |t| {
        whole_lines(t).filter_map(|l| l.parse::<u64>().ok()).max() > Some(past)
    });
    let n: Vec<u64> = whole_lines(&text).map(|l| l.parse().unwrap()).collect();
    assert!(
        n.iter().enumerate().all(|(i, v)| *v == i as u64 + 1),
        "the counter restarted or skipped: {n:?}"
    );
    *n.last().unwrap()
}

/// What tells two sandboxes apart, read from one.
pub type Identity = dyn Fn(&mut dyn Sandbox) -> String;

/// The source, three sandboxes started from its full snapshot (concurrently), and the
/// checks of the module's documentation. `identity` reads what must differ between any two
/// of them beyond their random streams (a hostname and a MAC on the microvm tier);
/// `None` where the tier has no such thing to tell apart.
pub fn three_forks(b: &dyn Backend, spec: &SandboxSpec, identity: Option<&Identity>) {
    let mut src = b.create(spec).unwrap();
    sh(src.as_mut(), "echo written-before > /work/before.txt");
    let py = src.start_background(&python_bg(STATE_SERVER)).unwrap();
    let ready = stdout_until(src.as_mut(), py, |t| t.contains('\n'));
    let state = ready.trim().trim_start_matches("ready").trim().to_string();
    assert!(state.starts_with("before-"), "{ready}");
    let counter = src.start_background(&python_bg(COUNTER)).unwrap();
    let at_snapshot = counted(src.as_mut(), counter, 3);

    let dir = tempfile::tempdir().unwrap();
    let image: SnapshotImage = src
        .snapshot(SnapshotMode::Full, &SnapshotDir::new(dir.path()))
        .unwrap();
    assert_eq!((image.tier, image.mode), (spec.tier, SnapshotMode::Full));
    assert!(image.bytes > 0);
    // The source runs on: its counter keeps counting, its variable is as it was.
    counted(src.as_mut(), counter, at_snapshot + 2);
    assert_eq!(ask(src.as_mut(), py, "get", "state"), state);

    let image_dir = SnapshotDir::new(dir.path());
    let mut forks: Vec<Box<dyn Sandbox>> = std::thread::scope(|s| {
        let started: Vec<_> = (0..3)
            .map(|_| s.spawn(|| b.start_from_snapshot(&image, &image_dir, spec).unwrap()))
            .collect();
        started.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The image may go while its forks live (the server deletes it when told to).
    drop(dir);
    let mut ids = vec![src.id().clone()];
    for f in forks.iter_mut() {
        ids.push(f.id().clone());
        // The variable, the counter (the same process, counting on past the snapshot), the file.
        assert_eq!(ask(f.as_mut(), py, "get", "state"), state);
        let n = counted(f.as_mut(), counter, at_snapshot);
        assert!(n > at_snapshot, "{n} <= {at_snapshot}");
        assert_eq!(sh(f.as_mut(), "cat /work/before.txt"), "written-before\n");
    }
    ids.sort_by(|a, c| a.as_str().cmp(c.as_str()));
    ids.dedup();
    assert_eq!(ids.len(), 4, "every fork has an id of its own");

    // A change in fork 0 (the variable, the file, a new file) is seen by no other.
    assert_eq!(
        ask(forks[0].as_mut(), py, "set changed-in-0", "set"),
        "changed-in-0"
    );
    sh(
        forks[0].as_mut(),
        "echo changed > /work/before.txt && touch /work/only-in-0",
    );
    assert_eq!(ask(forks[0].as_mut(), py, "get", "state"), "changed-in-0");
    let mut others: Vec<&mut Box<dyn Sandbox>> = forks.iter_mut().skip(1).collect();
    others.push(&mut src);
    for sb in others {
        assert_eq!(ask(sb.as_mut(), py, "get", "state"), state);
        assert_eq!(
            sh(sb.as_mut(), "cat /work/before.txt; ls /work"),
            "written-before\nbefore.txt\n"
        );
    }

    // Each one's random stream is its own, drawn by the restored process itself.
    let mut all: Vec<&mut Box<dyn Sandbox>> = forks.iter_mut().collect();
    all.push(&mut src);
    let mut streams = Vec::new();
    let mut identities = Vec::new();
    for sb in all {
        streams.push(ask(sb.as_mut(), py, "rand", "rand"));
        if let Some(read) = identity {
            identities.push(read(sb.as_mut()));
        }
    }
    eprintln!("random streams {streams:?}, identities {identities:?}");
    for seen in [&mut streams, &mut identities] {
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n, "two sandboxes share {seen:?}");
    }
    for mut f in forks {
        f.destroy().unwrap();
    }
    src.destroy().unwrap();
}

/// A source with egress to an upstream on loopback, snapshotted and destroyed: each of two
/// sandboxes started from the snapshot reaches the upstream through a proxy of its own (its
/// exec's report audits the request; the source's proxy is gone with it), and so does a
/// background process restored from the source's memory.
pub fn forks_have_their_own_egress(b: &dyn Backend, mut spec: SandboxSpec) {
    let up = crate::egress::Upstream::start();
    let p = up.port;
    spec.egress.allow = vec![format!("127.0.0.1/32:{p}").parse().unwrap()];
    let mut src = b.create(&spec).unwrap();
    let fetch = |path: &str| format!("curl -s --max-time 10 http://127.0.0.1:{p}/{path}");
    assert_eq!(
        sh(src.as_mut(), &fetch("source")),
        crate::egress::Upstream::BODY
    );
    // A process that fetches each time it is told to, from the source's memory.
    let fetcher = src
        .start_background(&ExecRequest::code(
            Language::Bash,
            format!("while read -r path; do {}; echo; done", fetch("$path")),
        ))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let image = src
        .snapshot(SnapshotMode::Full, &SnapshotDir::new(dir.path()))
        .unwrap();
    src.destroy().unwrap();
    for n in 0..2 {
        let mut f = b
            .start_from_snapshot(&image, &SnapshotDir::new(dir.path()), &spec)
            .unwrap();
        let o = f
            .exec(
                &ExecRequest::code(Language::Bash, fetch(&format!("fork-{n}"))),
                &mut |_: OutputStream, _: &[u8]| {},
            )
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            crate::egress::Upstream::BODY,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            o.extra
                .egress
                .iter()
                .any(|e| e.decision == cordon_core::EgressDecision::Allow),
            "the fork's proxy audited nothing: {:?}",
            o.extra.egress
        );
        f.write_background(fetcher, format!("restored-{n}\n").as_bytes())
            .unwrap();
        stdout_until(f.as_mut(), fetcher, |t| {
            t.contains(crate::egress::Upstream::BODY)
        });
        f.destroy().unwrap();
    }
    let seen: Vec<String> = up
        .requests()
        .iter()
        .map(|h| h.split(' ').nth(1).unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        seen,
        [
            "/source",
            "/fork-0",
            "/restored-0",
            "/fork-1",
            "/restored-1"
        ]
    );
}

/// Prints what a full snapshot and forks from it cost on a tier, for a Python process idle
/// and one holding `hold_mib` MiB of random bytes (which no compression shrinks): the source's pause and resume, the
/// snapshot's time and size, the time to start N forks (N = 1, then 3 at once) and to their
/// first exec, and each fork's memory as `memory_of` reads it from the host (None: not
/// measured). Figures, not assertions: ADR 0027 records them.
pub fn figures(
    b: &dyn Backend,
    spec: &SandboxSpec,
    hold_mib: u64,
    memory_of: &dyn Fn(&cordon_core::SandboxId) -> Option<u64>,
) {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
    println!("tier {}", spec.tier);
    for mib in [0, hold_mib] {
        let mut src = b.create(spec).unwrap();
        let holder = format!(
            "import os, sys\nb = bytearray(os.urandom({mib} << 20))\nprint('held', flush=True)\nsys.stdin.read()"
        );
        let id = src.start_background(&python_bg(&holder)).unwrap();
        stdout_until(src.as_mut(), id, |t| t.contains("held"));
        let t = Instant::now();
        src.pause().unwrap();
        let pause_ms = ms(t);
        let t = Instant::now();
        src.resume().unwrap();
        let resume_ms = ms(t);
        let dir = tempfile::tempdir().unwrap();
        let image_dir = SnapshotDir::new(dir.path());
        let t = Instant::now();
        let image = src.snapshot(SnapshotMode::Full, &image_dir).unwrap();
        let snapshot_ms = ms(t);
        let t = Instant::now();
        sh(src.as_mut(), "true");
        let source_exec_ms = ms(t);
        println!(
            "  python holding {mib} MiB: pause {pause_ms:.0} ms, resume {resume_ms:.0} ms; \
             snapshot {snapshot_ms:.0} ms, image {:.1} MiB; the source's next exec {source_exec_ms:.0} ms",
            image.bytes as f64 / (1 << 20) as f64
        );
        for n in [1usize, 3] {
            let t = Instant::now();
            let mut forks: Vec<(Box<dyn Sandbox>, f64)> = std::thread::scope(|s| {
                let started: Vec<_> = (0..n)
                    .map(|_| {
                        s.spawn(|| {
                            let t = Instant::now();
                            let f = b.start_from_snapshot(&image, &image_dir, spec).unwrap();
                            (f, ms(t))
                        })
                    })
                    .collect();
                started.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let all_ms = ms(t);
            let mut first_exec = Vec::new();
            let mut memory = Vec::new();
            for (f, _) in forks.iter_mut() {
                let t = Instant::now();
                sh(f.as_mut(), "true");
                first_exec.push(format!("{:.0}", ms(t)));
                memory.push(memory_of(f.id()).map_or("-".to_string(), |m| {
                    format!("{:.0}", m as f64 / (1 << 20) as f64)
                }));
            }
            let each: Vec<String> = forks.iter().map(|(_, m)| format!("{m:.0}")).collect();
            println!(
                "    {n} fork(s): all started in {all_ms:.0} ms (each {} ms); first exec {} ms; memory {} MiB",
                each.join("/"),
                first_exec.join("/"),
                memory.join("/")
            );
            for (mut f, _) in forks {
                f.destroy().unwrap();
            }
        }
        src.destroy().unwrap();
    }
}

/// A filesystem snapshot: a sandbox started from it has the files of `/work` (written by a
/// program, owned so its own programs can change them) and none of the source's processes
/// (a background exec's id is unknown there); a change in it does not reach the source.
pub fn filesystem_snapshot_restarts_processes(b: &dyn Backend, spec: &SandboxSpec) {
    let mut src = b.create(spec).unwrap();
    sh(
        src.as_mut(),
        "mkdir -p /work/d && echo kept > /work/d/f.txt && ln -s d/f.txt /work/link",
    );
    let counter = src.start_background(&python_bg(COUNTER)).unwrap();
    counted(src.as_mut(), counter, 1);
    let dir = tempfile::tempdir().unwrap();
    let image = src
        .snapshot(SnapshotMode::Filesystem, &SnapshotDir::new(dir.path()))
        .unwrap();
    assert_eq!(image.mode, SnapshotMode::Filesystem);
    let mut f = b
        .start_from_snapshot(&image, &SnapshotDir::new(dir.path()), spec)
        .unwrap();
    assert_ne!(f.id(), src.id());
    assert_eq!(sh(f.as_mut(), "cat /work/link"), "kept\n");
    assert!(
        f.read_background(counter, [0, 0], 1024).is_err(),
        "a process of the source runs in a sandbox started from its files"
    );
    sh(
        f.as_mut(),
        "echo changed > /work/d/f.txt && touch /work/new",
    );
    assert_eq!(
        sh(src.as_mut(), "cat /work/d/f.txt; ls /work"),
        "kept\nd\nlink\n"
    );
    counted(src.as_mut(), counter, 3);
    f.destroy().unwrap();
    src.destroy().unwrap();
}
