//! The per-tier measurements after start-up: memory, warm and unprepared starts, execs,
//! language snippets, the agent run and throughput.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cordon_core::{ExecRequest, OutputStream, Sandbox};

use super::stats::Budget;
use cordon_policy::bench_doc::{
    AgentRun, ExecFloor, LanguageFigures, MemoryFigure, Stats, Throughput, TierReport,
};

use super::live::{LiveTier, Out, Plan, cycle, exec_ok, fail, languages_of};
use super::memory;

pub(super) fn measure_memory(lt: &LiveTier, n: usize) -> Result<MemoryFigure> {
    // Let whatever the first sandbox left behind go before the baseline.
    std::thread::sleep(Duration::from_millis(50));
    let baseline = memory::tree_pss(std::process::id());
    let sampler = memory::Sampler::start();
    let mut boxes = Vec::new();
    let mut result = Ok(());
    for _ in 0..n {
        match lt.backend.create(&lt.spec) {
            Ok(mut sb) => {
                let r = exec_ok(sb.as_mut(), &lt.trivial);
                boxes.push(sb);
                if let Err(e) = r {
                    result = Err(e);
                    break;
                }
            }
            Err(e) => {
                result = Err(e.into());
                break;
            }
        }
    }
    let peak = sampler.finish();
    for mut sb in boxes {
        let _ = sb.destroy();
    }
    result?;
    Ok(MemoryFigure {
        per_sandbox_bytes: peak.saturating_sub(baseline) / n.max(1) as u64,
        live_sandboxes: n,
        method: memory::METHOD.to_string(),
    })
}

/// Take a pre-created sandbox (as the server's warm pool holds them: the default spec,
/// created ahead) and run the trivial snippet; creation and destruction are off the clock.
pub(super) fn measure_warm(lt: &LiveTier, b: &Budget) -> Result<Vec<Duration>> {
    const POOL: usize = 4;
    let start = Instant::now();
    let mut out = Vec::new();
    while b.wants_more(out.len(), start.elapsed()) {
        let n = POOL.min(b.max - out.len()).max(1);
        let mut pool = Vec::with_capacity(n);
        for _ in 0..n {
            pool.push(lt.backend.create(&lt.spec)?);
        }
        loop {
            let t = Instant::now();
            let Some(mut sb) = pool.pop() else { break };
            let r = exec_ok(sb.as_mut(), &lt.trivial);
            let el = t.elapsed();
            let _ = sb.destroy();
            r?;
            out.push(el);
        }
    }
    Ok(out)
}

/// `req` in one live sandbox, again and again (after one unmeasured run).
/// Create + trivial exec + destroy where the tier starts without what it prepares ahead
/// (`None` for tiers that prepare nothing). Each sample is a full start (a guest boot under
/// emulation takes seconds), so the budget usually stops it at its minimum.
pub(super) fn measure_unprepared(lt: &LiveTier, b: &Budget) -> Option<Result<Vec<Duration>>> {
    let first = Instant::now();
    let mut sb = match lt.backend.create_unprepared(&lt.spec)? {
        Ok(sb) => sb,
        Err(e) => return Some(Err(e.into())),
    };
    let once = |sb: &mut Box<dyn Sandbox>| -> Result<()> {
        let r = exec_ok(sb.as_mut(), &lt.trivial);
        let d = sb.destroy();
        r?;
        d?;
        Ok(())
    };
    if let Err(e) = once(&mut sb) {
        return Some(Err(e));
    }
    let mut samples = vec![first.elapsed()];
    let start = Instant::now();
    while b.wants_more(samples.len(), start.elapsed()) {
        let t = Instant::now();
        let made = lt.backend.create_unprepared(&lt.spec)?;
        let r = made
            .map_err(anyhow::Error::from)
            .and_then(|mut sb| once(&mut sb));
        if let Err(e) = r {
            return Some(Err(e));
        }
        samples.push(t.elapsed());
    }
    Some(Ok(samples))
}

