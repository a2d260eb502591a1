//! A sandbox whose create asked `on_timeout: pause` (E2B's `autoPause`): at its TTL or idle
//! timeout the reaper pauses it instead of destroying it (to disk where its tier pauses to
//! disk), and a resume gives it its TTL again, counted from then. Paused, it is destroyed
//! only once it has stayed paused for `sessions.paused_ttl`, like any paused sandbox.
//!
//! A sandbox busy at its timeout (an exec running) is paused at the reaper's next round
//! after the exec ends; every exec is bounded by its own timeout, so that wait is too. A
//! pause that fails for another reason (the tier refused it, the tenant's
//! `max_paused_bytes` is full) destroys it as a plain timeout would, with that reason
//! audited beside.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

use cordon_core::{Feature, Tier};
use cordon_engine::OnTimeout;

use crate::error::{ApiError, Code};
use crate::model::CreateRequest;

/// A session's timeout action and where it is in it.
#[derive(Debug, Default)]
pub(crate) struct TimeoutState {
    /// Its [`OnTimeout`], as [`code_of`] numbers it.
    action: AtomicU8,
    /// The TTL its create was given (ms), given again at a resume after a timeout's pause.
    span_ms: AtomicI64,
    /// The reaper is pausing it now.
    pausing: AtomicBool,
    /// It was paused by its timeout and not yet resumed.
    paused_by_timeout: AtomicBool,
}

impl TimeoutState {
    pub(super) fn set(&self, action: OnTimeout, ttl: Duration) {
        self.action.store(code_of(action), Ordering::Relaxed);
        self.span_ms.store(
            i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(super) fn action(&self) -> OnTimeout {
        match self.action.load(Ordering::Relaxed) {
            1 => OnTimeout::Pause,
            2 => OnTimeout::PauseFiles,
            _ => OnTimeout::Destroy,
        }
    }

    /// After a resume: the TTL (ms) a sandbox its timeout paused lives again from now.
    pub(super) fn resumed(&self) -> Option<i64> {
        self.paused_by_timeout
            .swap(false, Ordering::AcqRel)
            .then(|| self.span_ms.load(Ordering::Relaxed))
    }

    /// Whether its timeout pauses it.
    pub(super) fn pauses(&self) -> bool {
        self.action() != OnTimeout::Destroy
    }

    /// Takes the right to pause it now; false while a pause is under way. It counts as
    /// paused by its timeout from here, so a resume that comes as soon as the pause takes
    /// (before [`Self::end_pausing`]) gives it its TTL again.
    pub(super) fn begin_pausing(&self) -> bool {
        let began = self
            .pausing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if began {
            self.paused_by_timeout.store(true, Ordering::Release);
        }
        began
    }

    /// The pause begun with [`Self::begin_pausing`] ended (`paused`: it took).
    pub(super) fn end_pausing(&self, paused: bool) {
        if !paused {
            self.paused_by_timeout.store(false, Ordering::Release);
        }
        self.pausing.store(false, Ordering::Release);
    }
}

/// [`TimeoutState::action`]'s number for `action` (0, the default, is destroy).
fn code_of(action: OnTimeout) -> u8 {
    match action {
        OnTimeout::Destroy => 0,
        OnTimeout::Pause => 1,
        OnTimeout::PauseFiles => 2,
    }
}

/// A create asking `on_timeout: pause` on a tier that cannot pause (`pause_files`: that
/// keeps no filesystem snapshot) is refused before anything is made.
pub(super) fn check(req: &CreateRequest, tier: Tier) -> Result<(), ApiError> {
    if req.on_timeout == OnTimeout::PauseFiles
        && tier.features().has(Feature::Pause)
        && !tier.features().has(Feature::SnapshotFiles)
    {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!(
                "on_timeout \"pause_files\" on the {tier} tier, which keeps no snapshot of a \
                 sandbox's files"
            ),
            format!(
                "use on_timeout \"pause\" (it keeps memory too), or {}",
                Feature::SnapshotFiles.fix()
            ),
        ));
    }
    if req.on_timeout != OnTimeout::Destroy && !tier.features().has(Feature::Pause) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!("on_timeout \"pause\" on the {tier} tier, which cannot pause a sandbox"),
            format!(
                "leave on_timeout out (the sandbox is destroyed at its timeout), or {}",
                Feature::Pause.fix()
            ),
        ));
    }
    Ok(())
}
