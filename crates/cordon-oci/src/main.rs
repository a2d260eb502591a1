//! `cordon-oci`: runc's command line over Cordon's container tier (see the library's docs and
//! docs/kubernetes.md).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use cordon_oci::bundle::ProcessSpec;
use cordon_oci::ctl::{Conn, Reply, Request};
use cordon_oci::monitor;
use cordon_oci::node::NodeConfig;
use cordon_oci::state::{Root, Status};

#[derive(Parser, Debug)]
#[command(
    name = "cordon-oci",
    version,
    about = "An OCI runtime (runc's command line) that runs each container as a Cordon sandbox"
)]
struct Cli {
    /// Where container state is kept.
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    /// Where errors are logged (besides stderr).
    #[arg(long, global = true)]
    log: Option<PathBuf>,
    /// text or json.
    #[arg(long = "log-format", global = true, default_value = "text")]
    log_format: String,
    /// Accepted for runc compatibility; Cordon manages its own cgroups.
    #[arg(long = "systemd-cgroup", global = true)]
    systemd_cgroup: bool,
    #[arg(long, global = true)]
    debug: bool,
    /// The node's Cordon config (default $CORDON_OCI_CONFIG, else /etc/cordon/oci.toml;
    /// through podman: --runtime-flag cordon-config=PATH).
    #[arg(long = "cordon-config", global = true)]
    cordon_config: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a container from a bundle (its process waits for `start`).
    Create(CreateArgs),
    /// Run the created container's process.
    Start { id: String },
    /// Create and start a container; without --detach, wait for it and exit as it did.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        #[arg(short, long)]
        detach: bool,
    },
    /// The container's state as JSON.
    State { id: String },
    /// Send a signal (a name such as TERM, USR1, SIGWINCH, or a number) to the
    /// container's process (--all: to every process of the container).
    Kill {
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
        #[arg(short, long)]
        all: bool,
    },
    /// Change a running container's memory and CPU limits (a resize in place):
    /// `--resources` names a file of OCI `linux.resources` JSON, `-` for stdin (containerd's
    /// form), within the node's ceiling.
    Update {
        id: String,
        #[arg(short, long)]
        resources: PathBuf,
    },
    /// Remove a stopped container (--force: stop it first).
    Delete {
        id: String,
        #[arg(short, long)]
        force: bool,
    },
    /// Run another process in a running container.
    Exec(ExecArgs),
    /// The container's processes (host pids).
    Ps {
        id: String,
        #[arg(short, long, default_value = "table")]
        format: String,
        /// ps options (ignored).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        ps_args: Vec<String>,
    },
    /// Containers under the root.
    List {
        #[arg(short, long, default_value = "table")]
        format: String,
        #[arg(short, long)]
        quiet: bool,
    },
    /// What this runtime supports, as JSON.
    Features,
    #[command(name = "__monitor", hide = true)]
    Monitor {
        id: String,
        #[arg(long)]
        bundle: PathBuf,
        #[arg(long)]
        ready_fd: i32,
        /// The console socket `create` connected to, by descriptor number.
        #[arg(long)]
        console_fd: Option<i32>,
    },
    #[command(name = "__exec", hide = true)]
    ExecMonitor {
        id: String,
        /// A pipe the process (JSON) is read from, by descriptor number: never on the
        /// command line, which every local user can read.
        #[arg(long)]
        process_fd: i32,
        #[arg(long)]
        ready_fd: i32,
        #[arg(long)]
        console_socket: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct CreateArgs {
    id: String,
    #[arg(short, long, default_value = ".")]
    bundle: PathBuf,
    #[arg(long)]
    pid_file: Option<PathBuf>,
    #[arg(long)]
    console_socket: Option<PathBuf>,
    #[arg(long)]
    no_pivot: bool,
    #[arg(long)]
    no_new_keyring: bool,
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
}

#[derive(clap::Args, Debug)]
struct ExecArgs {
    id: String,
    /// The process (an OCI process JSON file).
    #[arg(short, long)]
    process: Option<PathBuf>,
    #[arg(short, long)]
    detach: bool,
    #[arg(long)]
    pid_file: Option<PathBuf>,
    #[arg(short, long)]
    tty: bool,
    #[arg(long)]
    console_socket: Option<PathBuf>,
    #[arg(long)]
    cwd: Option<String>,
    #[arg(short, long)]
    env: Vec<String>,
    #[arg(short, long)]
    user: Option<String>,
    #[arg(long)]
    no_new_privs: bool,
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Prints a line on stdout. A stdout its reader closed (`cordon-oci state ID | head -c1`)
/// ends the command quietly ([`ClosedStdout`]); it never panics.
macro_rules! say {
    ($($arg:tt)*) => {
        say_line(&format!($($arg)*))?
    };
}

/// Stdout was closed by its reader: the command ends with 141 (as a shell reports a program
/// ended by SIGPIPE), saying nothing.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
struct ClosedStdout;

fn say_line(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ClosedStdout.into()),
        Err(e) => Err(anyhow!("writing to stdout: {e}")),
    }
}

