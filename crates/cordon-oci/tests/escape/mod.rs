//! The escape battery's backend through the OCI path: each sandbox is a container that
//! `podman --runtime cordon-oci` runs (a long `sleep` as its process), each exec a `podman
//! exec` into it with its output streamed as it comes, its file calls `podman cp` (the
//! caller's own way to move files), its interrupter a `podman kill`. So every case of
//! `cordon_testkit::escape::BATTERY` reaches the workload the way a caller's does.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, OutputSink, Probe, Result, Sandbox, SandboxId,
    SandboxSpec, Termination, Tier,
};

/// Containers of one image through one podman and one runtime.
pub struct PodmanOci {
    /// `podman` and its global arguments (storage, runtime, runtime flags).
    pub podman: Vec<String>,
    pub image: String,
    /// Arguments `podman run` needs here (the ulimits).
    pub run_args: Vec<String>,
}

impl PodmanOci {
    /// The battery's image: `layer` written into `dir` and imported as `image` into the
    /// storage podman's global arguments `args` name; its containers run on the runtime
    /// `oci` with the ulimits podman needs here, NET_ADMIN (the battery's network cases)
    /// and `extra`.
    pub fn imported(
        args: &[String],
        oci: &str,
        layer: &[u8],
        dir: &std::path::Path,
        image: &str,
        extra: &[&str],
    ) -> PodmanOci {
        let tar = dir.join("battery.tar");
        std::fs::write(&tar, layer).unwrap();
        cordon_testkit::podman::import(args, &tar, image, &["ENV PATH=/usr/bin"]);
        let podman = ["podman"]
            .iter()
            .map(|s| s.to_string())
            .chain(args.iter().cloned())
            .chain(["--runtime".to_string(), oci.to_string()])
            .collect();
        let run_args = cordon_testkit::podman::ULIMITS
            .into_iter()
            .chain(["--cap-add", "NET_ADMIN"])
            .chain(extra.iter().copied())
            .map(|s| s.to_string())
            .collect();
        PodmanOci {
            podman,
            image: image.into(),
            run_args,
        }
    }
}

