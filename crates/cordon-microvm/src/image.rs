//! The guest image: a Debian cloud kernel, an initramfs holding the `cordon-guest` agent and
//! the kernel modules it loads, and a read-only ext4 root made by debootstrap (minbase +
//! Python 3). Every artifact is content-addressed (its name carries the SHA-256 of its
//! bytes) under `<data dir>/microvm/`, recorded in `manifest.json` with the inputs it was
//! made from, so a build whose inputs did not change does nothing.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::MicrovmError;

/// The Debian suite of the guest root and kernel.
pub const SUITE: &str = "bookworm";
/// The kernel metapackage; its dependency names the real kernel package.
pub const KERNEL_META: &str = "linux-image-cloud-amd64";
/// Packages on top of debootstrap's minbase: Python 3 with `venv` (its ensurepip brings pip),
/// so a template built `--from debian` can make a virtual environment and pip-install into it.
pub const EXTRA_PACKAGES: &[&str] = &["python3", "python3-venv"];
/// Modules the guest loads from its initramfs, dependencies first.
pub const MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko",
];
/// Bumped whenever the way the root or initramfs is made changes.
const RECIPE: &str = "cordon microvm image recipe 1";

/// What `manifest.json` records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub kernel: String,
    pub initrd: String,
    pub rootfs: String,
    pub kernel_version: String,
    pub kernel_package: String,
    /// Input hash each artifact was made from.
    pub inputs: BTreeMap<String, String>,
    /// Seconds each part took when it was last built.
    #[serde(default)]
    pub build_seconds: BTreeMap<String, f64>,
}

/// The image files of a built manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
    pub kernel_version: String,
    /// A short id of the three artifacts together (snapshots are keyed by it).
    pub id: String,
    /// What a restored VM's QEMU gets as its kernel: the kernel's boot header only
    /// ([`restore_kernel`]); `None` where none could be made (then the whole kernel).
    pub restore_kernel: Option<PathBuf>,
}

/// The microvm directory under Cordon's data directory.
pub fn image_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("microvm")
}

/// Cordon's data directory: `$CORDON_HOME`, else `/var/lib/cordon` for root, else
/// `$XDG_DATA_HOME/cordon` (as scripts/lib.sh decides).
pub fn default_data_dir() -> PathBuf {
    cordon_core::default_data_dir()
}

