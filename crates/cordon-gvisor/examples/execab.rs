//! A/B of two agent binaries on the gvisor tier, alternating within one process so both
//! sides see the same host moment: `execab AGENT_A AGENT_B [ROUNDS] [EXECS]`. Each round
//! runs EXECS back-to-back execs of `true` in one live sandbox per side (after three
//! unmeasured ones) and prints the mean exec and the host's context switches and CPU
//! time per exec (from /proc/stat), which drift less than wall time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cordon_core::{Backend, ExecRequest, OutputStream, SandboxSpec, Tier};
use cordon_gvisor::{GvisorBackend, GvisorConfig};

fn host_counters() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let mut ctxt = 0;
    let mut busy = 0;
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("ctxt") => ctxt = f.next().unwrap().parse().unwrap(),
            Some("cpu") => {
                let v: Vec<u64> = f.map(|x| x.parse().unwrap()).collect();
                // user nice system (idle iowait excluded) irq softirq steal
                busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
            }
            _ => {}
        }
    }
    (ctxt, busy)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let agents = [args[0].clone(), args[1].clone()];
    let rounds: usize = args.get(2).map_or(6, |r| r.parse().unwrap());
    let execs: usize = args.get(3).map_or(20, |r| r.parse().unwrap());
    let backends: Vec<GvisorBackend> = agents
        .iter()
        .map(|a| {
            let mut c = GvisorConfig::discover();
            c.agent = std::fs::canonicalize(a).expect("an agent binary");
            GvisorBackend::new(c)
        })
        .collect();
    let spec = SandboxSpec::new(Tier::Gvisor);
    let req = ExecRequest::argv(["true"]);
    let mut sink = |_: OutputStream, _: &[u8]| {};
    let mut totals = [(Duration::ZERO, 0u64, 0u64); 2];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let mut sb = backends[side].create(&spec).unwrap();
            for _ in 0..3 {
                sb.exec(&req, &mut sink).unwrap();
            }
            let (c0, b0) = host_counters();
            let t = Instant::now();
            for _ in 0..execs {
                let o = sb.exec(&req, &mut sink).unwrap();
                assert_eq!(o.exit_code, Some(0));
            }
            let wall = t.elapsed();
            let (c1, b1) = host_counters();
            sb.destroy().unwrap();
            let n = execs as u64;
            println!(
                "round {round} side {}: exec {:6.2} ms  ctxt/exec {:5}  cpu/exec {:5.2} ms",
                ["A", "B"][side],
                wall.as_secs_f64() * 1e3 / execs as f64,
                (c1 - c0) / n,
                (b1 - b0) as f64 * 10.0 / n as f64
            );
            totals[side].0 += wall;
            totals[side].1 += c1 - c0;
            totals[side].2 += b1 - b0;
        }
    }
    let n = (rounds * execs) as f64;
    for side in 0..2 {
        println!(
            "side {}: mean exec {:.2} ms, ctxt/exec {:.0}, cpu/exec {:.2} ms ({})",
            ["A", "B"][side],
            totals[side].0.as_secs_f64() * 1e3 / n,
            totals[side].1 as f64 / n,
            totals[side].2 as f64 * 10.0 / n,
            agents[side]
        );
    }
}
