//! The escape battery's backend through a real Kubernetes: each sandbox is a pod of one
//! RuntimeClass (a long `sleep` as its process) that the kubelet runs through containerd and
//! cordon-oci, each exec a `kubectl exec` into it, its interrupter and its end a forced `kubectl
//! delete`. So every case reaches the workload the
//! way a cluster's user does. Runs where `kubectl` on `PATH` reaches the cluster
//! (`scripts/k8s.sh exec` gives it the cluster's namespace and kubeconfig).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use cordon_core::{
    Backend, Error, ExecOutcome, ExecRequest, OutputSink, Probe, Result, Sandbox, SandboxId,
    SandboxSpec, Termination, Tier,
};

/// Pods of one image on one RuntimeClass.
pub struct Kube {
    pub runtime_class: String,
    pub image: String,
    /// The tier the RuntimeClass's handler runs (what the battery's wall is held to).
    pub tier: Tier,
    /// Mount the service account's token, as every pod does by default.
    pub token: bool,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

fn kubectl() -> Command {
    let mut c = Command::new("timeout");
    c.args(["300", "kubectl"]);
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Kube {
    /// The pod's manifest: the image's `sleep` as its only container, pulled never (the
    /// image was imported on the node), ended at once on delete. The RuntimeClass `runc`
    /// is the node's default handler (no `runtimeClassName`).
    pub fn manifest(&self, name: &str) -> String {
        let mut pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"cordon-test": "escape"}},
            "spec": {
                "runtimeClassName": self.runtime_class,
                "automountServiceAccountToken": self.token,
                "enableServiceLinks": false,
                "terminationGracePeriodSeconds": 0,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "w",
                    "image": self.image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "100000"],
                    "workingDir": "/work",
                }],
            },
        });
        if self.runtime_class == "runc" {
            pod["spec"]
                .as_object_mut()
                .expect("an object")
                .remove("runtimeClassName");
        }
        pod.to_string()
    }
}

impl Backend for Kube {
    fn tier(&self) -> Tier {
        self.tier
    }

    fn probe(&self) -> Probe {
        Probe::from_capabilities(self.tier, Vec::new(), Vec::new())
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
        let pod = Pod {
            id: SandboxId::random()?,
            name,
            gone: false,
        };
        let mut apply = kubectl()
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::Sandbox(format!("kubectl apply: {e}")))?;
        {
            use std::io::Write;
            let mut stdin = apply.stdin.take().expect("piped");
            stdin
                .write_all(self.manifest(&pod.name).as_bytes())
                .map_err(|e| Error::Sandbox(format!("kubectl apply: {e}")))?;
        }
        let out = apply
            .wait_with_output()
            .map_err(|e| Error::Sandbox(format!("kubectl apply: {e}")))?;
        if !out.status.success() {
            return Err(Error::Sandbox(format!(
                "kubectl apply: {}",
                text(&out.stderr)
            )));
        }
        let ready = kubectl()
            .args(["wait", "--for=condition=Ready", "--timeout=180s"])
            .arg(format!("pod/{}", pod.name))
            .output()
            .map_err(|e| Error::Sandbox(format!("kubectl wait: {e}")))?;
        if !ready.status.success() {
            let described = kubectl()
                .args(["describe", "pod", &pod.name])
                .output()
                .map(|o| text(&o.stdout))
                .unwrap_or_default();
            return Err(Error::Sandbox(format!(
                "pod {} did not become Ready: {}\n{described}",
                pod.name,
                text(&ready.stderr)
            )));
        }
        Ok(Box::new(pod))
    }
}

/// One running pod.
pub struct Pod {
    id: SandboxId,
    name: String,
    gone: bool,
}

/// Ends the pod at once, as `podman kill` ends a container: its workload dies and with it
/// every `kubectl exec` into it (a `kill` run by another exec would not reach the first: each
/// exec of a Cordon sandbox is its own session).
fn kill(name: &str) {
    let _ = kubectl()
        .args([
            "delete",
            "pod",
            name,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ])
        .output();
}

impl Sandbox for Pod {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn exec(&mut self, req: &ExecRequest, sink: &mut dyn OutputSink) -> Result<ExecOutcome> {
        let mut argv = crate::cli::argv(req)?;
        if !req.env.is_empty() || req.cwd.is_some() {
            // kubectl exec has no environment or directory of its own: env(1) and cd do it.
            let mut pre = vec!["env".to_string()];
            pre.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
            if let Some(cwd) = &req.cwd {
                pre.extend(["sh".into(), "-c".into(), "cd \"$0\" && exec \"$@\"".into()]);
                pre.push(cwd.clone());
            }
            pre.append(&mut argv);
            argv = pre;
        }
        let mut c = kubectl();
        c.args(["exec", &self.name, "--"]).args(&argv);
        let name = self.name.clone();
        let o = crate::cli::exec(c, req, sink, &|| kill(&name))?;
        if o.termination == Termination::Timeout {
            self.gone = true;
            let _ = self.destroy();
        }
        Ok(o)
    }

    /// Files move in and out of a pod by `kubectl cp`, which runs the workload's own `tar`
    /// in it: no file call of a caller reaches the sandbox's `/work` past its workload, so
    /// there is none to make here (the battery's wall says so with `agent_files: false`).
    fn put_file(&mut self, path: &str, _data: &[u8], _mode: u32) -> Result<()> {
        Err(Error::File {
            path: path.to_string(),
            reason: "a pod's files move by kubectl cp, through its workload's own tar".into(),
        })
    }

    fn get_file(&mut self, path: &str, _max_bytes: u64) -> Result<Vec<u8>> {
        Err(Error::File {
            path: path.to_string(),
            reason: "a pod's files move by kubectl cp, through its workload's own tar".into(),
        })
    }

    fn start_us(&self) -> u64 {
        0
    }

    fn destroy(&mut self) -> Result<()> {
        self.gone = true;
        let out = kubectl()
            .args([
                "delete",
                "pod",
                &self.name,
                "--grace-period=0",
                "--force",
                "--wait=true",
                "--ignore-not-found",
            ])
            .output()
            .map_err(|e| Error::Sandbox(format!("kubectl delete: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Sandbox(format!(
                "kubectl delete: {}",
                text(&out.stderr)
            )))
        }
    }

    fn interrupter(&self) -> Option<cordon_core::Interrupter> {
        let name = self.name.clone();
        Some(std::sync::Arc::new(move || kill(&name)))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if !self.gone
            && let Err(e) = self.destroy()
        {
            eprintln!("pod {} left: {e}", self.name);
        }
    }
}
