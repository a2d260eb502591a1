//! `cordon template build` as a user types it: a step that `pip install`s a wheel the test
//! made from an index the test serves on loopback, through Cordon's egress proxy (with an
//! explicit allow for that one port), then code importing it on the container and gVisor
//! tiers; the cache, the audit row, the base left untouched, and a step refused a host
//! outside its allow-list.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use cordon_testkit::image::{Image, pip_layer, python_layer};
use cordon_testkit::pyindex::{PyIndex, wheel};

const BIN: &str = env!("CARGO_BIN_EXE_cordon-full");

use cordon_testkit::skip;

fn cordon(home: &Path, args: &[&str]) -> Output {
    cordon_testkit::cordon_at(BIN, home, args)
}

/// `cordon run --tier TIER --template TEMPLATE --lang python -c CODE`.
fn run_python(home: &Path, tier: &str, template: &str, code: &str) -> Output {
    cordon(
        home,
        &[
            "run",
            "--tier",
            tier,
            "--template",
            template,
            "--lang",
            "python",
            "-c",
            code,
        ],
    )
}

/// `cordon audit --data-dir HOME --kind KIND --json`, which must succeed.
fn audit_rows(home: &Path, kind: &str) -> Output {
    let dir = home.to_str().unwrap();
    let o = cordon(
        home,
        &["audit", "--data-dir", dir, "--kind", kind, "--json"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    o
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A data dir of the test's own, passable like /var/lib/cordon, holding the template
/// `pybase` (the host's Python and pip, no packages); `None` after a SKIPPING line.
fn home_with_python_base(test: &str) -> Option<tempfile::TempDir> {
    if !nix::unistd::geteuid().is_root() {
        skip(test, "the container tier needs root");
        return None;
    }
    let (Some(py), Some(pip)) = (python_layer(), pip_layer()) else {
        skip(
            test,
            "the host lacks python3, bash, busybox or pip (apt-get install python3-pip busybox-static)",
        );
        return None;
    };
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // The microvm tier's guest image (kernel, initramfs, root) as built for the host, each
    // file linked: this data dir's snapshots and template disks stay its own.
    let real = cordon_microvm::image::image_dir(&cordon_microvm::image::default_data_dir());
    if real.join("manifest.json").is_file() {
        let mine = home.path().join("microvm");
        std::fs::create_dir(&mine).unwrap();
        for e in std::fs::read_dir(&real).unwrap().flatten() {
            let name = e.file_name();
            if name != "snapshots" && name != "run" {
                std::os::unix::fs::symlink(e.path(), mine.join(name)).unwrap();
            }
        }
    }
    let image = Image {
        layers: vec![(py, false), (pip, true)],
        env: vec!["PATH=/usr/bin:/bin".into()],
    };
    let file = home.path().join("pybase.tar");
    std::fs::write(&file, image.docker_tar()).unwrap();
    let o = cordon(
        home.path(),
        &[
            "template",
            "import",
            file.to_str().unwrap(),
            "--name",
            "pybase",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    Some(home)
}

fn pip_step(port: u16) -> String {
    format!(
        "python3 -m pip install --no-cache-dir --disable-pip-version-check --no-input \
         --index-url http://127.0.0.1:{port}/simple/ --target /opt/lib thepkg"
    )
}

/// Every path under `dir` (relative), sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

fn root_of(home: &Path, name: &str) -> std::path::PathBuf {
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(home.join(format!("templates/names/{name}.json"))).unwrap(),
    )
    .unwrap();
    let digest = m["digest"].as_str().unwrap();
    home.join("templates/roots")
        .join(digest.trim_start_matches("sha256:"))
}

#[test]
fn build_installs_a_wheel_from_a_loopback_index_and_runs_on_every_native_tier() {
    let test = "build_installs_a_wheel_from_a_loopback_index_and_runs_on_every_native_tier";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let base_before = listing(&root_of(h, "pybase"));
    let index = PyIndex::start(vec![wheel("thepkg", "VALUE = 'from-the-wheel'\n")]);
    let step = pip_step(index.port);
    let cidr = format!("127.0.0.1/32:{}", index.port);
    let args = [
        "template",
        "build",
        "data-py",
        "--from",
        "pybase",
        "--run",
        &step,
        "--run",
        "echo built-by-step-two > /opt/marker",
        "--allow-cidr",
        &cidr,
        "--env",
        "PYTHONPATH=/opt/lib",
    ];
    let o = cordon(h, &args);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}\n{}", text(&o.stdout));
    assert!(
        err.contains("[step 1/2]") && err.contains("[step 2/2]"),
        "{err}"
    );
    assert!(
        text(&o.stdout).starts_with("built data-py sha256:"),
        "{}",
        text(&o.stdout)
    );
    let seen = index.requests();
    assert!(
        seen.iter()
            .any(|p| p == "/files/thepkg-1.0-py3-none-any.whl"),
        "pip fetched no wheel from the index: {seen:?}"
    );

    // The same inputs again: cached, nothing runs, the index sees nothing.
    let o = cordon(h, &args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("is cached"), "{}", text(&o.stdout));
    assert!(!text(&o.stderr).contains("[step"), "{}", text(&o.stderr));
    assert_eq!(index.requests().len(), seen.len());

    // `ls` says what it was built from and the inputs' digest.
    let o = cordon(h, &["template", "ls"]);
    let ls = text(&o.stdout);
    let row = ls.lines().find(|l| l.starts_with("data-py ")).expect(&ls);
    assert!(
        row.contains("build from template pybase, inputs sha256:"),
        "{ls}"
    );

    // Code importing the package, with the template's PYTHONPATH, on every native tier.
    for tier in ["container", "gvisor", "microvm"] {
        let o = run_python(
            h,
            tier,
            "data-py",
            "import thepkg; print(thepkg.VALUE, open('/opt/marker').read().strip())",
        );
        assert!(o.status.success(), "{tier}: {}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout).trim(),
            "from-the-wheel built-by-step-two",
            "{tier}"
        );
    }

    // The build's writes never reached its base.
    assert_eq!(listing(&root_of(h, "pybase")), base_before);
    let o = cordon(
        h,
        &[
            "run",
            "--template",
            "pybase",
            "--",
            "sh",
            "-c",
            "test -e /opt/lib || test -e /opt/marker || echo clean",
        ],
    );
    assert_eq!(text(&o.stdout).trim(), "clean", "{}", text(&o.stderr));

    // One audit row per build: built, then cached.
    let o = audit_rows(h, "template_build");
    let rows: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let results: Vec<&str> = rows
        .iter()
        .map(|r| r["detail"]["result"].as_str().unwrap())
        .collect();
    assert!(
        results.contains(&"built") && results.contains(&"cached"),
        "{rows:?}"
    );
    for r in &rows {
        assert_eq!(r["detail"]["name"], "data-py");
        assert!(
            r["detail"]["inputs_digest"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
    }
}

#[test]
fn a_build_step_cannot_reach_a_host_outside_its_allow_list() {
    let test = "a_build_step_cannot_reach_a_host_outside_its_allow_list";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let index = PyIndex::start(vec![wheel("thepkg", "VALUE = 1\n")]);
    // Allowed: another loopback port only; the index's port is not on the list.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cidr = format!("127.0.0.1/32:{}", other.local_addr().unwrap().port());
    let step = format!("{} --retries 0 --timeout 5", pip_step(index.port));
    let o = cordon(
        h,
        &[
            "template",
            "build",
            "refused",
            "--from",
            "pybase",
            "--run",
            &step,
            "--allow-cidr",
            &cidr,
        ],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("[step 1/1] failed"), "{err}");
    assert!(
        index.requests().is_empty(),
        "the index was reached: {:?}",
        index.requests()
    );
    let o = cordon(h, &["template", "ls"]);
    assert!(!text(&o.stdout).contains("refused"), "{}", text(&o.stdout));
}

/// A build passes the same gate as `cordon run` and a server's create: a request the gate
/// refuses (a memory limit below the least a sandbox takes, an egress entry that is no
/// host pattern) ends with the rule and the fix before any step runs, and every decision
/// is a `policy` row of the data dir's audit store.
#[test]
fn a_build_the_gate_refuses_runs_no_step_and_is_audited() {
    let test = "a_build_the_gate_refuses_runs_no_step_and_is_audited";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let marker = h.join("ran");
    let step = format!("echo x > /dev/null; touch {}", marker.display());
    for (extra, why) in [
        (["--memory", "4M"], "memory limit is below 8 MiB"),
        (["--allow-host", "no host!"], "no host!"),
    ] {
        let mut args = vec![
            "template", "build", "over", "--from", "pybase", "--run", &step,
        ];
        args.extend(extra);
        let o = cordon(h, &args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{extra:?}: {err}");
        assert!(
            err.contains("refused (request)") && err.contains(why),
            "{err}"
        );
        assert!(err.contains("cordon: fix: "), "{err}");
        assert!(!err.contains("[step 1/1]"), "a step ran: {err}");
    }
    assert!(!marker.exists());
    let o = cordon(h, &["template", "ls"]);
    assert!(!text(&o.stdout).contains("over"), "{}", text(&o.stdout));
    // Both refusals and one admitted build are `policy` rows of the data dir's store.
    let o = cordon(
        h,
        &[
            "template", "build", "fine", "--from", "pybase", "--run", "true",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = audit_rows(h, "policy");
    let out = text(&o.stdout);
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for why in ["memory limit is below 8 MiB", "no host!"] {
        let row = rows.iter().find(|r| r.contains(why));
        assert!(
            row.is_some_and(|r| r.contains("template build") && r.contains("\"deny\"")),
            "no refusal row for {why}: {rows:?}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.contains("template build") && r.contains("allow")),
        "no admitted row: {rows:?}"
    );
}

/// The issue's own example, with the index on loopback: a virtual environment made from the
/// `debian` base (`python3 -m venv`, whose ensurepip brings pip), a package pip-installed into
/// it from an index the test serves, the template's PATH naming the venv, then code importing
/// the package with the venv's interpreter on the container and gvisor tiers.
#[test]
fn a_venv_built_from_the_debian_base_installs_from_a_loopback_index() {
    let test = "a_venv_built_from_the_debian_base_installs_from_a_loopback_index";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    if !h.join("microvm/manifest.json").exists() {
        skip(
            test,
            "no microvm image (the debian base is its root): run `make setup`",
        );
        return;
    }
    let index = PyIndex::start(vec![wheel("venvpkg", "VALUE = 'in-the-venv'\n")]);
    let step = format!(
        "python3 -m venv /opt/py && /opt/py/bin/pip install --no-cache-dir \
         --disable-pip-version-check --no-input --index-url http://127.0.0.1:{}/simple/ venvpkg",
        index.port
    );
    let cidr = format!("127.0.0.1/32:{}", index.port);
    let o = cordon(
        h,
        &[
            "template",
            "build",
            "data-py",
            "--from",
            "debian-base",
            "--run",
            &step,
            "--allow-cidr",
            &cidr,
            "--env",
            "PATH=/opt/py/bin:/usr/bin:/bin",
        ],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}\n{}", text(&o.stdout));
    for tier in ["container", "gvisor"] {
        let o = run_python(
            h,
            tier,
            "data-py",
            "import sys, venvpkg; print(sys.prefix, venvpkg.VALUE)",
        );
        assert_eq!(
            text(&o.stdout),
            "/opt/py in-the-venv\n",
            "{tier}: {}",
            text(&o.stderr)
        );
    }
}

/// A step's writes to the build's root are bounded by `--disk`: the step that writes past
/// it fails with ENOSPC inside, the error names the limit, nothing is sealed, and nothing
/// of the build (its image, its mount) is left on the host.
#[test]
fn a_build_step_cannot_write_past_the_build_disk_limit() {
    let test = "a_build_step_cannot_write_past_the_build_disk_limit";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    // 400 MiB of disk (the base takes part of it); the step tries to write 1 GiB into the
    // root (not /work or /tmp).
    let o = cordon(
        h,
        &[
            "template",
            "build",
            "flood",
            "--from",
            "pybase",
            "--disk",
            "400M",
            "--run",
            "mkdir -p /opt/flood && dd if=/dev/zero of=/opt/flood/big bs=1M count=1024",
        ],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("disk limit is 400.0M") && err.contains("--disk"),
        "{err}"
    );
    let o = cordon(h, &["template", "ls"]);
    assert!(!text(&o.stdout).contains("flood"), "{}", text(&o.stdout));
    // The build's image and mount are gone: nothing left staged, nothing mounted.
    let staging = h.join("templates/staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in staging: {left:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(staging.to_str().unwrap()),
        "a build mount is left"
    );
    // A base that does not fit is refused before any step runs.
    let o = cordon(
        h,
        &[
            "template", "build", "tiny", "--from", "pybase", "--disk", "8M", "--run", "true",
        ],
    );
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("does not fit in the build's disk limit"),
        "{err}"
    );
}

/// The microvm tier on an imported template: the guest boots the template's own disk (the
/// agent is Cordon's, from the initramfs), a program of the template runs, its writes stay
/// in the sandbox, and code in a language the template lacks is refused with the reason.
#[test]
fn an_imported_template_runs_on_the_microvm_tier_and_is_never_written() {
    let test = "an_imported_template_runs_on_the_microvm_tier_and_is_never_written";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    if !h.join("microvm").exists() {
        skip(test, "no microvm guest image (cordon image build)");
        return;
    }
    let before = listing(&root_of(h, "pybase"));
    let o = cordon(
        h,
        &[
            "run",
            "--tier",
            "microvm",
            "--template",
            "pybase",
            "--lang",
            "python",
            "-c",
            "import sys, os\n\
             open('/work/w', 'w').write('x')\n\
             try:\n    open('/usr/bin/planted', 'w').write('x'); print('wrote')\n\
             except OSError as e: print('refused', e.errno)\n\
             print(sys.version_info[0], os.path.exists('/etc/debian_version'))",
        ],
    );
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Python 3 from the template, and not the guest image's Debian root.
    assert!(out.contains("refused "), "{out}");
    assert!(out.trim_end().ends_with("3 False"), "{out}");
    // A language the template has no interpreter for: refused, with the reason.
    let o = cordon(
        h,
        &[
            "run",
            "--tier",
            "microvm",
            "--template",
            "pybase",
            "--lang",
            "javascript",
            "-c",
            "1",
        ],
    );
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("has no javascript interpreter on its PATH"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(listing(&root_of(h, "pybase")), before);
    // The disk is kept by digest in the store, and goes with the template. It and its
    // directory are root's alone (issue 35 item 7): QEMU reads it through a descriptor.
    let disks = h.join("templates/disks");
    assert_eq!(std::fs::read_dir(&disks).unwrap().count(), 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&disks), 0o700, "the disks dir is listable");
    for d in std::fs::read_dir(&disks).unwrap().flatten() {
        assert_eq!(
            mode(&d.path()),
            0o600,
            "{:?} is readable by others",
            d.file_name()
        );
    }
    let o = cordon(h, &["template", "rm", "pybase"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_dir(&disks).unwrap().count(), 0);
}

/// Bytes a tree takes on the host's disk: blocks allocated, each inode once.
fn stored_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            }
            if seen.insert((m.dev(), m.ino())) {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

/// The build's scratch file system mounted under `staging`, if any.
fn mounts_under(staging: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(staging.to_str().unwrap()))
        .map(String::from)
        .collect()
}

/// Loop devices whose backing file is under `staging`.
fn loops_under(staging: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if b.trim_end().starts_with(staging.to_str().unwrap()) {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// Issue 35 items 3 and 9, as an attacker's build step: an 8 MiB file with 20 more hard
/// links, and a sparse file of 1 GiB (larger than the build's 600M disk and than the
/// 257 MiB a step's file was held to) with one byte of data. The template keeps the links
/// as links and the sparse file sparse: what the build leaves on the host is the base's
/// copy and the 8 MiB once, not 21 copies in a layer and 21 more in the root.
#[test]
fn a_build_keeps_hard_links_and_sparse_files_and_writes_its_root_once() {
    let test = "a_build_keeps_hard_links_and_sparse_files_and_writes_its_root_once";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let store = h.join("templates");
    let before = stored_bytes(&store);
    let base = stored_bytes(&root_of(h, "pybase"));
    let layers_before = std::fs::read_dir(store.join("layers")).unwrap().count();
    let step = "python3 -c \"import os\n\
                os.makedirs('/opt/h')\n\
                open('/opt/h/f', 'wb').write(os.urandom(8 << 20))\n\
                [os.link('/opt/h/f', '/opt/h/l%d' % i) for i in range(20)]\n\
                f = open('/opt/sparse', 'wb'); f.truncate(1 << 30); f.seek(512 << 20)\n\
                f.write(b'x'); f.close()\"";
    let o = cordon(
        h,
        &[
            "template", "build", "linked", "--from", "pybase", "--disk", "600M", "--run", step,
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let root = root_of(h, "linked");
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::metadata(root.join("opt/h/f")).unwrap();
    assert_eq!(f.len(), 8 << 20);
    assert_eq!(f.nlink(), 21, "the links were flattened into copies");
    for i in 0..20 {
        let l = std::fs::metadata(root.join(format!("opt/h/l{i}"))).unwrap();
        assert_eq!((l.dev(), l.ino()), (f.dev(), f.ino()), "l{i}");
    }
    let sparse = std::fs::metadata(root.join("opt/sparse")).unwrap();
    assert_eq!(sparse.len(), 1 << 30);
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "the sparse file takes {} bytes",
        sparse.blocks() * 512
    );
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(root.join("opt/sparse")).unwrap(),
        &mut byte,
        512 << 20,
    )
    .unwrap();
    assert_eq!(&byte, b"x");
    // No layer blob is kept for a build (its root is the template), and the host holds
    // the base's copy and the 8 MiB once (plus directories and the manifest).
    assert_eq!(
        std::fs::read_dir(store.join("layers")).unwrap().count(),
        layers_before
    );
    let grew = stored_bytes(&store) - before;
    println!("host bytes: before {before}, after +{grew}; the base's root {base}");
    assert!(
        grew <= base + (8 << 20) + (4 << 20),
        "the build left {grew} bytes on the host for a base of {base} and 8 MiB of steps"
    );
    assert!(
        std::fs::read_dir(store.join("staging"))
            .unwrap()
            .next()
            .is_none()
    );
}

/// Issue 35 item 3: a build whose sealed root would take the template store past the
/// operator's budget (`--max-store-bytes`) ends as DiskLimit (exit 120), says which bound
/// and what to do, and leaves nothing: no name, root, layer, staging dir or mount.
#[test]
fn a_build_past_the_store_budget_ends_as_disk_limit_and_leaves_nothing() {
    let test = "a_build_past_the_store_budget_ends_as_disk_limit_and_leaves_nothing";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let store = cordon_template::Store::open(h).unwrap();
    let used = store.usage().unwrap();
    let base = store.get("pybase").unwrap().stored_bytes;
    assert!(base > 0);
    // Room for the base's copy and 4 MiB; the step writes 16 MiB.
    let budget = (used + base + (4 << 20)).to_string();
    let count = |d: &str| {
        std::fs::read_dir(h.join("templates").join(d))
            .unwrap()
            .count()
    };
    let (roots, layers) = (count("roots"), count("layers"));
    let o = cordon(
        h,
        &[
            "template",
            "build",
            "fat",
            "--from",
            "pybase",
            "--max-store-bytes",
            &budget,
            "--run",
            "python3 -c \"import os; open('/fat', 'wb').write(os.urandom(16 << 20))\"",
        ],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(120), "{err}");
    assert!(
        err.contains("DiskLimit")
            && err.contains("template store's budget")
            && err.contains("--max-store-bytes"),
        "{err}"
    );
    assert!(!err.contains(h.to_str().unwrap()), "{err}");
    let ls = text(&cordon(h, &["template", "ls"]).stdout);
    assert!(!ls.contains("fat"), "{ls}");
    assert_eq!((count("roots"), count("layers")), (roots, layers));
    assert_eq!(count("staging"), 0);
    assert!(mounts_under(&h.join("templates/staging")).is_empty());
    // The same build under the default budget is sealed.
    let o = cordon(
        h,
        &[
            "template",
            "build",
            "fat",
            "--from",
            "pybase",
            "--run",
            "python3 -c \"import os; open('/fat', 'wb').write(os.urandom(16 << 20))\"",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// Issue 35 item 5: a build killed mid-way (its step still running) leaves its scratch
/// ext4 mounted on a loop device under `templates/staging`; `cordon template gc` removes
/// it all: the mount, the loop device, the staging files.
#[test]
fn gc_frees_what_a_killed_build_left_mounted_and_staged() {
    let test = "gc_frees_what_a_killed_build_left_mounted_and_staged";
    let Some(home) = home_with_python_base(test) else {
        return;
    };
    let h = home.path();
    let staging = h.join("templates/staging");
    let mut child = Command::new(BIN)
        .args([
            "template",
            "build",
            "killed",
            "--from",
            "pybase",
            "--disk",
            "300M",
            "--run",
            "sleep 120",
        ])
        .env("CORDON_HOME", h)
        .env_remove("CORDON_POLICY")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) for the step to start: its progress line comes after the mount.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    for _ in 0..50 {
        line.clear();
        if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0
            || line.contains("[step 1/1]")
        {
            break;
        }
    }
    assert!(
        line.contains("[step 1/1]"),
        "the build did not start: {line}"
    );
    assert!(!mounts_under(&staging).is_empty(), "no scratch mount");
    child.kill().unwrap();
    child.wait().unwrap();
    // Left behind by the killed build.
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 1);
    assert!(!mounts_under(&staging).is_empty());

    let o = cordon(h, &["template", "gc"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("1 staging dirs"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
    assert!(mounts_under(&staging).is_empty());
    // The loop device clears itself once the killed sandbox's last hold on the mount is
    // gone (its processes die with the build): wait for that, bounded.
    for _ in 0..100 {
        if loops_under(&staging).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        loops_under(&staging).is_empty(),
        "{:?}",
        loops_under(&staging)
    );
    // A live build's staging dir is never swept: gc during a build leaves it alone.
    let o = cordon(
        h,
        &[
            "template", "build", "alive", "--from", "pybase", "--disk", "300M", "--run", "true",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
}