fn read_manifest(dir: &Path) -> Option<Manifest> {
    let text = fs::read_to_string(dir.join("manifest.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Loads the built image, checking that its files are there.
pub fn load(data_dir: &Path) -> Result<Image, MicrovmError> {
    let dir = image_dir(data_dir);
    let m = read_manifest(&dir).ok_or_else(|| {
        MicrovmError::Image(format!(
            "no guest image in {}; run `cordon setup microvm` to build it",
            dir.display()
        ))
    })?;
    let img = Image {
        kernel: dir.join(&m.kernel),
        initrd: dir.join(&m.initrd),
        rootfs: dir.join(&m.rootfs),
        kernel_version: m.kernel_version.clone(),
        id: short_hash(format!("{} {} {}", m.kernel, m.initrd, m.rootfs).as_bytes()),
        restore_kernel: restore_kernel(&dir.join(&m.kernel)),
    };
    for p in [&img.kernel, &img.initrd, &img.rootfs] {
        if !p.is_file() {
            return Err(MicrovmError::Image(format!(
                "{} is missing; rebuild with `cordon image build`",
                p.display()
            )));
        }
    }
    Ok(img)
}

/// Ending of a kernel's restore header, the file beside it.
const RESTORE_SUFFIX: &str = ".restore-header";
/// What of the kernel after its real-mode setup sectors the restore header keeps.
const RESTORE_TAIL: usize = 4096;

/// The file a restored VM's QEMU is given as `-kernel`: the kernel's first bytes (its boot
/// header, the real-mode setup sectors and one page after them), made beside the kernel on
/// first use. A restored VM never boots a kernel: its memory already holds the running one.
/// But QEMU's x86 `-kernel` loader reads the whole file into memory it allocates and keeps
/// for the VM's life (for the firmware to copy at a boot that never comes): 13.5 MiB of
/// every VM's own memory for Debian's cloud kernel. The header keeps the loader's checks
/// and the device model (option ROMs, firmware configuration entries) the same as the
/// template's, so the snapshot's device state loads unchanged. `None` for a kernel that is
/// not a bzImage or when the file cannot be written (a restore then gets the whole kernel).
pub fn restore_kernel(kernel: &Path) -> Option<PathBuf> {
    let mut name = kernel.file_name()?.to_os_string();
    name.push(RESTORE_SUFFIX);
    let stub = kernel.with_file_name(name);
    if stub.is_file() {
        return Some(stub);
    }
    match write_restore_kernel(kernel, &stub) {
        Ok(true) => Some(stub),
        Ok(false) => None,
        Err(e) => {
            tracing::debug!(kernel = %kernel.display(), error = %e, "no restore header for the kernel: restores get the whole kernel");
            None
        }
    }
}

/// How many of a kernel's first bytes its restore header keeps; `None` unless `head` (the
/// file's start, at least 1 KiB of it) is a Linux x86 boot image ("HdrS" at 0x202).
fn restore_header_len(head: &[u8], file_len: usize) -> Option<usize> {
    if head.len() < 0x206 || &head[0x202..0x206] != b"HdrS" {
        return None;
    }
    // setup_sects at 0x1f1; 0 means 4 (boot protocol). The boot sector comes before them.
    let sects = match head[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let len = (sects + 1) * 512 + RESTORE_TAIL;
    (len < file_len).then_some(len)
}

/// Writes `stub` (0444, atomically) from `kernel`; `Ok(false)` when `kernel` is no bzImage.
fn write_restore_kernel(kernel: &Path, stub: &Path) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::File::open(kernel)?;
    let file_len = usize::try_from(f.metadata()?.len()).unwrap_or(usize::MAX);
    let mut head = vec![0u8; 1024];
    f.read_exact(&mut head)?;
    let Some(len) = restore_header_len(&head, file_len) else {
        return Ok(false);
    };
    let mut data = head;
    data.resize(len, 0);
    f.read_exact(&mut data[1024..])?;
    let tmp = stub.with_extension(format!("tmp-{}", std::process::id()));
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&tmp)?;
    let written = out.write_all(&data).and_then(|()| out.sync_all());
    drop(out);
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, stub)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(true)
}

fn short_hash(data: &[u8]) -> String {
    hex::encode(&Sha256::digest(data)[..8])
}

fn file_sha(path: &Path) -> io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Options of `cordon image build`.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub data_dir: PathBuf,
    /// The static `cordon-guest` binary (x86_64-unknown-linux-musl).
    pub agent: PathBuf,
    /// Debian mirror for debootstrap; default: the one apt already uses.
    pub mirror: Option<String>,
    /// Rebuild even when the inputs did not change.
    pub force: bool,
}

/// What the build reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A new step starts: its 1-based number, the step count and what it does.
    Step(usize, usize, String),
    /// A line of detail within the step.
    Detail(String),
    /// A step found its artifact up to date.
    Cached(String),
}

/// The outcome of a build.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub image: Image,
    pub manifest: Manifest,
    /// Which parts were (re)built; empty when everything was up to date.
    pub built: Vec<String>,
    pub seconds: f64,
    pub sizes: BTreeMap<String, u64>,
}

