//! A dispatch prefix for seccompiler's filters, so a syscall the policy never names is
//! allowed after a few comparisons instead of after one comparison per rule.
//!
//! Why: seccompiler lays a filter out as one comparison of the syscall number per rule, in
//! a row. When a filter is installed, the kernel runs it once for every syscall number to
//! find the ones it always allows (its action cache), so a long row costs at every sandbox
//! start: 0.14 ms of the 0.25 ms the 78-rule policy took to install here. The prefix is a
//! binary search over the numbers the filter names; those go on to seccompiler's own code,
//! unchanged, and every other number returns the filter's default action at once, as that
//! code would. x32 numbers (bit 30 set), which the row would not have matched by number at
//! all, are refused outright.
//!
//! This file is also compiled into build.rs (the shipped policy is laid out at build time),
//! so it uses nothing but std and seccompiler, which build.rs has too.

use seccompiler::sock_filter;

/// One instruction.
fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

const LD_W_ABS: u16 = 0x20;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGT_K: u16 = 0x25;
const JMP_JGE_K: u16 = 0x35;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const ALU_AND_K: u16 = 0x54;

/// `offsetof(struct seccomp_data, nr)` and `arch`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// Syscall numbers below this are searched; the rest go to seccompiler's code as before.
const SEARCHED: u32 = 1024;
/// x86-64's x32 ABI marks its syscall numbers with this bit.
const X32_BIT: u32 = 0x4000_0000;
/// `SECCOMP_RET_ERRNO | ENOSYS`: what an x32 call gets.
const RET_ENOSYS: u32 = 0x0005_0000 | 38;
/// The instructions seccompiler puts first: load the arch, compare it, refuse, load the nr.
const PROLOGUE: usize = 4;

/// The data a filter sees: `struct seccomp_data`.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub nr: u32,
    pub arch: u32,
    pub ip: u64,
    pub args: [u64; 6],
}

#[cfg(test)]
impl Call {
    fn word(&self, offset: u32) -> Option<u32> {
        let field = |v: u64, hi: bool| Some(if hi { (v >> 32) as u32 } else { v as u32 });
        match offset {
            NR => Some(self.nr),
            ARCH => Some(self.arch),
            8 | 12 => field(self.ip, offset == 12),
            16..=63 if offset.is_multiple_of(4) => {
                let i = ((offset - 16) / 8) as usize;
                field(self.args[i], (offset - 16) % 8 == 4)
            }
            _ => None,
        }
    }
}

/// Runs `prog` from instruction `pc` with accumulator `a`. Loads go through `load`; `None`
/// from it (or an instruction outside the subset seccompiler emits, or a jump out of the
/// program) stops the run with `None`.
fn run_from(
    prog: &[sock_filter],
    mut pc: usize,
    mut a: u32,
    load: &dyn Fn(u32) -> Option<u32>,
) -> Option<u32> {
    loop {
        let i = prog.get(pc)?;
        let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
        pc = match i.code {
            LD_W_ABS => {
                a = load(i.k)?;
                pc + 1
            }
            ALU_AND_K => {
                a &= i.k;
                pc + 1
            }
            JMP_JA => pc.checked_add(1)?.checked_add(i.k as usize)?,
            JMP_JEQ_K => jump(a == i.k),
            JMP_JGT_K => jump(a > i.k),
            JMP_JGE_K => jump(a >= i.k),
            JMP_JSET_K => jump(a & i.k != 0),
            RET_K => return Some(i.k),
            _ => return None,
        };
    }
}

/// What `prog` returns for `call`; `None` if it uses an instruction outside the subset.
#[cfg(test)]
pub fn run(prog: &[sock_filter], call: &Call) -> Option<u32> {
    run_from(prog, 0, 0, &|k| call.word(k))
}

/// `prog` with the dispatch prefix, or `None` when it does not have seccompiler's layout
/// or the prefix would not fit 8-bit jumps (then it is used as it is). No arch has native
/// syscall numbers with bit 30 set, so refusing them changes nothing but x32 on x86-64.
pub fn with_dispatch(prog: &[sock_filter]) -> Option<Vec<sock_filter>> {
    let starts_as_expected = prog.len() > PROLOGUE
        && prog[0] == insn(LD_W_ABS, 0, 0, ARCH)
        && prog[1].code == JMP_JEQ_K
        && (prog[1].jt, prog[1].jf) == (1, 0)
        && prog[2].code == RET_K
        && prog[3] == insn(LD_W_ABS, 0, 0, NR);
    if !starts_as_expected {
        return None;
    }
    let default = prog.last().filter(|i| i.code == RET_K)?.k;
    // The numbers the filter names: those whose outcome is not the default, or depends on
    // more than the number (the run loads an argument, or anything else).
    let named: Vec<u32> = (0..SEARCHED)
        .filter(|&nr| {
            let only_nr = |k: u32| (k == NR).then_some(nr);
            run_from(prog, PROLOGUE, nr, &only_nr) != Some(default)
        })
        .collect();
    let mut out: Vec<Pending> = vec![
        Pending::jump(JMP_JGE_K, X32_BIT, Target::X32, Target::Next),
        Pending::jump(JMP_JGE_K, SEARCHED, Target::Chain, Target::Next),
    ];
    search(&named, &mut out);
    let allow = PROLOGUE + out.len();
    let x32 = allow + 1;
    let chain = allow + 2;
    let mut result = prog[..PROLOGUE].to_vec();
    for (n, p) in out.iter().enumerate() {
        let at = PROLOGUE + n;
        let offset = |t: Target| -> Option<u8> {
            let to = match t {
                Target::Next => at + 1,
                Target::At(i) => PROLOGUE + i,
                Target::Chain => chain,
                Target::Allow => allow,
                Target::X32 => x32,
            };
            u8::try_from(to.checked_sub(at + 1)?).ok()
        };
        result.push(insn(p.code, offset(p.jt)?, offset(p.jf)?, p.k));
    }
    result.push(insn(RET_K, 0, 0, default));
    result.push(insn(RET_K, 0, 0, RET_ENOSYS));
    result.extend_from_slice(&prog[PROLOGUE..]);
    Some(result)
}

#[derive(Clone, Copy)]
enum Target {
    Next,
    /// An instruction of the prefix, by its index in it.
    At(usize),
    /// seccompiler's code after its prologue.
    Chain,
    /// The filter's default action.
    Allow,
    X32,
}

struct Pending {
    code: u16,
    k: u32,
    jt: Target,
    jf: Target,
}

impl Pending {
    fn jump(code: u16, k: u32, jt: Target, jf: Target) -> Self {
        Self { code, k, jt, jf }
    }
}

/// A binary search over the sorted `named`: a number in it goes to the chain, any other to
/// the default action.
fn search(named: &[u32], out: &mut Vec<Pending>) {
    if named.len() <= 3 {
        if named.is_empty() {
            out.push(Pending::jump(JMP_JEQ_K, 0, Target::Allow, Target::Allow));
            return;
        }
        for (i, &nr) in named.iter().enumerate() {
            let miss = if i + 1 == named.len() {
                Target::Allow
            } else {
                Target::Next
            };
            out.push(Pending::jump(JMP_JEQ_K, nr, Target::Chain, miss));
        }
        return;
    }
    let mid = named.len() / 2;
    let node = out.len();
    out.push(Pending::jump(
        JMP_JGE_K,
        named[mid],
        Target::Next,
        Target::Next,
    ));
    search(&named[..mid], out);
    out[node].jt = Target::At(out.len());
    search(&named[mid..], out);
}
