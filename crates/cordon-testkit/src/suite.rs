//! The tests every native tier's suite declares alike, as one macro the suites invoke.

/// The tests every native tier's suite runs the same way, one `#[test]` each, named alike in
/// every suite: `backend` is an expression giving the suite's backend (it may `return` from
/// the test to skip it), `spec` the suite's spec function, `volume_rounds` how many creates
/// `volume_cost` times.
///
/// - `sequential_execs_start_clean`: [`crate::sequential_execs_start_clean`].
/// - `programs_find_their_libraries_through_the_linkers_cache`:
///   [`crate::libraries_found_through_the_linkers_cache`].
/// - `grant_placeholder_is_not_the_secret_and_cannot_leave_for_other_hosts`:
///   [`crate::egress::grant_placeholder_stays_inside`].
/// - `own_loopback_servers_are_reached_and_the_proxy_port_is_held`: a server a background
///   exec starts on the sandbox's own loopback is reached by a later exec; the forwarder's
///   port stays its own; nothing gets out directly ([`crate::egress::own_loopback_servers`]).
/// - `escape_battery_table`: the escape battery every native tier runs
///   ([`crate::escape::BATTERY`]), held to the tier's wall ([`crate::escape::run_battery`]).
/// - `volumes_outlive_their_sandboxes_with_canonical_ids_their_quota_and_no_way_out`: a
///   volume written here is stored with the canonical owner (1000), so a sandbox of any tier
///   and host range reads and writes it next; read-only refuses writes; its quota is ENOSPC
///   and the disk limit; a planted link reaches nothing of the host
///   ([`crate::volumes::battery`]).
/// - `volume_cost`: what a volume adds to a create (ADR 0011), printed: `cargo test -p
///   <tier crate> --test <suite> volume_cost -- --nocapture` ([`crate::volumes::print_cost`]).
#[macro_export]
macro_rules! shared_tier_tests {
    (backend: $backend:expr, spec: $spec:path, volume_rounds: $rounds:expr $(,)?) => {
        #[test]
        fn sequential_execs_start_clean() {
            let b = $backend;
            $crate::sequential_execs_start_clean(b, &$spec());
        }

        #[test]
        fn programs_find_their_libraries_through_the_linkers_cache() {
            let b = $backend;
            $crate::libraries_found_through_the_linkers_cache(b, &$spec());
        }

        #[test]
        fn grant_placeholder_is_not_the_secret_and_cannot_leave_for_other_hosts() {
            let b = $backend;
            $crate::egress::grant_placeholder_stays_inside(b, $spec());
        }

        #[test]
        fn own_loopback_servers_are_reached_and_the_proxy_port_is_held() {
            let b = $backend;
            $crate::egress::own_loopback_servers(b, $spec());
        }

        #[test]
        fn escape_battery_table() {
            let b = $backend;
            $crate::escape::run_battery(b, &$spec());
        }

        #[test]
        fn volumes_outlive_their_sandboxes_with_canonical_ids_their_quota_and_no_way_out() {
            let b = $backend;
            $crate::volumes::battery(b, $spec);
        }

        #[test]
        fn volume_cost() {
            let b = $backend;
            $crate::volumes::print_cost(b, $spec, $rounds);
        }
    };
}
