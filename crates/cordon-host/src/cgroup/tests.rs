//! Tests of [`super`]: kept beside it, not inside it, so the module stays readable.

use super::*;

#[test]
fn parses_keyed_files() {
    let dir = std::env::temp_dir().join(format!("cordon-cg-test-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let f = dir.join("memory.oom_control");
    fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
    assert_eq!(keyed(&f, "oom_kill"), 3);
    assert_eq!(keyed(&f, "missing"), 0);
    fs::write(&f, "12345\n").unwrap();
    assert_eq!(number(&f), 12345);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hybrid_mounts_list_every_v1_hierarchy() {
    let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
        cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
        cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
        cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n\
        cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
    let v1 = v1_mounts(mounts);
    let dirs: Vec<&Path> = v1.iter().map(|(d, _)| d.as_path()).collect();
    assert_eq!(
        dirs,
        [
            "/sys/fs/cgroup/cpu",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/systemd"
        ]
        .map(Path::new)
    );
    assert!(v1[1].1.iter().any(|c| c == "memory"));
}

#[test]
fn the_version_is_the_roots_filesystem() {
    let hybrid = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n\
        cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
    assert_eq!(version_in(hybrid), Version::V1);
    let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
    assert_eq!(version_in(unified), Version::V2);
    assert_eq!(version_in(""), Version::V1);
    let v1 = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n\
        cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n";
    assert_eq!(
        V1.root(v1, "cpu").as_deref(),
        Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
    );
    assert_eq!(
        V1.root(v1, "pids").as_deref(),
        Some(Path::new("/sys/fs/cgroup/pids"))
    );
    assert_eq!(V1.root(v1, "memory"), None);
}

/// On this host's real cgroup filesystem: the limits are the files' contents, a process
/// joined through `procs_files` is counted, and removal leaves no directory behind.
#[test]
fn a_sandbox_cgroup_holds_its_limits_and_goes_away() {
    if !crate::testing::root_or_skip("making cgroups") {
        return;
    }
    let name = format!("unit-{}", std::process::id());
    let limits = Limits {
        memory: 48 << 20,
        pids: Some(7),
        cpus: 0.25,
    };
    let cg = SandboxCgroup::create_in("cordon-unit", &name, &limits).unwrap();
    let (memory_file, cpu) = match cg.version() {
        Version::V1 => ("memory.limit_in_bytes", {
            let quota = number(&cg.cpu_dir.join("cpu.cfs_quota_us"));
            let period = number(&cg.cpu_dir.join("cpu.cfs_period_us"));
            (quota, period)
        }),
        Version::V2 => ("memory.max", {
            let text = fs::read_to_string(cg.cpu_dir.join("cpu.max")).unwrap();
            let mut it = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
            (it.next().unwrap(), it.next().unwrap())
        }),
    };
    assert_eq!(number(&cg.memory_dir.join(memory_file)), 48 << 20);
    assert_eq!(cpu, (25_000, 100_000));
    let pids_dir = cg.pids_dir.clone().unwrap();
    assert_eq!(number(&pids_dir.join("pids.max")), 7);
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    for f in cg.procs_files() {
        fs::write(f, child.id().to_string()).unwrap();
    }
    assert_eq!(cg.pids(), vec![child.id() as i32]);
    // Pause and resume: the kernel reports the cgroup frozen, then running again; a
    // frozen cgroup is still killed and removed (the kill thaws it first).
    let freezer = cg.freezer_dir.clone().expect("this host has a freezer");
    cg.freeze(Duration::from_secs(5)).unwrap();
    assert!(cg.hier.is_frozen(&freezer));
    cg.thaw().unwrap();
    assert!(!cg.hier.is_frozen(&freezer));
    cg.freeze(Duration::from_secs(5)).unwrap();
    assert!(cg.kill_and_remove(Duration::from_secs(5)));
    let _ = child.wait();
    assert!(dirs_of("cordon-unit", &name).is_empty());
    for p in parents("cordon-unit") {
        let _ = fs::remove_dir(p);
    }
}

#[test]
fn counters_diff_and_decide_out_of_memory() {
    let v2 = "low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\noom_group_kill 0\n";
    assert_eq!(parse_keyed(v2, "max"), 17);
    assert_eq!(parse_keyed(v2, "oom_kill"), 1);
    let before = Counters {
        limit_hits: 2,
        cpu_us: Some(10),
        ..Counters::default()
    };
    let after = Counters {
        limit_hits: 5,
        cpu_us: Some(25),
        peak_memory: 9,
        ..Counters::default()
    };
    let d = after.since(&before);
    assert_eq!((d.limit_hits, d.cpu_us, d.peak_memory), (3, Some(15), 9));
    assert!(d.out_of_memory(true) && !d.out_of_memory(false));
    assert!(!Counters::default().out_of_memory(true));
    let killed = Counters {
        oom_kills: 1,
        ..Counters::default()
    };
    assert!(killed.out_of_memory(false));
}

/// The memory hierarchy's directory `<name>` for a pool test of its own (its own parent, so
/// no other process's sandboxes take its slots); `None` off v1.
fn pool_test_parent(name: &str) -> Option<PathBuf> {
    match memory_controller() {
        Some((Version::V1, root)) => {
            let p = root.join(format!("{name}-{}", std::process::id()));
            fs::create_dir_all(&p).unwrap();
            Some(p)
        }
        _ => None,
    }
}

/// Runs `argv` in the memory cgroup `dir` (joined before the exec) and waits for its end.
fn run_in(dir: &Path, argv: &[&str]) -> std::process::ExitStatus {
    let procs = dir.join("cgroup.procs");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("echo $$ > {} && exec \"$@\"", procs.display()))
        .arg("sh")
        .args(argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.status().unwrap()
}

/// A kept memory cgroup comes back as the kernel makes a new one, as far as Cordon reads
/// it: peak and limit hits at zero, no charge of the sandbox before. One that was
/// OOM-killed in, or still holds a process, is not kept; a full pool keeps no more.
#[test]
fn a_kept_memory_cgroup_comes_back_as_new_and_only_a_clean_one_is_kept() {
    if !crate::testing::root_or_skip("making cgroups") {
        return;
    }
    let Some(parent) = pool_test_parent("cordon-unit-pool") else {
        return; // v2: the pool is v1's (v2's cgroupfs cannot rename)
    };
    let a = parent.join("a");
    fs::create_dir(&a).unwrap();
    fs::write(a.join("memory.limit_in_bytes"), (64u64 << 20).to_string()).unwrap();
    // dd's 8 MiB buffer, charged to the cgroup; a file in /dev/shm would outlive it, so
    // the charge is anonymous memory, gone with the process.
    assert!(
        run_in(
            &a,
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=8M", "count=2"]
        )
        .success()
    );
    assert!(number(&a.join("memory.max_usage_in_bytes")) >= 8 << 20);
    assert!(pool::keep(&a), "a clean cgroup is kept");
    assert!(!a.exists());
    let b = parent.join("b");
    assert!(pool::claim(&parent, "b"), "the kept cgroup is claimed");
    assert!(b.is_dir());
    assert!(
        number(&b.join("memory.max_usage_in_bytes")) <= 1 << 20,
        "the last sandbox's peak is gone"
    );
    assert_eq!(number(&b.join("memory.failcnt")), 0);
    assert!(number(&b.join("memory.usage_in_bytes")) <= 1 << 20);
    assert!(!pool::claim(&parent, "c"), "the pool held one");
    // An OOM kill in it: its count cannot be reset, so it is not kept.
    fs::write(b.join("memory.limit_in_bytes"), (8u64 << 20).to_string()).unwrap();
    let _ = run_in(
        &b,
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
    );
    assert_eq!(keyed(&b.join("memory.oom_control"), "oom_kill"), 1);
    assert!(!pool::keep(&b), "an OOM-killed cgroup is not kept");
    assert!(b.is_dir());
    fs::remove_dir(&b).unwrap();
    // One charged with more than a little after its sandbox (a file it wrote stays in the
    // page cache) is not kept: the next sandbox would start with that charge.
    let d = parent.join("d");
    fs::create_dir(&d).unwrap();
    let file = std::env::temp_dir().join(format!("cordon-unit-pool-{}", std::process::id()));
    let of = format!("of={}", file.display());
    assert!(run_in(&d, &["dd", "if=/dev/zero", &of, "bs=1M", "count=4"]).success());
    assert!(
        !pool::keep(&d),
        "a cgroup charged with a file's pages is not kept"
    );
    let _ = fs::remove_file(&file);
    // Its charge moves to the parent when it goes.
    fs::remove_dir(&d).unwrap();
    // One that still holds a process is not kept.
    let c = parent.join("c");
    fs::create_dir(&c).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    fs::write(c.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    assert!(!pool::keep(&c), "a cgroup with a process is not kept");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // A full pool keeps no more; each slot is claimed once.
    let made: Vec<PathBuf> = (0..=pool::SLOTS)
        .map(|i| {
            let d = parent.join(format!("f{i}"));
            fs::create_dir(&d).unwrap();
            d
        })
        .collect();
    let kept = made.iter().filter(|d| pool::keep(d)).count();
    assert_eq!(kept, pool::SLOTS, "the pool holds {} at most", pool::SLOTS);
    let claimed: Vec<usize> = std::thread::scope(|s| {
        let racers: Vec<_> = (0..2)
            .map(|t| {
                let parent = &parent;
                s.spawn(move || {
                    (0..pool::SLOTS)
                        .filter(|i| pool::claim(parent, &format!("t{t}-{i}")))
                        .count()
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(claimed.iter().sum::<usize>(), pool::SLOTS, "{claimed:?}");
    for e in fs::read_dir(&parent).unwrap().flatten() {
        if e.path().is_dir() {
            fs::remove_dir(e.path()).unwrap();
        }
    }
    fs::remove_dir(&parent).unwrap();
}

/// Through the manager, in Cordon's own parent: a sandbox's cgroup that ends clean leaves
/// no directory of its name, and the next one (kept or new) starts with no peak.
#[test]
fn a_sandbox_cgroup_after_a_kept_one_starts_from_zero() {
    if !crate::testing::root_or_skip("making cgroups") {
        return;
    }
    let limits = Limits {
        memory: 64 << 20,
        pids: Some(16),
        cpus: 0.5,
    };
    let first = format!("unit-pool-a-{}", std::process::id());
    let cg = SandboxCgroup::create_in(PARENT, &first, &limits).unwrap();
    assert!(
        run_in(
            &cg.memory_dir,
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=8M", "count=1"]
        )
        .success()
    );
    assert!(cg.counters().peak_memory >= 8 << 20);
    assert!(cg.kill_and_remove(Duration::from_secs(5)));
    assert!(
        dirs_of(PARENT, &first).is_empty(),
        "nothing of its name is left"
    );
    // A larger limit than the first's: v1 refuses a memory limit above the memory+swap
    // one, so a kept cgroup must not carry the first sandbox's pair.
    let second = format!("unit-pool-b-{}", std::process::id());
    let limits = Limits {
        memory: 96 << 20,
        ..limits
    };
    let cg = SandboxCgroup::create_in(PARENT, &second, &limits).unwrap();
    let c = cg.counters();
    assert!(c.peak_memory <= 1 << 20, "peak {}", c.peak_memory);
    assert_eq!((c.limit_hits, c.oom_kills), (0, 0));
    if cg.version() == Version::V1 {
        assert_eq!(
            number(&cg.memory_dir.join("memory.limit_in_bytes")),
            96 << 20
        );
    }
    assert!(cg.kill_and_remove(Duration::from_secs(5)));
    assert!(dirs_of(PARENT, &second).is_empty());
}

/// A server's stocker makes every slot and makes again the one a create took, so creates
/// find a memory cgroup ready however many are only made and never end.
#[test]
fn the_stocker_fills_every_slot_and_refills_a_taken_one() {
    if !crate::testing::root_or_skip("making cgroups") {
        return;
    }
    let Some(parent) = pool_test_parent("cordon-unit-stock") else {
        return; // v2: the pool is v1's
    };
    let slots = |p: &Path| {
        fs::read_dir(p)
            .unwrap()
            .flatten()
            .filter(|e| pool::is_slot(&e.file_name().to_string_lossy()))
            .count()
    };
    let until_full = |p: &Path| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while slots(p) < pool::SLOTS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        slots(p)
    };
    pool::keep_stocked(parent.clone());
    assert_eq!(until_full(&parent), pool::SLOTS, "every slot is made");
    for i in 0..3 {
        assert!(pool::claim(&parent, &format!("taken-{i}")));
    }
    assert_eq!(
        until_full(&parent),
        pool::SLOTS,
        "the taken slots are made again"
    );
    assert!((0..3).all(|i| parent.join(format!("taken-{i}")).is_dir()));
    // With its parent gone the stocker stops (bounded: it may fill a slot meanwhile).
    for _ in 0..100 {
        for e in fs::read_dir(&parent).unwrap().flatten() {
            if e.path().is_dir() {
                let _ = fs::remove_dir(e.path());
            }
        }
        if fs::remove_dir(&parent).is_ok() {
            break;
        }
    }
    assert!(!parent.exists(), "the test's parent is removed");
}