fn run(cmd: &mut Command, what: &str) -> Result<String, MicrovmError> {
    let out = cmd.output().map_err(|e| {
        MicrovmError::Image(format!("{what}: cannot run {:?}: {e}", cmd.get_program()))
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        return Err(MicrovmError::Image(format!(
            "{what} failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first non-security Debian mirror URI in the apt sources.
pub fn apt_mirror() -> Option<String> {
    if let Ok(s) = fs::read_to_string("/etc/apt/sources.list.d/debian.sources") {
        for line in s.lines() {
            if let Some(rest) = line.strip_prefix("URIs:")
                && let Some(u) = rest.split_whitespace().find(|u| !u.contains("security"))
            {
                return Some(u.to_string());
            }
        }
    }
    let s = fs::read_to_string("/etc/apt/sources.list").ok()?;
    s.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == "deb" && f[2] == SUITE).then(|| f[1].to_string())
    })
}

/// Builds what is missing or stale. Idempotent.
pub fn build(
    opts: &BuildOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<BuildReport, MicrovmError> {
    let t0 = Instant::now();
    let dir = image_dir(&opts.data_dir);
    fs::create_dir_all(&dir).map_err(|e| MicrovmError::io("creating the image directory", e))?;
    let _ = fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    let old = read_manifest(&dir).unwrap_or_default();
    let mut m = old.clone();
    let mut built = Vec::new();
    let work = tempdir_in(&dir)?;

    let mut b = ImageBuild {
        opts,
        dir: &dir,
        work: &work,
        m: &mut m,
        built: &mut built,
    };
    kernel_step(&mut b, progress)?;
    root_step(&mut b, progress)?;
    initrd_step(&mut b, progress)?;
    let _ = fs::remove_dir_all(&work);

    if m != old {
        let text = serde_json::to_string_pretty(&m)
            .map_err(|e| MicrovmError::Image(format!("encoding the manifest: {e}")))?;
        let tmp = dir.join("manifest.json.tmp");
        fs::write(&tmp, text).map_err(|e| MicrovmError::io("writing the manifest", e))?;
        fs::rename(&tmp, dir.join("manifest.json"))
            .map_err(|e| MicrovmError::io("writing the manifest", e))?;
    }
    prune(&dir, &m);
    let image = load(&opts.data_dir)?;
    let mut sizes = BTreeMap::new();
    for (k, p) in [
        ("kernel", &image.kernel),
        ("initrd", &image.initrd),
        ("rootfs", &image.rootfs),
    ] {
        sizes.insert(
            k.to_string(),
            fs::metadata(p).map(|md| md.len()).unwrap_or(0),
        );
    }
    Ok(BuildReport {
        image,
        manifest: m,
        built,
        seconds: t0.elapsed().as_secs_f64(),
        sizes,
    })
}

/// How many steps a build has (each says which it is).
const STEPS: usize = 3;

/// Where a build's steps report their progress.
type Report<'a> = &'a mut dyn FnMut(Progress);

/// A part `name` (a file name of the manifest) is in the image directory `dir`.
fn exists_in(dir: &Path, name: &str) -> bool {
    !name.is_empty() && dir.join(name).is_file()
}

/// What each step of a build reads and adds to: the options, the image directory and the
/// build's scratch dir, the manifest being made and the names of the parts built.
struct ImageBuild<'a> {
    opts: &'a BuildOptions,
    dir: &'a Path,
    work: &'a Path,
    m: &'a mut Manifest,
    built: &'a mut Vec<String>,
}

/// Step 1, the kernel: the cloud kernel package apt would install now, and the modules the
/// agent loads (kept while the package's version and digest are the same).
fn kernel_step(b: &mut ImageBuild<'_>, progress: Report<'_>) -> Result<(), MicrovmError> {
    progress(Progress::Step(
        1,
        STEPS,
        "guest kernel (Debian cloud kernel package)".into(),
    ));
    let (opts, dir, work) = (b.opts, b.dir, b.work);
    let (m, built) = (&mut *b.m, &mut *b.built);
    let exists = |name: &str| exists_in(dir, name);
    let deps = run(
        Command::new("apt-cache").args(["depends", KERNEL_META]),
        "resolving the kernel package",
    )?;
    let pkg = deps
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| {
            MicrovmError::Image(format!(
                "apt knows no kernel behind {KERNEL_META}; run `apt-get update`"
            ))
        })?;
    let show = run(
        Command::new("apt-cache").args(["show", "--no-all-versions", &pkg]),
        "reading the kernel package",
    )?;
    let field = |k: &str| {
        show.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    let kernel_inputs =
        short_hash(format!("{RECIPE} {pkg} {} {}", field("Version:"), field("SHA256:")).as_bytes());
    let kernel_dir = work.join("kernel");
    let kernel_fresh = !opts.force
        && m.inputs.get("kernel") == Some(&kernel_inputs)
        && exists(&m.kernel)
        && dir.join(format!("modules-{kernel_inputs}")).is_dir();
    if kernel_fresh {
        progress(Progress::Cached(format!("{pkg}: {}", m.kernel)));
    } else {
        let ts = Instant::now();
        progress(Progress::Detail(format!(
            "downloading {pkg} {}",
            field("Version:")
        )));
        fs::create_dir_all(&kernel_dir).map_err(|e| MicrovmError::io("kernel work dir", e))?;
        run(
            Command::new("apt-get")
                .args(["download", "-q", &pkg])
                .current_dir(&kernel_dir),
            "downloading the kernel package",
        )?;
        let deb = fs::read_dir(&kernel_dir)
            .map_err(|e| MicrovmError::io("kernel work dir", e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| MicrovmError::Image("apt-get download left no .deb".into()))?;
        progress(Progress::Detail("unpacking the kernel".into()));
        let x = kernel_dir.join("x");
        run(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x),
            "unpacking the kernel package",
        )?;
        let version = pkg.trim_start_matches("linux-image-").to_string();
        let vmlinuz = x.join("boot").join(format!("vmlinuz-{version}"));
        let sha = file_sha(&vmlinuz).map_err(|e| MicrovmError::io("reading vmlinuz", e))?;
        let name = format!("vmlinuz-{}", &sha[..16]);
        install(&vmlinuz, &dir.join(&name))?;
        let mods = dir.join(format!("modules-{kernel_inputs}"));
        let _ = fs::remove_dir_all(&mods);
        fs::create_dir_all(&mods).map_err(|e| MicrovmError::io("modules dir", e))?;
        let kdir = x.join("lib/modules").join(&version).join("kernel");
        for m in MODULES {
            let src = kdir.join(m);
            let file = Path::new(m).file_name().unwrap_or_default();
            fs::copy(&src, mods.join(file))
                .map_err(|e| MicrovmError::io(format!("copying module {}", src.display()), e))?;
        }
        m.kernel = name;
        m.kernel_version = version;
        m.kernel_package = format!("{pkg} {}", field("Version:"));
        m.inputs.insert("kernel".into(), kernel_inputs.clone());
        m.build_seconds
            .insert("kernel".into(), ts.elapsed().as_secs_f64());
        built.push("kernel".to_string());
    }

    Ok(())
}

/// Step 2, the root: debootstrap minbase and Python 3, packed into a read-only ext4 (kept
/// while the suite, mirror and packages are the same).
fn root_step(b: &mut ImageBuild<'_>, progress: Report<'_>) -> Result<(), MicrovmError> {
    progress(Progress::Step(
        2,
        STEPS,
        "guest root (debootstrap minbase + python3 and venv, ext4)".into(),
    ));
    let (opts, dir, work) = (b.opts, b.dir, b.work);
    let (m, built) = (&mut *b.m, &mut *b.built);
    let exists = |name: &str| exists_in(dir, name);
    let mirror = opts.mirror.clone().or_else(apt_mirror).ok_or_else(|| {
        MicrovmError::Image("no Debian mirror found in the apt sources; pass --mirror".into())
    })?;
    let root_inputs = short_hash(
        format!(
            "{RECIPE} {SUITE} {mirror} minbase {}",
            EXTRA_PACKAGES.join(",")
        )
        .as_bytes(),
    );
    if !opts.force && m.inputs.get("rootfs") == Some(&root_inputs) && exists(&m.rootfs) {
        progress(Progress::Cached(m.rootfs.clone()));
    } else {
        let ts = Instant::now();
        let root = work.join("root");
        progress(Progress::Detail(format!(
            "debootstrap --variant=minbase --include={} {SUITE} from {mirror}",
            EXTRA_PACKAGES.join(",")
        )));
        run(
            Command::new("debootstrap")
                .arg("--variant=minbase")
                .arg(format!("--include={}", EXTRA_PACKAGES.join(",")))
                .arg(SUITE)
                .arg(&root)
                .arg(&mirror),
            "debootstrap",
        )?;
        progress(Progress::Detail("trimming and packing the root".into()));
        finish_root(&root)?;
        let raw = work.join("rootfs.ext4");
        make_ext4(&root, &raw)?;
        let sha = file_sha(&raw).map_err(|e| MicrovmError::io("hashing the root", e))?;
        let name = format!("rootfs-{}.ext4", &sha[..16]);
        install(&raw, &dir.join(&name))?;
        m.rootfs = name;
        m.inputs.insert("rootfs".into(), root_inputs);
        m.build_seconds
            .insert("rootfs".into(), ts.elapsed().as_secs_f64());
        built.push("rootfs".to_string());
    }

    Ok(())
}

/// Step 3, the initramfs: the agent as /init and the modules it loads.
fn initrd_step(b: &mut ImageBuild<'_>, progress: Report<'_>) -> Result<(), MicrovmError> {
    progress(Progress::Step(
        3,
        STEPS,
        "initramfs (cordon-guest agent + virtio modules)".into(),
    ));
    let (opts, dir, work) = (b.opts, b.dir, b.work);
    let (m, built) = (&mut *b.m, &mut *b.built);
    let exists = |name: &str| exists_in(dir, name);
    let agent = fs::read(&opts.agent).map_err(|e| {
        MicrovmError::Image(format!(
            "reading the guest agent {}: {e}; build it with `cargo build --release -p cordon-guest --bin cordon-guest --target x86_64-unknown-linux-musl`",
            opts.agent.display()
        ))
    })?;
    let mods_dir = dir.join(format!(
        "modules-{}",
        m.inputs.get("kernel").cloned().unwrap_or_default()
    ));
    let mut entries: Vec<(String, Vec<u8>, u32)> = vec![("init".into(), agent, 0o100755)];
    let mut order = String::new();
    for md in MODULES {
        let file = Path::new(md)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_string();
        let data = fs::read(mods_dir.join(&file))
            .map_err(|e| MicrovmError::io(format!("reading module {file}"), e))?;
        entries.push((format!("modules/{file}"), data, 0o100644));
        order.push_str(&file);
        order.push('\n');
    }
    entries.push(("modules/order".into(), order.into_bytes(), 0o100644));
    let cpio = newc_archive(&entries);
    let sha = hex::encode(Sha256::digest(&cpio));
    let name = format!("initrd-{}.cpio", &sha[..16]);
    if m.initrd == name && exists(&name) && !opts.force {
        progress(Progress::Cached(name.clone()));
    } else {
        let tmp = work.join("initrd.cpio");
        fs::write(&tmp, &cpio).map_err(|e| MicrovmError::io("writing the initramfs", e))?;
        install(&tmp, &dir.join(&name))?;
        m.initrd = name;
        m.inputs.insert("initrd".into(), sha[..16].to_string());
        built.push("initrd".to_string());
    }
    Ok(())
}

/// Packs the tree `root` into the read-only ext4 image `out` (ownership and modes as they
/// are in the tree), sized to what it holds plus room for ext4's metadata.
pub fn make_ext4(root: &Path, out: &Path) -> Result<(), MicrovmError> {
    let bytes = dir_size(root);
    // Room for ext4's metadata; the filesystem is mounted read-only.
    let size_mb = (bytes * 5 / 4) / (1 << 20) + 64;
    run(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-L",
                "cordon-root",
                "-b",
                "4096",
                "-O",
                "^has_journal",
                "-m",
                "0",
                "-d",
            ])
            .arg(root)
            .arg(out)
            .arg(format!("{size_mb}M")),
        "mkfs.ext4",
    )?;
    Ok(())
}

/// The mount points the guest agent needs in a root that a template may lack (made in
/// the disk image, never in the template).
const GUEST_MOUNT_POINTS: &[&str] = &["dev", "proc", "sys", "work", "tmp", "run"];

/// The disk image of a template's root for the guest, at `disk` (made if missing, from
/// `root`; an image is made once per template digest). The agent is not in it: it is the
/// initramfs's, added by Cordon at boot. The disks and their directory are root's alone
/// (0600, 0700), like the rest of the data dir: QEMU reads a disk through a descriptor
/// Cordon opens, never by its path.
pub fn template_disk(root: &Path, disk: &Path) -> Result<(), MicrovmError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = disk
        .parent()
        .ok_or_else(|| MicrovmError::Image("a template disk needs a directory".into()))?;
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(MicrovmError::io("creating the template disks dir", e)),
    }
    // A store made before they were private is made so here.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| MicrovmError::io("making the template disks dir private", e))?;
    if disk.is_file() {
        return fs::set_permissions(disk, fs::Permissions::from_mode(0o600))
            .map_err(|e| MicrovmError::io("making a template disk private", e));
    }
    let tmp = tempdir_in(dir)?;
    let raw = tmp.join("root.ext4");
    let made = make_ext4(root, &raw).and_then(|()| {
        let missing: Vec<&str> = GUEST_MOUNT_POINTS
            .iter()
            .copied()
            .filter(|m| fs::symlink_metadata(root.join(m)).is_err())
            .collect();
        if !missing.is_empty() {
            let cmds: String = missing.iter().map(|m| format!("mkdir /{m}\n")).collect();
            let script = tmp.join("debugfs.cmds");
            fs::write(&script, cmds)
                .map_err(|e| MicrovmError::io("writing debugfs commands", e))?;
            run(
                Command::new("debugfs")
                    .arg("-w")
                    .arg("-f")
                    .arg(&script)
                    .arg(&raw),
                "debugfs (making the guest's mount points)",
            )?;
        }
        let _ = fs::set_permissions(&raw, fs::Permissions::from_mode(0o600));
        fs::rename(&raw, disk).map_err(|e| MicrovmError::io("installing a template disk", e))
    });
    let _ = fs::remove_dir_all(&tmp);
    made
}

