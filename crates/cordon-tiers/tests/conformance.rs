//! Every tier keeps the promises of its [`Features`] (issue 50): each feature a tier claims
//! is exercised on a real sandbox of it and works; each it does not claim is refused with
//! the one error that feature's refusal is (`Error::Unsupported` whose fix names the tiers
//! that have it, from the same table). A feature is either an operation this test can call
//! through the `Sandbox`/`Backend` traits or a fact another layer acts on, and then
//! [`fact`] names the test that holds the tier to it: a new [`Feature`] does not compile
//! here until it says which.
//!
//! Tiers this build carries but this host cannot run are skipped loudly (failed under
//! `CORDON_REQUIRE_ALL=1`), as every capability test is.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests panic on failure by design

use std::io::Read;

use cordon_core::{
    Backend, Error, ExecRequest, Feature, Language, OutputStream, PORT_CONNECTED, PtySize, Sandbox,
    SandboxSpec, SnapshotDir, SnapshotMode, Tier, WatchOp,
};
use cordon_tiers::Tiers;

/// What a check of one feature on one sandbox found.
enum Found {
    Worked,
    Refused(Error),
}

fn found<T>(r: cordon_core::Result<T>) -> Result<Found, Error> {
    match r {
        Ok(_) => Ok(Found::Worked),
        Err(e @ Error::Unsupported { .. }) => Ok(Found::Refused(e)),
        Err(e) => Err(e),
    }
}

/// A feature another layer acts on, and the test that holds each tier to it.
fn fact(f: Feature) -> Option<&'static str> {
    Some(match f {
        Feature::Volumes => "sdk/python/tests/test_volumes.py",
        Feature::Contexts => "sdk/python/tests/test_contexts.py",
        Feature::Oci => {
            "crates/cordon-oci/tests/tiers (podman_refuses_a_tier_the_node_closes_or_cannot_run)"
        }
        Feature::HostPaths => {
            "crates/cordon-oci/tests/pod_volumes (other_pods_volumes_host_paths_and_the_microvm_tier_are_refused)"
        }
        Feature::HostDevices => {
            "crates/cordon-oci/tests/tiers (podman_microvm_images_device_nodes_and_set_id_programs_do_nothing)"
        }
        Feature::WritableRoot => {
            "crates/cordon-oci/tests/oci.rs (podman_writable_root_keeps_its_writes_to_itself_within_its_bound)"
        }
        Feature::RootMountPoints => "crates/cordon-oci/tests/tiers (the gvisor tier's bundles)",
        Feature::RootDisk => "crates/cordon-oci/tests/tiers (the microvm tier's bundles)",
        Feature::Network => return None,
        Feature::Files
        | Feature::FilesOutside
        | Feature::Background
        | Feature::Pty
        | Feature::Pause
        | Feature::PauseToDisk
        | Feature::Programs
        | Feature::WasmModules
        | Feature::OwnKernel
        | Feature::Attached
        | Feature::Held
        | Feature::SnapshotFull
        | Feature::SnapshotFiles
        | Feature::Ports
        | Feature::Watch
        | Feature::FileMetadata => return None,
    })
}

/// `(module (func (export "_start")))`: the least WASI command module.
const EMPTY_COMMAND: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
    0x03, 0x02, 0x01, 0x00, // func 0 of type 0
    0x07, 0x0a, 0x01, 0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // export
    0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: end
];

fn quiet() -> impl FnMut(OutputStream, &[u8]) {
    |_: OutputStream, _: &[u8]| {}
}

/// The sandbox's trivial exec: a program where the tier runs programs, else code.
fn trivial(tier: Tier) -> ExecRequest {
    let f = tier.features();
    if f.has(Feature::Programs) {
        ExecRequest::argv(["true"])
    } else if f.runs(Language::Javascript) {
        ExecRequest::code(Language::Javascript, "0")
    } else {
        ExecRequest::code(Language::Python, "pass")
    }
}