fn main() {
    let cli = Cli::parse();
    let log = Log {
        path: cli.log.clone(),
        json: cli.log_format == "json",
    };
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(e) if e.is::<ClosedStdout>() => 128 + libc::SIGPIPE,
        Err(e) => {
            let msg = format!("{e:#}");
            log.error(&msg);
            let _ = writeln!(std::io::stderr(), "cordon-oci: {msg}");
            1
        }
    };
    std::process::exit(code);
}

/// Errors go to `--log` too: containerd's shim reads the reason of a failed create there.
struct Log {
    path: Option<PathBuf>,
    json: bool,
}

impl Log {
    fn error(&self, msg: &str) {
        let Some(p) = &self.path else { return };
        let line = if self.json {
            #[derive(serde::Serialize)]
            struct Line<'a> {
                level: &'a str,
                msg: &'a str,
                time: String,
            }
            serde_json::to_string(&Line {
                level: "error",
                msg,
                time: cordon_oci::state::now_rfc3339(),
            })
            .unwrap_or_default()
        } else {
            format!("error: {msg}")
        };
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn dispatch(cli: Cli) -> Result<i32> {
    close_callers_fds(&cli.command).context("closing the caller's descriptors")?;
    let root = Root::new(cli.root.as_deref());
    let cfg = cli.cordon_config.as_deref();
    match cli.command {
        Cmd::Create(a) => {
            create(&root, cfg, &a)?;
            Ok(0)
        }
        Cmd::Run { create: a, detach } => {
            let child = create(&root, cfg, &a)?;
            start(&root, &a.id)?;
            if detach {
                return Ok(0);
            }
            wait_as(child)
        }
        Cmd::Start { id } => {
            start(&root, &id)?;
            Ok(0)
        }
        Cmd::State { id } => state(&root, &id),
        Cmd::Kill { id, signal, all } => {
            kill(&root, &id, parse_signal(&signal)?, all)?;
            Ok(0)
        }
        Cmd::Delete { id, force } => {
            delete(&root, &id, force)?;
            Ok(0)
        }
        Cmd::Update { id, resources } => update(&root, cfg, &id, &resources),
        Cmd::Exec(a) => exec(&root, &a),
        Cmd::Ps { id, format, .. } => ps(&root, &id, &format),
        Cmd::List { format, quiet } => list(&root, &format, quiet),
        Cmd::Features => {
            say!("{}", serde_json::to_string_pretty(&features())?);
            Ok(0)
        }
        Cmd::Monitor {
            id,
            bundle,
            ready_fd,
            console_fd,
        } => run_monitor(&root, cfg, id, bundle, ready_fd, console_fd),
        Cmd::ExecMonitor {
            id,
            process_fd,
            ready_fd,
            console_socket,
        } => exec_monitor(&root, &id, process_fd, ready_fd, console_socket.as_deref()),
    }
}

/// The monitor and the exec relay hold nothing of their caller's but what they were told
/// of: its other open descriptors would reach the sandbox's process 1 and helpers.
fn close_callers_fds(command: &Cmd) -> std::io::Result<()> {
    match command {
        Cmd::Monitor {
            ready_fd,
            console_fd,
            ..
        } => cordon_oci::close_inherited(
            &[Some(*ready_fd), *console_fd]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>(),
        ),
        Cmd::ExecMonitor {
            ready_fd,
            process_fd,
            ..
        } => cordon_oci::close_inherited(&[*ready_fd, *process_fd]),
        _ => Ok(()),
    }
}

/// `state`: the container's OCI state, as JSON.
fn state(root: &Root, id: &str) -> Result<i32> {
    let r = root.load(id)?;
    let status = r.status_now();
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct State<'a> {
        oci_version: &'a str,
        id: &'a str,
        status: Status,
        pid: i32,
        bundle: &'a Path,
        rootfs: PathBuf,
        created: &'a str,
        owner: &'a str,
        annotations: &'a std::collections::BTreeMap<String, String>,
    }
    let rootfs = cordon_oci::bundle::load(&r.bundle)
        .ok()
        .and_then(|s| cordon_oci::bundle::rootfs(&s, &r.bundle).ok())
        .unwrap_or_default();
    let s = State {
        oci_version: "1.0.2",
        id: &r.id,
        status,
        pid: if status == Status::Stopped { 0 } else { r.pid },
        bundle: &r.bundle,
        rootfs,
        created: &r.created,
        owner: "",
        annotations: &r.annotations,
    };
    say!("{}", serde_json::to_string_pretty(&s)?);
    Ok(0)
}