/// Removes artifacts the manifest no longer names (old kernels, roots, initramfs, modules).
fn prune(dir: &Path, m: &Manifest) {
    let keep_mods = format!(
        "modules-{}",
        m.inputs.get("kernel").cloned().unwrap_or_default()
    );
    let header = format!("{}{RESTORE_SUFFIX}", m.kernel);
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let artifact = ["vmlinuz-", "rootfs-", "initrd-", "modules-", ".work-"]
            .iter()
            .any(|p| name.starts_with(p));
        if !artifact || [&m.kernel, &m.initrd, &m.rootfs, &keep_mods, &header].contains(&&name) {
            continue;
        }
        let p = e.path();
        let _ = if p.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
    }
}

fn tempdir_in(dir: &Path) -> Result<PathBuf, MicrovmError> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).map_err(|e| MicrovmError::Image(format!("no randomness: {e}")))?;
    let p = dir.join(format!(".work-{}", hex::encode(b)));
    fs::create_dir_all(&p).map_err(|e| MicrovmError::io("creating a work directory", e))?;
    Ok(p)
}

/// Copies `src` into place atomically, readable by everyone (QEMU runs unprivileged).
fn install(src: &Path, dst: &Path) -> Result<(), MicrovmError> {
    let tmp = dst.with_extension("tmp");
    fs::copy(src, &tmp)
        .map_err(|e| MicrovmError::io(format!("installing {}", dst.display()), e))?;
    let _ = fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644));
    fs::rename(&tmp, dst).map_err(|e| MicrovmError::io(format!("installing {}", dst.display()), e))
}