/// The fork+exec floor inside one live sandbox ([`ExecFloor`]), for tiers whose trivial
/// snippet is one program (`None` for the others). Each sample times a shell's loop of
/// `plan.snippets` runs of the program and an empty loop, one after the other, through the
/// tier: their difference is the loop's execs alone.
pub(super) fn measure_floor(lt: &LiveTier, plan: &Plan) -> Result<Option<ExecFloor>> {
    let cordon_core::Command::Argv(argv) = &lt.trivial.command else {
        return Ok(None);
    };
    let [name] = argv.as_slice() else {
        return Ok(None);
    };
    let n = plan.snippets;
    // The program by its path: the shell's own `true` is a builtin and would fork nothing.
    let script = |count: usize| {
        ExecRequest::argv([
            "sh".to_string(),
            "-c".to_string(),
            format!(
                "for p in /usr/bin/{name} /bin/{name}; do [ -x \"$p\" ] && break; done; \
                 i=0; while [ $i -lt {count} ]; do \"$p\" || exit 3; i=$((i+1)); done; \
                 echo \"$p\""
            ),
        ])
    };
    let (full, empty) = (script(n), script(0));
    let budget = Budget {
        max: plan.samples.max.min(5),
        min: plan.samples.min.min(3).min(plan.samples.max),
        budget: plan.samples.budget,
    };
    let timed = |sb: &mut dyn Sandbox, req: &ExecRequest| -> Result<(Duration, String)> {
        let t = Instant::now();
        let o = sb.exec(req, &mut |_: OutputStream, _: &[u8]| {})?;
        let el = t.elapsed();
        if !o.success() {
            bail!(
                "a shell loop of `{name}` did not succeed: {:?} {}",
                o.termination,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok((el, String::from_utf8_lossy(&o.stdout).trim().to_string()))
    };
    let mut sb = lt.backend.create(&lt.spec)?;
    let r = (|| {
        let (_, program) = timed(sb.as_mut(), &full)?;
        timed(sb.as_mut(), &empty)?;
        let v = budget.sample(|| {
            let (with, _) = timed(sb.as_mut(), &full)?;
            let (without, _) = timed(sb.as_mut(), &empty)?;
            Ok(with.saturating_sub(without) / n as u32)
        })?;
        Ok::<_, anyhow::Error>((program, v))
    })();
    let d = sb.destroy();
    let (program, v) = r?;
    d?;
    let per_exec = Stats::of(&v).context("no sample of the exec floor was taken")?;
    Ok(Some(ExecFloor {
        program,
        execs: n,
        per_exec,
    }))
}

pub(super) fn measure_exec(lt: &LiveTier, req: &ExecRequest, b: &Budget) -> Result<Vec<Duration>> {
    measure_snippets(lt, req, 1, b)
}

/// The pause before each sample of [`measure_after_pause`]: shorter than any agent's think
/// time, long enough for work a tier does between execs.
pub(super) const PAUSE: Duration = Duration::from_millis(20);

/// `req` in one live sandbox, each sample taken `pause` after the last answer (after two
/// unmeasured runs, so that a tier that prepares from the second exec on has).
pub(super) fn measure_after_pause(
    lt: &LiveTier,
    req: &ExecRequest,
    pause: Duration,
    b: &Budget,
) -> Result<Vec<Duration>> {
    measure_live(lt, req, 1, pause, b)
}

/// `n` execs of `req` back to back in one live sandbox, each sample their total.
pub(super) fn measure_snippets(
    lt: &LiveTier,
    req: &ExecRequest,
    n: usize,
    b: &Budget,
) -> Result<Vec<Duration>> {
    measure_live(lt, req, n, Duration::ZERO, b)
}

/// `n` execs of `req` back to back in one live sandbox, each sample their total, taken
/// `pause` after the last answer (after one unmeasured run, two with a pause).
pub(super) fn measure_live(
    lt: &LiveTier,
    req: &ExecRequest,
    n: usize,
    pause: Duration,
    b: &Budget,
) -> Result<Vec<Duration>> {
    let mut sb = lt.backend.create(&lt.spec)?;
    let r = (|| {
        exec_ok(sb.as_mut(), req)?;
        if !pause.is_zero() {
            exec_ok(sb.as_mut(), req)?;
        }
        b.sample(|| {
            std::thread::sleep(pause);
            let t = Instant::now();
            for _ in 0..n {
                exec_ok(sb.as_mut(), req)?;
            }
            Ok(t.elapsed())
        })
    })();
    let d = sb.destroy();
    let v = r?;
    d?;
    Ok(v)
}

pub(super) fn measure_agent(lt: &LiveTier, plan: &Plan) -> Result<Option<AgentRun>> {
    let (mut execs, mut runs) = (Vec::new(), Vec::new());
    for _ in 0..plan.agent_runs {
        let t0 = Instant::now();
        let mut sb = lt.backend.create(&lt.spec)?;
        let t1 = Instant::now();
        let r = (|| {
            for _ in 0..plan.snippets {
                exec_ok(sb.as_mut(), &lt.trivial)?;
            }
            Ok::<_, anyhow::Error>(())
        })();
        let t2 = Instant::now();
        let d = sb.destroy();
        let t3 = Instant::now();
        r?;
        d?;
        execs.push(t2 - t1);
        runs.push(t3 - t0);
    }
    Ok(match (Stats::of(&execs), Stats::of(&runs)) {
        (Some(e), Some(r)) => Some(AgentRun {
            snippets: plan.snippets,
            execs_total: e,
            per_run: r,
        }),
        _ => None,
    })
}

/// Cold starts (create + trivial exec + destroy) completed per second by `concurrency`
/// threads for a fixed window; a cycle begun before the window closes is counted and the
/// time it took too.
pub(super) fn measure_throughput(lt: &LiveTier, plan: &Plan) -> Result<Throughput> {
    let window = Duration::from_secs_f64(plan.throughput_window_s);
    let start = Instant::now();
    let deadline = start + window;
    let results: Vec<Result<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..plan.concurrency)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0;
                    while Instant::now() < deadline {
                        cycle(lt.backend.as_ref(), &lt.spec, &lt.trivial)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut completed = 0;
    for r in results {
        completed += r?;
    }
    Ok(Throughput {
        starts_per_sec: completed as f64 / elapsed.as_secs_f64().max(1e-9),
        concurrency: plan.concurrency,
        window_s: plan.throughput_window_s,
        completed,
    })
}

/// One live tier's measurements after start-up: warm and unprepared starts, exec and its
/// floor, each language, the agent run and throughput; a failure is kept in its report.
pub(super) fn tier(lt: &LiveTier, plan: &Plan, rep: &mut TierReport, out: &Out) {
    let tier = lt.spec.tier;
    out.step(format!("{tier}: warm (pool) start"));
    match measure_warm(lt, &plan.samples) {
        Ok(s) => rep.warm_start = Stats::of(&s),
        Err(e) => fail(rep, "warm start", &e, out),
    }
    out.done();
    match measure_unprepared(lt, &plan.samples) {
        Some(Ok(s)) => rep.unprepared_start = Stats::of(&s),
        Some(Err(e)) => fail(rep, "start without its snapshot", &e, out),
        None => {}
    }
    out.step(format!("{tier}: exec in a live sandbox"));
    match measure_exec(lt, &lt.trivial, &plan.samples) {
        Ok(s) => rep.exec = Stats::of(&s),
        Err(e) => fail(rep, "exec", &e, out),
    }
    match measure_floor(lt, plan) {
        Ok(f) => rep.exec_floor = f,
        Err(e) => fail(rep, "exec floor", &e, out),
    }
    out.done();
    for (language, snippet) in languages_of(tier) {
        out.step(format!("{tier}: {language} cold start and exec"));
        let req = ExecRequest::code(language, snippet);
        let cold = plan
            .samples
            .sample(|| {
                let t = Instant::now();
                cycle(lt.backend.as_ref(), &lt.spec, &req)?;
                Ok(t.elapsed())
            })
            .map(|v| Stats::of(&v));
        let figures = cold.and_then(|cold_start| {
            let exec = measure_exec(lt, &req, &plan.samples)?;
            let run = measure_snippets(lt, &req, plan.snippets, &plan.samples)?;
            let paused = measure_after_pause(lt, &req, PAUSE, &plan.samples)?;
            Ok(LanguageFigures {
                language,
                snippet: snippet.to_string(),
                cold_start,
                exec: Stats::of(&exec),
                run: Stats::of(&run),
                run_snippets: plan.snippets,
                exec_after_pause: Stats::of(&paused),
                pause_ms: PAUSE.as_millis() as u64,
            })
        });
        match figures {
            Ok(f) => rep.languages.push(f),
            Err(e) => fail(rep, &format!("{language} `{snippet}`"), &e, out),
        }
    }
    out.step(format!("{tier}: agent run of {} snippets", plan.snippets));
    match measure_agent(lt, plan) {
        Ok(a) => rep.agent_run = a,
        Err(e) => fail(rep, "agent run", &e, out),
    }
    out.done();
    out.step(format!(
        "{tier}: sandboxes started per second ({} at once)",
        plan.concurrency
    ));
    match measure_throughput(lt, plan) {
        Ok(t) => rep.throughput = Some(t),
        Err(e) => fail(rep, "throughput", &e, out),
    }
    out.done();
}