/// `update`: new resources (OCI `linux.resources` JSON, from a file or `-` for stdin).
fn update(root: &Root, cfg: Option<&Path>, id: &str, resources: &Path) -> Result<i32> {
    let text = if resources == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(resources)
            .with_context(|| format!("reading {}", resources.display()))?
    };
    let res: oci_spec::runtime::LinuxResources =
        serde_json::from_str(&text).context("the resources are not OCI linux.resources JSON")?;
    let node = NodeConfig::load(cfg)?;
    cordon_oci::update::update(root, &node, id, res)?;
    Ok(0)
}

/// `ps`: the container's processes, as the monitor sees them (else from its sandbox).
fn ps(root: &Root, id: &str, format: &str) -> Result<i32> {
    let r = root.load(id)?;
    let pids = if r.alive() {
        match Conn::connect(&root.dir(id)).and_then(|c| c.call(&Request::Ps, &[])) {
            Ok(Reply::Pids { pids }) => pids,
            _ => r
                .sandbox
                .as_deref()
                .map(|s| monitor::sandbox_pids(s, r.cgroup.as_deref()))
                .unwrap_or_default(),
        }
    } else {
        Vec::new()
    };
    if format == "json" {
        say!("{}", serde_json::to_string(&pids)?);
    } else {
        say!("PID");
        for p in pids {
            say!("{p}");
        }
    }
    Ok(0)
}

/// `list`: the containers of this root (ids only with `quiet`).
fn list(root: &Root, format: &str, quiet: bool) -> Result<i32> {
    let records: Vec<_> = root
        .ids()
        .iter()
        .filter_map(|i| root.load(i).ok())
        .collect();
    if quiet {
        for r in &records {
            say!("{}", r.id);
        }
    } else if format == "json" {
        #[derive(serde::Serialize)]
        struct Item<'a> {
            id: &'a str,
            pid: i32,
            status: Status,
            bundle: &'a Path,
            created: &'a str,
        }
        let items: Vec<Item> = records
            .iter()
            .map(|r| Item {
                id: &r.id,
                pid: r.pid,
                status: r.status_now(),
                bundle: &r.bundle,
                created: &r.created,
            })
            .collect();
        say!("{}", serde_json::to_string(&items)?);
    } else {
        say!("ID\tPID\tSTATUS\tBUNDLE");
        for r in &records {
            say!(
                "{}\t{}\t{:?}\t{}",
                r.id,
                r.pid,
                r.status_now(),
                r.bundle.display()
            );
        }
    }
    Ok(0)
}