/// Calls `f` on `sb` (or on a backend, for the features a create decides).
fn exercise(
    f: Feature,
    b: &dyn Backend,
    spec: &SandboxSpec,
    sb: &mut dyn Sandbox,
) -> Result<Found, Error> {
    let tier = spec.tier;
    match f {
        Feature::Network => {
            let mut s = spec.clone();
            s.egress.allow = cordon_core::egress::parse_patterns(&["127.0.0.1/32:9"]).unwrap();
            match b.create(&s) {
                Ok(mut other) => {
                    other.destroy()?;
                    Ok(Found::Worked)
                }
                Err(e) => found::<()>(Err(e)),
            }
        }
        Feature::Files => {
            let r = sb.put_file("/work/conformance.txt", b"kept", 0o644);
            if r.is_ok() {
                assert_eq!(sb.get_file("/work/conformance.txt", 16)?, b"kept");
            }
            found(r)
        }
        Feature::FilesOutside => {
            let r = sb.put_file("/tmp/conformance.txt", b"kept", 0o644);
            if r.is_ok() {
                assert_eq!(sb.get_file("/tmp/conformance.txt", 16)?, b"kept");
            }
            found(r)
        }
        Feature::Background => background(sb, &trivial(tier)),
        Feature::Pty => {
            let mut req = ExecRequest::argv(["true"]);
            req.pty = Some(PtySize { rows: 24, cols: 80 });
            background(sb, &req)
        }
        Feature::Pause => {
            let r = sb.pause();
            if r.is_ok() {
                sb.resume()?;
                exec_ok(sb, &trivial(tier))?;
            }
            found(r)
        }
        Feature::PauseToDisk => {
            let r = sb.pause_to_disk();
            if r.is_ok() {
                sb.resume()?;
                exec_ok(sb, &trivial(tier))?;
            }
            found(r)
        }
        Feature::Programs => match exec_ok(sb, &ExecRequest::argv(["true"])) {
            Err(e @ Error::Unsupported { .. }) => Ok(Found::Refused(e)),
            other => other.map(|()| Found::Worked),
        },
        Feature::WasmModules => {
            match exec_ok(sb, &ExecRequest::wasm(EMPTY_COMMAND.to_vec(), Vec::new())) {
                Err(e @ Error::Unsupported { .. }) => Ok(Found::Refused(e)),
                other => other.map(|()| Found::Worked),
            }
        }
        Feature::OwnKernel => {
            // A tier with a kernel of its own answers `uname -r` with that kernel's release.
            if !tier.features().has(Feature::Programs) {
                return Ok(Found::Refused(
                    Feature::OwnKernel.unsupported(tier, "uname"),
                ));
            }
            let o = sb.exec(&ExecRequest::argv(["uname", "-r"]), &mut quiet())?;
            let inside = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            if inside != host.trim() {
                Ok(Found::Worked)
            } else {
                Ok(Found::Refused(
                    Feature::OwnKernel.unsupported(tier, "a kernel of its own"),
                ))
            }
        }
        Feature::Attached => found(sb.open_terminal(PtySize { rows: 24, cols: 80 })),
        Feature::Held => {
            let r = sb.start_relayed(&trivial(tier), None);
            if let Ok(id) = r {
                ended(sb, id)?;
            }
            found(r)
        }
        Feature::SnapshotFull | Feature::SnapshotFiles => {
            let mode = if f == Feature::SnapshotFull {
                SnapshotMode::Full
            } else {
                SnapshotMode::Filesystem
            };
            let dir = tempfile::tempdir().unwrap();
            let r = sb.snapshot(mode, &SnapshotDir::new(dir.path()));
            if let Ok(image) = &r {
                let mut fork = b.start_from_snapshot(image, &SnapshotDir::new(dir.path()), spec)?;
                exec_ok(fork.as_mut(), &trivial(tier))?;
                fork.destroy()?;
            }
            found(r)
        }
        Feature::Ports => match sb.open_port(9) {
            Ok(mut conn) => {
                // Nothing listens on port 9 inside: the relay says so in its first byte.
                let mut b = [0u8; 1];
                conn.read_exact(&mut b).unwrap();
                assert_ne!(b[0], PORT_CONNECTED, "{tier}: port 9 answered");
                Ok(Found::Worked)
            }
            Err(e) => found::<()>(Err(e)),
        },
        Feature::FileMetadata => {
            let path = "/work/conformance-metadata.txt";
            let metadata = std::collections::BTreeMap::from([("k".into(), "v".into())]);
            let op = cordon_core::FileOp::SetMetadata {
                path: path.into(),
                metadata: metadata.clone(),
            };
            // A tier without files refuses the put; its refusal of the metadata is the one
            // that must name the tiers with it.
            let _ = sb.put_file(path, b"m", 0o644);
            let r = sb.file_op(&op);
            if r.is_ok() {
                let stat = sb.file_op(&cordon_core::FileOp::Stat { path: path.into() })?;
                let cordon_core::FileReply::Entry { entry } = stat else {
                    panic!("{tier}: a stat answered {stat:?}")
                };
                assert_eq!(entry.metadata, metadata, "{tier}");
            }
            found(r)
        }
        Feature::Watch => {
            let r = sb.watch(&WatchOp::Start {
                path: "/work".into(),
                recursive: false,
            });
            found(r)
        }
        Feature::Volumes
        | Feature::Contexts
        | Feature::Oci
        | Feature::HostPaths
        | Feature::HostDevices
        | Feature::WritableRoot
        | Feature::RootMountPoints
        | Feature::RootDisk => unreachable!("{f:?} is a fact: {:?}", fact(f)),
    }
}