/// Imports the battery's image (`layer`) as `image` into the storage podman's global
/// arguments `args` name and runs `cordon_testkit::escape::BATTERY` against its containers
/// on cordon-oci (`oci`, with `extra` flags) as sandboxes of `tier`, held to `wall`; returns
/// the adapter and the spec it used, for more.
pub fn battery_passes(
    args: &[String],
    oci: &str,
    layer: &[u8],
    image: &str,
    extra: &[&str],
    (tier, wall): (Tier, cordon_testkit::escape::Wall),
) -> (PodmanOci, SandboxSpec) {
    let dir = tempfile::tempdir().unwrap();
    let b = PodmanOci::imported(args, oci, layer, dir.path(), image, extra);
    let spec = SandboxSpec::new(tier);
    cordon_testkit::escape::run_table(&cordon_testkit::escape::BATTERY, &b, &spec, wall);
    (b, spec)
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl PodmanOci {
    fn cmd(&self) -> Command {
        let mut c = Command::new("timeout");
        c.arg("120").args(&self.podman);
        c
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Backend for PodmanOci {
    fn tier(&self) -> Tier {
        Tier::Container
    }

    fn probe(&self) -> Probe {
        Probe::from_capabilities(Tier::Container, Vec::new(), Vec::new())
    }

    fn recover(&self, _orphans: &[String]) -> Vec<String> {
        Vec::new()
    }

    fn create_unprepared(&self, _spec: &SandboxSpec) -> Option<Result<Box<dyn Sandbox>>> {
        None
    }

    fn create(&self, _spec: &SandboxSpec) -> Result<Box<dyn Sandbox>> {
        let name = format!(
            "escape-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let out = self
            .cmd()
            .args(["run", "-d", "--name", &name])
            .args(&self.run_args)
            .args([&self.image, "sleep", "100000"])
            .output()
            .map_err(|e| Error::Sandbox(format!("podman run: {e}")))?;
        if !out.status.success() {
            // A run that failed after podman made the container (a start that failed late
            // leaves it "Exited (-1)" with its monitor up) must not outlive the test.
            let _ = podman_cmd(&self.podman)
                .args(["rm", "-f", "-t", "0", &name])
                .output();
            return Err(Error::Sandbox(format!("podman run: {}", text(&out.stderr))));
        }
        Ok(Box::new(Container {
            id: SandboxId::random()?,
            name,
            podman: self.podman.clone(),
            files: tempfile::tempdir().map_err(|e| Error::Sandbox(e.to_string()))?,
            gone: false,
        }))
    }
}

/// One running container.
pub struct Container {
    id: SandboxId,
    name: String,
    podman: Vec<String>,
    /// Where file calls stage what `podman cp` carries.
    files: tempfile::TempDir,
    gone: bool,
}

impl Container {
    fn podman(&self) -> Command {
        podman_cmd(&self.podman)
    }
}

fn podman_cmd(podman: &[String]) -> Command {
    let mut c = Command::new("timeout");
    c.arg("120").args(podman);
    c
}

/// `podman kill` of the container: it ends with its sandbox, and so does a running exec.
fn kill(podman: &[String], name: &str) {
    let _ = podman_cmd(podman)
        .args(["kill", "--signal", "KILL", name])
        .output();
}

impl Sandbox for Container {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        let argv = cordon_testkit::cli::argv(req)?;
        let mut c = self.podman();
        c.arg("exec");
        for (k, v) in &req.env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        if let Some(cwd) = &req.cwd {
            c.arg("-w").arg(cwd);
        }
        c.arg(&self.name).args(&argv);
        let o = cordon_testkit::cli::exec(c, req, sink, &|| kill(&self.podman, &self.name))?;
        if o.termination == Termination::Timeout {
            self.gone = true;
        }
        Ok(o)
    }

    /// `podman cp` of the data into the container at `path` (under `/work`).
    fn put_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        let at = inside(path);
        let staged = self.files.path().join("put");
        std::fs::write(&staged, data).map_err(|e| file_err(&at, e.to_string()))?;
        let _ = mode;
        let out = self
            .podman()
            .arg("cp")
            .arg(&staged)
            .arg(format!("{}:{at}", self.name))
            .output()
            .map_err(|e| file_err(&at, e.to_string()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(file_err(&at, text(&out.stderr)))
        }
    }

    /// `podman cp` of `path` (under `/work`) out of the container.
    fn get_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let at = inside(path);
        let staged = self.files.path().join("got");
        let _ = std::fs::remove_file(&staged);
        let out = self
            .podman()
            .arg("cp")
            .arg(format!("{}:{at}", self.name))
            .arg(&staged)
            .output()
            .map_err(|e| file_err(&at, e.to_string()))?;
        if !out.status.success() {
            return Err(file_err(&at, text(&out.stderr)));
        }
        let data = std::fs::read(&staged).map_err(|e| file_err(&at, e.to_string()))?;
        Ok(data.into_iter().take(max_bytes as usize).collect())
    }

    fn start_us(&self) -> u64 {
        0
    }

    fn destroy(&mut self) -> Result<()> {
        let mut out = self.podman().args(["rm", "-f", &self.name]).output();
        // A removal podman could not finish (a loaded host, a container still stopping)
        // is tried once more: one left running outlives the test binary (seen once in CI).
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            std::thread::sleep(std::time::Duration::from_secs(1));
            out = self
                .podman()
                .args(["rm", "-f", "-t", "0", &self.name])
                .output();
        }
        self.gone = true;
        match out {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(Error::Sandbox(format!("podman rm: {}", text(&o.stderr)))),
            Err(e) => Err(Error::Sandbox(format!("podman rm: {e}"))),
        }
    }

    fn interrupter(&self) -> Option<cordon_core::Interrupter> {
        let podman = self.podman.clone();
        let name = self.name.clone();
        Some(std::sync::Arc::new(move || kill(&podman, &name)))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.gone
            && let Err(e) = self.destroy()
        {
            eprintln!("container {} left: {e}", self.name);
        }
    }
}

fn inside(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/work/{path}")
    }
}

fn file_err(path: &str, reason: String) -> Error {
    Error::File {
        path: path.to_string(),
        reason: reason.trim().to_string(),
    }
}