/// The exec relay: reads the process to run from its pipe, then runs it in the container.
fn exec_monitor(
    root: &Root,
    id: &str,
    process_fd: i32,
    ready_fd: i32,
    console_socket: Option<&Path>,
) -> Result<i32> {
    let ready = cordon_oci_ready(ready_fd)?;
    let mut json = Vec::new();
    std::fs::File::from(cordon_oci::inherited_fd(process_fd).context("the process's pipe")?)
        .read_to_end(&mut json)
        .context("reading the process")?;
    let process: ProcessSpec = serde_json::from_slice(&json).context("reading the process")?;
    exec_in(root, id, &process, console_socket, Some(ready))
}

fn cordon_oci_ready(fd: i32) -> Result<std::fs::File> {
    cordon_oci::ready_pipe(fd).context("the readiness pipe")
}

/// `create`: starts the monitor (which makes the sandbox) and waits until it says the
/// container is created or why not. Returns the monitor, a child of this process.
fn create(root: &Root, cfg: Option<&Path>, a: &CreateArgs) -> Result<std::process::Child> {
    let bundle = std::fs::canonicalize(&a.bundle)
        .with_context(|| format!("the bundle {}", a.bundle.display()))?;
    // The engine's console socket is reached here, in the engine's own view of the file
    // system; the monitor (in a mount namespace of its own) is handed the connection.
    let console = match &a.console_socket {
        Some(p) => {
            let sock = cordon_oci::ctl::connect_console(p).with_context(|| {
                format!(
                    "connecting to the console socket {}; the engine must listen there",
                    p.display()
                )
            })?;
            nix::fcntl::fcntl(
                &sock,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )?;
            Some(sock)
        }
        None => None,
    };
    let dir = root.create_dir(&a.id)?;
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // The write end goes to the monitor (and only there).
    nix::fcntl::fcntl(
        &tx,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("--root").arg(&root.0);
    if let Some(c) = cfg {
        cmd.arg("--cordon-config").arg(c);
    }
    cmd.arg("__monitor")
        .arg(&a.id)
        .arg("--bundle")
        .arg(&bundle)
        .arg("--ready-fd")
        .arg(tx.as_raw_fd().to_string());
    if let Some(c) = &console {
        cmd.arg("--console-fd").arg(c.as_raw_fd().to_string());
    }
    let child = cmd.spawn();
    drop(tx);
    drop(console);
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(anyhow!("starting the container's monitor: {e}"));
        }
    };
    let mut said = String::new();
    let _ = std::fs::File::from(rx).read_to_string(&mut said);
    if said.trim() != "ok" {
        let mut child = child;
        let _ = child.wait();
        // A monitor killed mid-create leaves what it was making (and the cgroup it entered).
        sweep_files(&a.id);
        cordon_oci::tiers::unplace(&bundle, &a.id);
        let _ = std::fs::remove_dir_all(&dir);
        let why = said.trim().strip_prefix("error: ").unwrap_or(said.trim());
        if why.is_empty() {
            bail!("the container's monitor ended before the container was created");
        }
        bail!("{why}");
    }
    if let Some(p) = &a.pid_file {
        write_pid_file(p, child.id())?;
    }
    Ok(child)
}

fn write_pid_file(p: &Path, pid: u32) -> Result<()> {
    let tmp = p.with_extension("cordon-tmp");
    std::fs::write(&tmp, pid.to_string())
        .and_then(|()| std::fs::rename(&tmp, p))
        .with_context(|| format!("writing the pid file {}", p.display()))
}

