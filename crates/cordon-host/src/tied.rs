//! Children tied to this process's life (`PR_SET_PDEATHSIG`), spawned from a thread that
//! lives as long as the process: what every native tier's long-lived helper (the container's
//! init, QEMU, runsc) is started with.

/// Spawns a child that is tied to this process's life by `PR_SET_PDEATHSIG` (set by the child
/// itself, or in a `pre_exec` hook) from a thread that lives as long as the process.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child exits,
/// not the process. A server that creates sandboxes on short-lived worker threads (tokio's
/// blocking pool retires idle threads after ten seconds) would otherwise see every such
/// sandbox killed a few seconds after the thread that made it went idle. On the main thread
/// (which lives as long as the process) the child is spawned directly.
pub fn spawn_tied(cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    use std::sync::mpsc;
    use std::sync::{Mutex, OnceLock};

    type Job = (
        std::process::Command,
        mpsc::SyncSender<std::io::Result<std::process::Child>>,
    );
    static SPAWNER: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();

    let mut cmd = cmd;
    if nix::unistd::gettid().as_raw() as u32 == std::process::id() {
        return cmd.spawn();
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("cordon-spawner".into())
            .spawn(move || {
                // Runs until the process exits: no sender is ever dropped (it is static).
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let child = cmd.spawn();
                    // The child's ends of any pipes or sockets given to it close here.
                    drop(cmd);
                    let _ = reply.send(child);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let Some(spawner) = spawner else {
        return Err(std::io::Error::other(
            "the process-lifetime spawner thread could not be started; check the thread limit (ulimit -u)",
        ));
    };
    let (reply_tx, reply_rx) = mpsc::sync_channel(1);
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("the process-lifetime spawner thread has stopped"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the process-lifetime spawner thread has stopped"))?
}