/// Prepares the debootstrapped tree: the sandbox user, mount points, no caches.
fn finish_root(root: &Path) -> Result<(), MicrovmError> {
    let append = |file: &str, line: &str| -> Result<(), MicrovmError> {
        let p = root.join(file);
        let text = fs::read_to_string(&p).unwrap_or_default();
        if !text
            .lines()
            .any(|l| l.starts_with(line.split(':').next().unwrap_or(line)))
        {
            let mut f = fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&p)
                .map_err(|e| MicrovmError::io(format!("editing {file}"), e))?;
            writeln!(f, "{line}").map_err(|e| MicrovmError::io(format!("editing {file}"), e))?;
        }
        Ok(())
    };
    append("etc/passwd", "sandbox:x:1000:1000:sandbox:/work:/bin/bash")?;
    append("etc/group", "sandbox:x:1000:")?;
    fs::write(root.join("etc/hostname"), "sandbox\n")
        .map_err(|e| MicrovmError::io("hostname", e))?;
    fs::write(root.join("etc/hosts"), "127.0.0.1 localhost sandbox\n")
        .map_err(|e| MicrovmError::io("hosts", e))?;
    // No resolver: the guest has no network unless egress is granted.
    let _ = fs::remove_file(root.join("etc/resolv.conf"));
    for d in ["work", "newroot", "sys/fs/cgroup", "dev/shm", "run"] {
        fs::create_dir_all(root.join(d)).map_err(|e| MicrovmError::io(format!("mkdir {d}"), e))?;
    }
    for d in [
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
    ] {
        let p = root.join(d);
        if let Ok(rd) = fs::read_dir(&p) {
            for e in rd.flatten() {
                let q = e.path();
                let _ = if q.is_dir() {
                    fs::remove_dir_all(&q)
                } else {
                    fs::remove_file(&q)
                };
            }
        }
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            }
            total += md.len().div_ceil(4096) * 4096;
        }
    }
    total
}