/// The monitor process: makes the sandbox, says so on the readiness pipe, serves.
fn run_monitor(
    root: &Root,
    cfg: Option<&Path>,
    id: String,
    bundle: PathBuf,
    ready_fd: i32,
    console_fd: Option<i32>,
) -> Result<i32> {
    let mut ready = cordon_oci_ready(ready_fd)?;
    let console = console_fd
        .map(cordon_oci::inherited_fd)
        .transpose()
        .context("the console socket")?;
    // Its own session: the caller's terminal signals do not reach it.
    let _ = nix::unistd::setsid();
    // The container's directory is this monitor's while it lives (released when it ends).
    let held = root.hold(&id);
    let made = held
        .and_then(|held| Ok((held, NodeConfig::load(cfg)?)))
        .and_then(|(held, node)| {
            // Kept for the process's life: leaked, never unlocked before the end.
            std::mem::forget(held);
            let setup = monitor::Setup {
                root: root.clone(),
                id: id.clone(),
                bundle,
                node,
                console,
            };
            let prepared = monitor::prepare(setup)?;
            let listener = cordon_oci::ctl::Listener::bind(&root.dir(&id))
                .map_err(|e| cordon_oci::OciError::io("binding the control socket", e))?;
            root.save(&prepared.record)?;
            Ok((prepared, listener))
        });
    match made {
        Ok((prepared, listener)) => {
            let bundle = prepared.record.bundle.clone();
            let rootfs = cordon_oci::bundle::load(&bundle)
                .and_then(|s| cordon_oci::bundle::rootfs(&s, &bundle));
            let root = root.clone();
            // The container is served from a thread of its own, in the node's view; this
            // first thread (the one a caller's `podman cp` joins) sees only the bundle's
            // root, read-only, and waits. Every signal is blocked here: the server thread
            // reads the container's.
            let server =
                std::thread::spawn(move || -> () { monitor::serve(&root, prepared, listener) });
            let _ = nix::sys::signal::SigSet::all().thread_block();
            let shown = rootfs.and_then(|r| cordon_oci::bundle::show_callers_only_the_rootfs(&r));
            if let Err(e) = shown {
                // Fail closed: the container goes with its monitor.
                let _ = writeln!(ready, "error: {e}");
                cordon_oci::die_by(libc::SIGKILL);
            }
            let _ = ready.write_all(b"ok\n");
            drop(ready);
            let _ = server.join();
            Ok(1)
        }
        Err(e) => {
            let _ = writeln!(ready, "error: {e}");
            Ok(1)
        }
    }
}

fn start(root: &Root, id: &str) -> Result<()> {
    let r = root.load(id)?;
    if !r.alive() {
        bail!("container {id:?} is stopped; delete it and create it again");
    }
    match Conn::connect(&root.dir(id))
        .and_then(|c| c.call(&Request::Start, &[]))
        .context("reaching the container's monitor")?
    {
        Reply::Ok => Ok(()),
        Reply::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer from the container's monitor: {other:?}"),
    }
}

fn parse_signal(s: &str) -> Result<i32> {
    if let Ok(n) = s.parse::<i32>() {
        if !(1..=64).contains(&n) {
            bail!("signal {n} does not exist; give a name (TERM, USR1) or a number from 1 to 64");
        }
        return Ok(n);
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|s| s as i32)
        .map_err(|_| anyhow!("unknown signal {s:?}; give a name (TERM, KILL) or a number"))
}

fn kill(root: &Root, id: &str, signal: i32, all: bool) -> Result<()> {
    let r = root.load(id)?;
    if !r.alive() {
        // `kill --all` after the container's process ended (containerd's shim does it to
        // end what the process left): whatever its cgroup still holds is removed.
        if all {
            monitor::sweep(&r);
            return Ok(());
        }
        bail!("container {id:?} is not running");
    }
    match Conn::connect(&root.dir(id)).and_then(|c| c.call(&Request::Signal { signal, all }, &[])) {
        Ok(Reply::Ok) => Ok(()),
        Ok(Reply::Error { message }) => bail!("{message}"),
        Ok(other) => bail!("unexpected answer from the container's monitor: {other:?}"),
        // A monitor that does not answer is killed: its sandbox goes with it.
        Err(_) if signal == libc::SIGKILL => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(r.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            Ok(())
        }
        Err(e) => Err(anyhow!("reaching the container's monitor: {e}")),
    }
}

