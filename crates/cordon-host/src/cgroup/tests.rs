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