fn exec_ok(sb: &mut dyn Sandbox, req: &ExecRequest) -> Result<(), Error> {
    let o = sb.exec(req, &mut quiet())?;
    assert!(
        o.success(),
        "{:?}: {:?} {}",
        req.command,
        o.termination,
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Starts `req` in the background and waits for its end.
fn background(sb: &mut dyn Sandbox, req: &ExecRequest) -> Result<Found, Error> {
    let r = sb.start_background(req);
    if let Ok(id) = r {
        ended(sb, id)?;
    }
    found(r)
}

/// Waits (30 s at most) for background exec `id` to end.
fn ended(sb: &mut dyn Sandbox, id: u64) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sb.read_background(id, [0, 0], 1 << 16)?.exit.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "exec {id} never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn every_tier_keeps_the_promises_of_its_features() {
    let require = std::env::var_os("CORDON_REQUIRE_ALL").is_some_and(|v| v == "1");
    let mut broken = Vec::new();
    for tier in Tier::ALL {
        let Some(b) = Tiers.backend(tier) else {
            assert!(
                !require,
                "this build lacks the {tier} tier (build with cordon-tiers/all)"
            );
            eprintln!("SKIPPING the {tier} tier: not in this build");
            continue;
        };
        let probe = b.probe();
        if !probe.available() {
            assert!(!require, "the {tier} tier cannot run here: {probe:?}");
            eprintln!("SKIPPING the {tier} tier: unavailable here");
            continue;
        }
        let mut spec = SandboxSpec::new(tier);
        spec.limits.timeout_ms = 60_000;
        let mut sb = b.create(&spec).unwrap();
        let features = tier.features();
        assert_eq!(
            b.features(),
            features,
            "{tier}: the backend says other features"
        );
        for f in Feature::ALL {
            if let Some(held_by) = fact(f) {
                eprintln!("{tier} {f:?}: a fact, held by {held_by}");
                continue;
            }
            let claimed = features.has(f);
            match (claimed, exercise(f, b.as_ref(), &spec, sb.as_mut())) {
                (true, Ok(Found::Worked)) => {}
                // A refusal is the feature's own: its fix names the tiers that have it.
                (false, Ok(Found::Refused(Error::Unsupported { fix, .. }))) => {
                    if !fix.contains(&f.fix()) {
                        broken.push(format!(
                            "{tier} {f:?}: refused with another fix: {fix:?} (want it to \
                             contain {:?})",
                            f.fix()
                        ));
                    }
                }
                (false, Ok(Found::Refused(e))) => {
                    broken.push(format!("{tier} {f:?}: refused as {e:?}"))
                }
                (false, Ok(Found::Worked)) => {
                    broken.push(format!("{tier} {f:?}: works but is not claimed"))
                }
                (true, Ok(Found::Refused(e))) => {
                    broken.push(format!("{tier} {f:?}: claimed but refused: {e}"))
                }
                (_, Err(e)) => broken.push(format!("{tier} {f:?}: failed: {e}")),
            }
        }
        sb.destroy().unwrap();
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