fn delete(root: &Root, id: &str, force: bool) -> Result<()> {
    let r = match root.load(id) {
        Ok(r) => r,
        // No record: its monitor was killed before it wrote one (while it made the
        // writable root's image or a microvm disk, say). What it may have left is named by
        // the container's id; then nothing else is left to delete, as runc answers a
        // forced delete.
        Err(cordon_oci::OciError::NotFound(_)) if !root.held(id) => {
            sweep_files(id);
            let _ = std::fs::remove_dir_all(root.dir(id));
            if force {
                return Ok(());
            }
            return Err(cordon_oci::OciError::NotFound(id.to_string()).into());
        }
        // Its monitor is making it: nothing to delete yet, as runc answers a forced delete.
        Err(cordon_oci::OciError::NotFound(_)) if force => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if r.alive() {
        if !force && r.status_now() != Status::Created {
            bail!("container {id:?} is running; stop it first (kill) or use delete --force");
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(r.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Its end is the caller's to reap; this waits only until it is gone (bounded).
        for _ in 0..500 {
            if !r.alive() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    monitor::sweep(&r);
    sweep_files(id);
    std::fs::remove_dir_all(root.dir(id))
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })
        .context("removing the container's state")?;
    Ok(())
}

/// Removes the node files a monitor of container `id` killed mid-create may have left: its
/// writable root's upper image and its microvm disk (each named by the id; one being made
/// by a live monitor of the same id cannot exist: the id's state directory is its own).
fn sweep_files(id: &str) {
    if cordon_oci::check_id(id).is_ok() {
        cordon_oci::rootfs::sweep(id);
        cordon_oci::tiers::sweep_disk(id);
    }
}

fn exec(root: &Root, a: &ExecArgs) -> Result<i32> {
    let process = exec_process(a)?;
    let r = root.load(&a.id)?;
    if r.status_now() != Status::Running {
        bail!("container {:?} is not running; start it first", a.id);
    }
    if !a.detach {
        return exec_in(root, &a.id, &process, a.console_socket.as_deref(), None);
    }
    exec_detached(root, a, &process)
}

/// The process `exec` runs: its `--process` file, else its arguments, with `--user`,
/// `--cwd` and `--env` applied.
fn exec_process(a: &ExecArgs) -> Result<ProcessSpec> {
    let mut process = match &a.process {
        Some(p) => {
            let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let oci: oci_spec::runtime::Process =
                serde_json::from_slice(&text).context("the process file is not an OCI process")?;
            ProcessSpec::from_oci(&oci)?
        }
        None => ProcessSpec {
            args: a.args.clone(),
            env: Default::default(),
            cwd: "/".into(),
            terminal: a.tty,
            console_size: None,
            user: None,
        },
    };
    if let Some(u) = &a.user {
        // uid[:gid], by number (names would need the image's /etc/passwd).
        let (uid, gid) = match u.split_once(':') {
            Some((uid, gid)) => (uid, Some(gid)),
            None => (u.as_str(), None),
        };
        let num = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| anyhow!("--user {u:?}: give uid[:gid] as numbers"))
        };
        let uid = num(uid)?;
        let gid = gid.map(num).transpose()?.unwrap_or(uid);
        process.user = cordon_oci::bundle::ProcessUser::of(uid, gid, &[])?;
    }
    if process.terminal && a.console_socket.is_none() {
        bail!(
            "the process asks for a terminal but no --console-socket was given; give one (the engine's), or run it without -t"
        );
    }
    if let Some(c) = &a.cwd {
        process.cwd = c.clone();
    }
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv:?} is not KEY=VALUE"))?;
        process.env.insert(k.into(), v.into());
    }
    if process.args.is_empty() {
        bail!("exec needs a command: give its arguments or --process");
    }
    Ok(process)
}

