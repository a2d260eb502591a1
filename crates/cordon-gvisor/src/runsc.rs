//! The runsc command line: the base every call starts with, quiet runs, a forced delete
//! and whether runsc holds a container's state.

use std::process::{Command as Proc, Stdio};

use crate::{GvisorConfig, reap};

pub(crate) fn quiet(mut p: Proc) -> Proc {
    p.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    p
}

/// The runsc command line every call starts with.
pub(crate) fn runsc_base(config: &GvisorConfig) -> Proc {
    let mut p = Proc::new(&config.runsc);
    p.arg("--root")
        .arg(&config.state_root)
        .arg("--network=none")
        .arg(format!("--platform={}", config.platform));
    p
}

/// Kills and force-deletes a container; quiet, best effort.
pub(crate) fn force_delete(config: &GvisorConfig, cid: &str) {
    let mut kill = runsc_base(config);
    kill.args(["kill", cid, "KILL"]);
    let _ = quiet(kill).status();
    let mut del = runsc_base(config);
    del.args(["delete", "--force", cid]);
    let _ = quiet(del).status();
    reap::remove_lock(&config.state_root, cid);
}

/// True while runsc holds state for a container.
pub(crate) fn has_state(config: &GvisorConfig, cid: &str) -> bool {
    config
        .state_root
        .join(format!("{cid}_sandbox:{cid}.state"))
        .exists()
}