/// A cpio "newc" archive of regular files (directories are created for their parents).
pub fn newc_archive(files: &[(String, Vec<u8>, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ino = 1u32;
    let mut dirs: Vec<String> = Vec::new();
    let entry = |out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8], ino: &mut u32| {
        let namesz = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            *ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            namesz,
            0
        );
        *ino += 1;
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    };
    for (name, data, mode) in files {
        let mut parent = String::new();
        for part in name
            .split('/')
            .collect::<Vec<_>>()
            .iter()
            .rev()
            .skip(1)
            .rev()
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            if !dirs.contains(&parent) {
                dirs.push(parent.clone());
                entry(&mut out, &parent, 0o040755, b"", &mut ino);
            }
        }
        entry(&mut out, name, *mode, data, &mut ino);
    }
    entry(&mut out, "TRAILER!!!", 0, b"", &mut ino);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file shaped like a bzImage: "HdrS" at 0x202, `sects` setup sectors, `len` bytes.
    fn bzimage(sects: u8, len: usize) -> Vec<u8> {
        let mut k: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        k[0x1f1] = sects;
        k[0x202..0x206].copy_from_slice(b"HdrS");
        k
    }

    #[test]
    fn a_restore_header_is_the_boot_sector_setup_sectors_and_a_page() {
        let k = bzimage(27, 1 << 20);
        assert_eq!(restore_header_len(&k, k.len()), Some(28 * 512 + 4096));
        // setup_sects 0 means 4.
        let k = bzimage(0, 1 << 20);
        assert_eq!(restore_header_len(&k, k.len()), Some(5 * 512 + 4096));
        // Not a boot image (an ELF vmlinux), or too short to be worth a header: none.
        let mut elf = bzimage(27, 1 << 20);
        elf[0x202..0x206].copy_from_slice(b"\x7fELF");
        assert_eq!(restore_header_len(&elf, elf.len()), None);
        let small = bzimage(27, 8 << 10);
        assert_eq!(restore_header_len(&small, small.len()), None);
    }

    #[test]
    fn the_restore_header_is_made_once_beside_the_kernel_read_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let kernel = d.path().join("vmlinuz-abc");
        let k = bzimage(27, 3 << 20);
        fs::write(&kernel, &k).unwrap();
        let stub = restore_kernel(&kernel).expect("a header for a bzImage");
        assert_eq!(stub, d.path().join("vmlinuz-abc.restore-header"));
        let got = fs::read(&stub).unwrap();
        assert_eq!(got.len(), 28 * 512 + 4096);
        assert_eq!(
            &got[..],
            &k[..got.len()],
            "the kernel's first bytes, unchanged"
        );
        let mode = fs::metadata(&stub).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        // Kept by the prune of old artifacts; a second call finds it.
        let m = Manifest {
            kernel: "vmlinuz-abc".into(),
            ..Manifest::default()
        };
        prune(d.path(), &m);
        assert_eq!(restore_kernel(&kernel), Some(stub.clone()));
        let left: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");

        let elf = d.path().join("vmlinuz-elf");
        fs::write(
            &elf,
            b"\x7fELF not a boot image, long enough to read a kilobyte of it".repeat(40),
        )
        .unwrap();
        assert_eq!(restore_kernel(&elf), None);
    }

    #[test]
    fn cpio_layout() {
        let a = newc_archive(&[("modules/x.ko".into(), b"abc".to_vec(), 0o100644)]);
        let text = String::from_utf8_lossy(&a);
        assert!(text.starts_with("070701"));
        assert!(text.contains("modules\0"));
        assert!(text.contains("modules/x.ko\0"));
        assert!(text.contains("TRAILER!!!"));
        assert_eq!(a.len() % 4, 0);
    }
}