/// A detached exec: a process of our own relays it and ends as it does; its pid is the
/// exec's for the caller.
fn exec_detached(root: &Root, a: &ExecArgs, process: &ProcessSpec) -> Result<i32> {
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    nix::fcntl::fcntl(
        &tx,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    // The process (its environment included) goes to the relay through a pipe: a command
    // line is every local user's to read (/proc/<pid>/cmdline).
    let (process_rx, process_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    nix::fcntl::fcntl(
        &process_rx,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    let mut relay = std::process::Command::new(std::env::current_exe()?);
    relay
        .arg("--root")
        .arg(&root.0)
        .arg("__exec")
        .arg(&a.id)
        .arg("--process-fd")
        .arg(process_rx.as_raw_fd().to_string())
        .arg("--ready-fd")
        .arg(tx.as_raw_fd().to_string());
    if let Some(c) = &a.console_socket {
        relay.arg("--console-socket").arg(c);
    }
    let child = relay.spawn().context("starting the exec's relay")?;
    drop(tx);
    drop(process_rx);
    // A relay that ended before reading it says why on the readiness pipe.
    let _ = std::fs::File::from(process_tx).write_all(&serde_json::to_vec(process)?);
    let mut said = String::new();
    let _ = std::fs::File::from(rx).read_to_string(&mut said);
    if said.trim() != "ok" {
        let why = said.trim().strip_prefix("error: ").unwrap_or(said.trim());
        bail!(
            "{}",
            if why.is_empty() {
                "the exec did not start"
            } else {
                why
            }
        );
    }
    if let Some(p) = &a.pid_file {
        write_pid_file(p, child.id())?;
    }
    Ok(0)
}

/// Runs `process` in the container with this process's stdio as its own (or, with a
/// terminal, on a terminal whose master goes to `console`) and returns (or ends) as it
/// ended.
fn exec_in(
    root: &Root,
    id: &str,
    process: &ProcessSpec,
    console: Option<&Path>,
    ready: Option<std::fs::File>,
) -> Result<i32> {
    let started = (|| {
        // Reached first: an engine that is not listening fails the exec before it runs.
        let console = match (process.terminal, console) {
            (true, Some(p)) => Some(cordon_oci::ctl::connect_console(p).with_context(|| {
                format!(
                    "connecting to the console socket {}; the engine must listen there",
                    p.display()
                )
            })?),
            _ => None,
        };
        let c = Conn::connect(&root.dir(id)).context("reaching the container's monitor")?;
        c.send(
            &Request::Exec {
                process: process.clone(),
            },
            &monitor::own_stdio(),
        )?;
        let (reply, fds) = c
            .recv::<Reply>()?
            .ok_or_else(|| anyhow!("the container's monitor closed the connection"))?;
        match (reply, console) {
            (Reply::Ok, _) => Ok(c),
            (Reply::Console { name }, Some(sock)) => {
                let master = fds
                    .first()
                    .ok_or_else(|| anyhow!("the container's monitor sent no terminal"))?;
                cordon_oci::ctl::send_console(&sock, &name, std::os::fd::AsFd::as_fd(master))
                    .context("sending the terminal to the console socket")?;
                Ok(c)
            }
            (Reply::Error { message }, _) => Err(anyhow!("{message}")),
            (other, _) => Err(anyhow!("unexpected answer: {other:?}")),
        }
    })();
    let conn = match (started, ready) {
        (Ok(c), Some(mut r)) => {
            let _ = r.write_all(b"ok\n");
            c
        }
        (Ok(c), None) => c,
        (Err(e), Some(mut r)) => {
            let _ = writeln!(r, "error: {e:#}");
            return Ok(1);
        }
        (Err(e), None) => return Err(e),
    };
    match conn.recv::<Reply>() {
        Ok(Some((Reply::Exited { code, signal }, _))) => match (code, signal) {
            (_, Some(s)) => cordon_oci::die_by(s),
            (Some(c), None) => Ok(c),
            (None, None) => Ok(0),
        },
        // The monitor went away: the container (and the exec) with it.
        _ => cordon_oci::die_by(libc::SIGKILL),
    }
}

/// Waits for our monitor child and ends as it did.
fn wait_as(mut child: std::process::Child) -> Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let st = child.wait()?;
    match (st.code(), st.signal()) {
        (Some(c), _) => Ok(c),
        (None, Some(s)) => cordon_oci::die_by(s),
        _ => Ok(1),
    }
}

/// What `features` reports (the OCI runtime features document).
fn features() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.1.0",
        "hooks": [],
        "mountOptions": [],
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts"],
            "capabilities": [],
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {"enabled": true},
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "intelRdt": {"enabled": false}
        },
        "annotations": {
            "run.oci.cordon.tiers": "container,gvisor,microvm",
            "run.oci.cordon.annotations": cordon_oci::bundle::annotation::ALL.join(",")
        }
    })
}
