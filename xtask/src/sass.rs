//! `cargo xtask sass`: the SASS of chosen kernels, and the instructions one call executes on its fast path.
//!
//! The cubin that ptxas made of the PTX (sm_90) is disassembled twice: `cuobjdump -sass` writes the listing a
//! person reads (`target/sass/<kernel>.sass`), and `nvdisasm -c` gives the same instructions with labels and
//! the boundaries of the functions ptxas kept as calls, which this module parses. Both must count the same
//! number of instructions, or the task fails.
//!
//! # The fast path
//! The fast path of a kernel for `k` MMIO stores is the path from the kernel's entry to `EXIT` that executes
//! the fewest instructions among those that execute exactly `k` MMIO stores (`STG.E.64.MMIO.SYS`, the SASS of
//! `st.mmio.relaxed.sys.global.u64`: the doorbell is 1, a BlueFlame write of one WQEBB is 8) and no poll.
//! The search:
//! 1. Inlines every `CALL.REL` (one copy of the callee per call site, `RET` back to the call's successor), so
//!    the kernel is one graph of instructions. Edges: fall-through; a `BRA`'s target (and its fall-through when
//!    guarded); `EXIT` ends the path (guarded: may end it); `BPT.TRAP` ends nothing, so panics drop out. An
//!    indirect branch that nvdisasm annotates with its `BRANCH_TARGETS` (a jump table) goes to each of them;
//!    other indirect branches and recursion are refused.
//! 2. Cuts the back edges of a depth-first search from the entry (each loop of the reducible graphs that
//!    structured Rust gives has one): a path runs a loop body at most once, so it never waits or retries.
//! 3. Forbids polls: a load with `.STRONG.SYS` (a volatile or acquire load of memory the NIC writes: a CQE, a
//!    semaphore) is not on a fast path. "The SQ has room" is what this means: the CQ is not read.
//! 4. Follows known values (A* search over instruction, MMIO stores left, bytes of other stores made up to
//!    the kernel's [`store_floor`] and known values, with the branch-blind shortest distance of step 2 as the
//!    admissible estimate): constants set by `MOV`, `IMAD.MOV`, `CS2R`, `SEL`, `LOP3.LUT`, `PLOP3.LUT` and
//!    `ISETP` (32-bit and `.EX` 64-bit pairs) of known operands, and words stored to the stack with `STL` and
//!    read back with `LDL`, decide guarded branches and `EXIT`s. Without this, the shortest path takes an
//!    error arm that sets an error code and then the "success" arm of the test of that code after the two arms
//!    join (rustc's `Result` and `?` compile to exactly that), a path no run takes. Anything an unrecognised
//!    instruction may write is forgotten (its first operand with the three registers after it, predicate
//!    results, every stack word at a store through a generic address), so a value is known only when it is.
//!    An instruction guarded by a predicate whose value is unknown splits the search in two, the predicate
//!    false and true, each then known: both are runs, and the other arm of an if-converted diamond
//!    (`@P0 MOV R, c` then `@!P0 MOV R, c`) or a later branch on the same predicate follows the same outcome.
//! 5. Reads the kernel as one thread, the only active lane of a converged warp, lane 0, as the `gdaki_sass_*`
//!    kernels are called: a `BRA.DIV` (to the loop a divergent warp runs for a warp-wide instruction) is not
//!    taken, a `SHFL.IDX` gives back the lane's own value, so that a result a warp leader shares (a
//!    `Result` broadcast word by word) stays known and its error arm is not taken for the shortest path, and
//!    `S2R SR_LANEID` is 0 and `VOTE.ANY` and `MATCH.ANY` give the mask of lane 0 alone, so that the lane is
//!    its warp's leader (with `R2UR`, `IMAD.U32`, `IADD3`/`UIADD3`, `VIADD`, `ULOP3.LUT`, `POPC`/`UPOPC` and
//!    `UISETP` of known operands followed too): the path then makes the leader's reservation, as one lane
//!    posting does.
//!
//! Every instruction on the path counts once, guarded ones too (they are issued whatever the guard).
//!
//! Assumptions, to be checked on each listing (`target/sass/<kernel>.path-<k>.sass`, one instruction a line,
//! function changes marked): (a) what the search does not know can still combine branch outcomes that no run
//! combines (two tests of one loaded value), so a path that stores no WQE, or skips a check the source always
//! makes, is wrong and its count with it; the `stores` column (ring stores, counters, dbrec) is there to
//! make that visible, and for the `gdaki_sass_*` kernels the search takes only paths that store at least the
//! kernel's WQEs ([`store_floor`]); (b) optional work that a real run sometimes does (a CQE requested every
//! quarter ring or waiting for room) is left out: the path is the common run; (c) the kernel's own preamble
//! (parameters, stack frame, the call) is included, and work that thread 0 does once per kernel behind a
//! `tid == 0` test is not, because the `tid != 0` arm is shorter.
//!
//! Besides instructions, the table counts on the path: fences (`MEMBAR`, each the head of a `fence.*`'s
//! sequence `MEMBAR; ERRBAR; CGAERRBAR; CCTL.IVALL`), MMIO stores, loads from global memory through generic or
//! global addresses (`LD`, `LDG`; which of them read host-mapped memory depends on where the host put the
//! handles; the ordered ones, `.STRONG.SYS`, are always memory the NIC writes and are 0 by step 3), other
//! stores, and local-memory (stack) accesses (`LDL`, `STL`).
//!
//! # Posting loops
//! A benchmark's or a user's kernel posts in a loop; its speed depends on the loop keeping its state (the QP's
//! counters, the loop's own) in registers. [`posting_loops`] lists, per function, each loop (a branch back to
//! an earlier label of the same function) whose body holds an MMIO store, and each loop nested in one that
//! stores 16-byte segments (the posts of a batch whose doorbell comes after them), with its instructions and its local-memory accesses,
//! counted over the body's address range (slow paths laid out inside it included).
//! A loop that spilled shows tens of `LDL`/`STL` where one in registers shows a few on its slow paths:
//! `--max-loop-local` turns that into a failure, for CI, which has no GPU to time the loop on. It checks the
//! innermost posting loops ([`is_innermost`]): a loop around one (a benchmark's rounds around its inlined burst)
//! runs once per burst, and what it keeps on the stack costs once per burst, not per post. Loops of the
//! device crate's out-of-line slow paths (`qp::out_of_line`) are listed and marked, not checked.
//!
//! Each loop's fast iteration ([`loop_iteration`]) is counted as the fast path is, from the loop's first
//! instruction to its branch back, taken, with no MMIO store (a post whose doorbell comes later), one
//! (a doorbell) or eight (BlueFlame), and written to `target/sass/<kernel>.loop-<start>.path-<k>.sass`: what
//! one more post costs once the loop's state is in registers, the per-post figure `ncu` measures. Nothing is
//! known at the loop's start, so a branch on state carried from the previous iteration may go either way (a
//! "range" that is only a branch back to an earlier label, not a loop, shows no iteration).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::Result;

/// Kernels analysed when none are named: the ones that exist to be read as SASS.
pub const DEFAULT_PREFIX: &str = "gdaki_sass_";

/// MMIO stores of one doorbell (8 bytes to the UAR).
pub const DOORBELL_STORES: u32 = 1;

/// MMIO stores of one BlueFlame write (one 64-byte WQEBB as eight 8-byte stores).
pub const BLUE_FLAME_STORES: u32 = 8;

/// One SASS instruction as nvdisasm prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    /// Byte offset in the kernel's section.
    pub addr: u32,
    /// The guard predicate (`@P0`, `@!UP1`), if any.
    pub guard: Option<String>,
    /// Opcode with its modifiers (`ST.E.64.STRONG.SYS`).
    pub op: String,
    /// The instruction as printed, guard included, without the final ` ;`.
    pub text: String,
    /// Label or function named by a branch or call (`` `(.L_x_3) ``).
    pub target: Option<String>,
}

impl Insn {
    /// The opcode without modifiers (`ST`).
    pub fn base(&self) -> &str {
        self.op.split('.').next().unwrap_or_default()
    }

    /// Executes whatever the predicates hold.
    fn unconditional(&self) -> bool {
        matches!(self.guard.as_deref(), None | Some("@PT") | Some("@UPT"))
    }

    /// Never executes.
    fn never(&self) -> bool {
        matches!(self.guard.as_deref(), Some("@!PT") | Some("@!UPT"))
    }

    /// Bytes a store to global memory writes (`ST`/`STG`, MMIO ones excluded: the ring, counters, the dbrec),
    /// by its width suffix (`.128`, `.64`, `.U16`, `.U8`; none: 4); 0 for any other instruction.
    pub fn stored_bytes(&self) -> u32 {
        if !matches!(self.base(), "ST" | "STG") || self.is_mmio() {
            return 0;
        }
        let has = |w: &str| self.op.split('.').any(|m| m == w);
        match () {
            _ if has("128") => 16,
            _ if has("64") => 8,
            _ if has("U16") || has("S16") => 2,
            _ if has("U8") || has("S8") => 1,
            _ => 4,
        }
    }

    /// An MMIO store (`st.mmio`): a doorbell word or a BlueFlame word.
    pub fn is_mmio(&self) -> bool {
        self.base().starts_with("ST") && self.op.contains(".MMIO")
    }

    /// A memory fence (`fence.*`/`membar.*` become `MEMBAR` plus barrier instructions).
    pub fn is_fence(&self) -> bool {
        matches!(self.base(), "MEMBAR" | "FENCE")
    }

    /// A load from global memory through a generic or global address.
    pub fn is_global_load(&self) -> bool {
        matches!(self.base(), "LD" | "LDG")
    }

    /// A volatile or acquire load at system scope (memory the NIC or a peer writes).
    pub fn is_ordered_load(&self) -> bool {
        self.is_global_load() && self.op.contains(".STRONG.SYS")
    }

    /// A local-memory (stack) access.
    pub fn is_local(&self) -> bool {
        matches!(self.base(), "LDL" | "STL")
    }
}

/// One function of a kernel's section: the kernel itself or a function ptxas kept as a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Function {
    /// Symbol name (nvdisasm prefixes callees with `$<kernel>$`).
    pub name: String,
    /// Its instructions in address order.
    pub insns: Vec<Insn>,
    /// Labels defined in it: label → index into `insns`.
    pub labels: HashMap<String, usize>,
}

/// A kernel's section: the kernel (first) and its callees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    /// Kernel name.
    pub kernel: String,
    /// Whether nvdisasm marks it as an entry (`STO_CUDA_ENTRY`).
    pub entry: bool,
    /// Functions in address order; `functions[0]` is the kernel.
    pub functions: Vec<Function>,
}

impl Section {
    /// Instructions of the section, NOP padding excluded.
    pub fn static_count(&self) -> usize {
        self.functions.iter().flat_map(|f| &f.insns).filter(|i| i.base() != "NOP").count()
    }

    /// Instructions of the section, NOPs included (what `cuobjdump -sass` lists).
    pub fn total_count(&self) -> usize {
        self.functions.iter().map(|f| f.insns.len()).sum()
    }
}

/// Parses `nvdisasm -c` output into one [`Section`] per `.text.<kernel>` section.
///
/// # Errors
/// An instruction line that cannot be read, or an instruction outside a function.
pub fn parse_nvdisasm(text: &str) -> Result<Vec<Section>> {
    let mut sections: Vec<Section> = Vec::new();
    let mut declared: Vec<String> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(".section") {
            let name = rest.trim().split(',').next().unwrap_or_default();
            if let Some(kernel) = name.strip_prefix(".text.") {
                sections.push(Section { kernel: kernel.to_string(), ..Section::default() });
            }
            declared.clear();
            pending.clear();
        } else if let Some(rest) = t.strip_prefix(".type") {
            if let Some(name) = rest.trim().strip_suffix(",@function") {
                declared.push(name.trim().to_string());
            }
        } else if let Some(rest) = t.strip_prefix(".other") {
            if let (Some(s), Some(name)) = (sections.last_mut(), rest.trim().split(',').next()) {
                if name == s.kernel && rest.contains("STO_CUDA_ENTRY") {
                    s.entry = true;
                }
            }
        } else if let Some(label) = t.strip_suffix(':').filter(|l| !l.contains(char::is_whitespace)) {
            let Some(s) = sections.last_mut() else { continue };
            if declared.iter().any(|d| d == label) {
                s.functions.push(Function { name: label.to_string(), ..Function::default() });
            } else {
                pending.push(label.to_string());
            }
        } else if t.starts_with("/*") {
            let insn = parse_insn(t).with_context(|| format!("nvdisasm line {}: {t}", n + 1))?;
            let Some(f) = sections.last_mut().and_then(|s| s.functions.last_mut()) else {
                bail!("nvdisasm line {}: an instruction outside any function", n + 1);
            };
            for label in pending.drain(..) {
                f.labels.insert(label, f.insns.len());
            }
            f.insns.push(insn);
        }
    }
    Ok(sections)
}

/// Reads `/*0110*/ @P0 BRA `(.L_x_3) ;`.
fn parse_insn(line: &str) -> Result<Insn> {
    let rest = line.strip_prefix("/*").context("no address")?;
    let (addr, rest) = rest.split_once("*/").context("no address")?;
    let addr = u32::from_str_radix(addr.trim(), 16).context("bad address")?;
    let body = rest.trim().trim_end_matches(';').trim_end();
    let mut words = body.split_whitespace();
    let first = words.next().context("no opcode")?;
    let (guard, op) = match first.strip_prefix('@') {
        Some(_) => (Some(first.to_string()), words.next().context("no opcode after the guard")?),
        None => (None, first),
    };
    let target = body.split_once("`(").and_then(|(_, r)| r.split_once(')')).map(|(t, _)| t.to_string());
    Ok(Insn { addr, guard, op: op.to_string(), text: body.to_string(), target })
}

/// The instructions a fast path executes, in order: (function index, instruction index).
pub type Trace = Vec<(usize, usize)>;

/// What a fast path executes, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instructions.
    pub instructions: usize,
    /// Fences (`MEMBAR`).
    pub fences: usize,
    /// MMIO stores.
    pub mmio: usize,
    /// Loads from global memory (generic or global addresses).
    pub loads: usize,
    /// Of `loads`, the volatile/acquire ones at system scope.
    pub ordered_loads: usize,
    /// Stores other than MMIO and local ones: the WQE to the ring, the dbrec, counters.
    pub stores: usize,
    /// Local-memory loads and stores.
    pub local: usize,
}

/// Counts the instructions of `path` by kind.
pub fn count(section: &Section, path: &Trace) -> Counts {
    let mut c = Counts::default();
    for &(f, i) in path {
        let insn = &section.functions[f].insns[i];
        c.instructions += 1;
        c.fences += usize::from(insn.is_fence());
        c.mmio += usize::from(insn.is_mmio());
        c.loads += usize::from(insn.is_global_load());
        c.ordered_loads += usize::from(insn.is_ordered_load());
        c.stores += usize::from(matches!(insn.base(), "ST" | "STG" | "STS") && !insn.is_mmio());
        c.local += usize::from(insn.is_local());
    }
    c
}

const INF: u64 = u64::MAX / 4;

/// Flat nodes (instruction copies) the search may create: a bound on inlining, far above what the kernels need.
const MAX_NODES: usize = 1 << 21;

/// States the path-sensitive search may expand before it gives up.
const MAX_STATES: usize = 1 << 22;

/// How an edge leaves a node: always, when the node's guard holds (a branch taken, a `RET`), or when it does
/// not (the fall-through of a guarded branch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    Always,
    Taken,
    Fall,
}

/// The kernel with every call inlined: one node per instruction per call site.
struct Flat {
    /// (function, instruction) of each node.
    at: Vec<(usize, usize)>,
    /// Successors, back edges removed.
    succ: Vec<Vec<(usize, Edge)>>,
    /// Whether the node can end the kernel (`EXIT`), and when.
    end: Vec<Option<Edge>>,
}

impl Flat {
    /// Inlines `section` from its kernel and cuts the back edges of a depth-first search from the entry.
    fn new(section: &Section) -> Result<Flat> {
        let mut flat = Flat { at: Vec::new(), succ: Vec::new(), end: Vec::new() };
        flat.inline(section, 0, None, &mut Vec::new())?;
        flat.cut_back_edges();
        Ok(flat)
    }

    /// Adds a copy of function `f` returning to node `ret`; returns its entry node.
    fn inline(&mut self, section: &Section, f: usize, ret: Option<usize>, calls: &mut Vec<usize>) -> Result<usize> {
        if calls.contains(&f) {
            bail!("recursion through {}: not modelled", section.functions[f].name);
        }
        let func = &section.functions[f];
        let base = self.at.len();
        if base + func.insns.len() > MAX_NODES {
            bail!("more than {MAX_NODES} instructions once calls are inlined");
        }
        self.at.extend((0..func.insns.len()).map(|i| (f, i)));
        self.succ.resize(self.at.len(), Vec::new());
        self.end.resize(self.at.len(), None);
        calls.push(f);
        for (i, insn) in func.insns.iter().enumerate() {
            let node = base + i;
            let next = (i + 1 < func.insns.len()).then_some(node + 1);
            let guarded = !insn.unconditional();
            let fall = next.filter(|_| guarded).map(|n| (n, Edge::Fall));
            let taken = if guarded { Edge::Taken } else { Edge::Always };
            let at = || format!("{:#06x} in {}", insn.addr, func.name);
            let succ: Vec<(usize, Edge)> = match insn.base() {
                _ if insn.never() => next.map(|n| (n, Edge::Always)).into_iter().collect(),
                // `BRA.DIV` goes to the code a divergent warp runs for a warp-wide instruction (a shuffle's
                // `WARPSYNC.COLLECTIVE` loop); the kernels are read as one converged warp, which never takes it.
                "BRA" if insn.op.starts_with("BRA.DIV") => next.map(|n| (n, Edge::Always)).into_iter().collect(),
                "BRA" => {
                    let label =
                        insn.target.as_deref().with_context(|| format!("{}: a branch without a target", at()))?;
                    let to = *func.labels.get(label).with_context(|| format!("{}: no label {label}", at()))?;
                    std::iter::once((base + to, taken)).chain(fall).collect()
                }
                "EXIT" => {
                    self.end[node] = Some(taken);
                    fall.into_iter().collect()
                }
                "RET" => ret.map(|r| (r, taken)).into_iter().chain(fall).collect(),
                "BPT" | "KILL" => fall.into_iter().collect(),
                // A jump table (a `match` ptxas lowered to one) lists its targets: each is a successor.
                "BRX" | "JMX" if insn.text.contains("BRANCH_TARGETS") => {
                    let list = insn.text.split("BRANCH_TARGETS").nth(1).unwrap_or_default();
                    let labels =
                        list.split(|c: char| c == ',' || c == '"' || c == '*' || c == ')' || c.is_whitespace());
                    let mut succ = Vec::new();
                    for label in labels.filter(|l| !l.is_empty()) {
                        let to = *func.labels.get(label).with_context(|| format!("{}: no label {label}", at()))?;
                        succ.push((base + to, Edge::Taken));
                    }
                    if succ.is_empty() {
                        bail!("{}: indirect branch `{}` lists no target", at(), insn.text);
                    }
                    succ.extend(fall);
                    succ
                }
                "BRX" | "JMX" | "JMP" | "RTT" => bail!("{}: indirect branch `{}` cannot be followed", at(), insn.text),
                "CALL" => {
                    let name = insn.target.as_deref().unwrap_or_default();
                    let g = match section.functions.iter().position(|g| g.name == name) {
                        Some(g) if insn.op.starts_with("CALL.REL") && !guarded => g,
                        _ => bail!("{}: call `{}` cannot be followed", at(), insn.text),
                    };
                    let entry = self.inline(section, g, next, calls)?;
                    vec![(entry, Edge::Always)]
                }
                _ => next.map(|n| (n, Edge::Always)).into_iter().collect(),
            };
            self.succ[node] = succ;
        }
        calls.pop();
        Ok(base)
    }

    /// Removes the edges to nodes on the depth-first search's stack: every loop of a reducible graph loses its
    /// back edge, and what is left is acyclic.
    fn cut_back_edges(&mut self) {
        let n = self.at.len();
        let mut on_stack = vec![false; n];
        let mut seen = vec![false; n];
        let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
        seen[0] = true;
        on_stack[0] = true;
        while let Some((node, visited)) = stack.last_mut() {
            let node = *node;
            match self.succ[node].get(*visited).copied() {
                Some((s, _)) if on_stack[s] => {
                    self.succ[node].remove(*visited);
                }
                Some((s, _)) => {
                    *visited += 1;
                    if !seen[s] {
                        seen[s] = true;
                        on_stack[s] = true;
                        stack.push((s, 0));
                    }
                }
                None => {
                    on_stack[node] = false;
                    stack.pop();
                }
            }
        }
    }

    /// For every node and every number of MMIO stores left (0 ..= max): the fewest instructions to a node
    /// for which `ends` holds (`EXIT` for [`fast_path`], a loop's branch back for [`loop_iteration`]),
    /// ignoring what the branches test (a lower bound for the search). Nodes that poll (ordered loads) are
    /// excluded.
    fn bounds(&self, section: &Section, max: u32, ends: &dyn Fn(usize) -> bool) -> Vec<Vec<u64>> {
        let n = self.at.len();
        let mut cost = vec![vec![INF; max as usize + 1]; n];
        // The graph is acyclic now; a post-order of a depth-first search visits successors first.
        let mut order = Vec::with_capacity(n);
        let mut seen = vec![false; n];
        let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
        seen[0] = true;
        while let Some((node, visited)) = stack.last_mut() {
            let node = *node;
            if let Some(&(s, _)) = self.succ[node].get(*visited) {
                *visited += 1;
                if !seen[s] {
                    seen[s] = true;
                    stack.push((s, 0));
                }
            } else {
                order.push(node);
                stack.pop();
            }
        }
        for node in order {
            let insn = self.insn(section, node);
            if insn.is_ordered_load() {
                continue;
            }
            let own = u32::from(insn.is_mmio());
            for k in own..=max {
                let rest = (k - own) as usize;
                let mut best = if ends(node) && rest == 0 { 0 } else { INF };
                for &(s, _) in &self.succ[node] {
                    best = best.min(cost[s][rest]);
                }
                if best < INF {
                    cost[node][k as usize] = best + 1;
                }
            }
        }
        cost
    }

    fn insn<'s>(&self, section: &'s Section, node: usize) -> &'s Insn {
        let (f, i) = self.at[node];
        &section.functions[f].insns[i]
    }
}

/// Register, predicate and stack-word values known on a path: set by a recognised instruction (`MOV`,
/// `IMAD.MOV`, `CS2R`, `SEL`, `LOP3.LUT`, `PLOP3.LUT`, `ISETP` of known operands, `STL`/`LDL`) and forgotten
/// when any other instruction may write them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Known(std::collections::BTreeMap<String, u32>);

impl Known {
    /// The value of operand `op`: `RZ`/`PT`, a known register or predicate, or an immediate.
    fn value(&self, op: &str) -> Option<u32> {
        if let Some(p) = op.strip_prefix('!') {
            return self.value(p).map(|v| u32::from(v == 0));
        }
        match op {
            "RZ" | "URZ" => Some(0),
            "PT" | "UPT" => Some(1),
            _ if op.starts_with("0x") => u32::from_str_radix(&op[2..], 16).ok(),
            _ if op.starts_with("-0x") => u32::from_str_radix(&op[3..], 16).ok().map(|v| v.wrapping_neg()),
            _ => self.0.get(op).copied(),
        }
    }

    /// The guard of `insn`: `Some(true)` when it executes, `Some(false)` when not, `None` when unknown.
    fn guard(&self, insn: &Insn) -> Option<bool> {
        let Some(g) = insn.guard.as_deref() else { return Some(true) };
        self.value(g.trim_start_matches('@')).map(|v| v != 0)
    }

    /// For an instruction guarded by a predicate whose value is unknown: the two states in which it is known,
    /// false and true. `None` when the guard is known (or there is none).
    fn assume_guard(&self, insn: &Insn) -> Option<[Known; 2]> {
        if self.guard(insn).is_some() {
            return None;
        }
        let p = insn.guard.as_deref()?.trim_start_matches('@').trim_start_matches('!');
        Some([0, 1].map(|v| {
            let mut k = self.clone();
            k.0.insert(p.to_string(), v);
            k
        }))
    }

    /// The state after `insn`.
    fn step(&self, insn: &Insn) -> Known {
        let mut next = self.clone();
        let ops = operands(insn);
        let executes = self.guard(insn);
        if executes != Some(false) {
            next.step_memory(insn, &ops, executes == Some(true));
        }
        let recognised = match executes {
            Some(false) => return next,
            Some(true) => self.exact(insn, &ops),
            None => None,
        };
        let Some(writes) = recognised else {
            for d in destinations(insn, &ops) {
                next.0.remove(&d);
            }
            if ops.iter().any(|o| o == "PR" || o == "UPR") {
                next.0.retain(|name, _| !name.starts_with('P') && !name.starts_with("UP"));
            }
            return next;
        };
        for (name, v) in writes {
            match v {
                Some(v) => next.0.insert(name, v),
                None => next.0.remove(&name),
            };
        }
        next
    }

    /// Local memory (the stack, `[R1+offset]`, 32-bit words kept as `L<offset>`): `STL` of known registers
    /// sets words, `LDL` reads them. Forgotten: every word at a store elsewhere in the stack, a store through a
    /// generic address (it may point into the stack), or a change of `R1`.
    fn step_memory(&mut self, insn: &Insn, ops: &[String], surely: bool) {
        let base = insn.base();
        let stack_slot = || {
            let inner = insn.text.split_once('[')?.1.split_once(']')?.0;
            let offset = match inner.split_once('+') {
                Some(("R1", off)) => u32::from_str_radix(off.trim().strip_prefix("0x")?, 16).ok()?,
                None if inner == "R1" => 0,
                _ => return None,
            };
            Some(offset)
        };
        let words = if insn.op.contains(".128") {
            4
        } else if insn.op.contains(".64") {
            2
        } else if [".U8", ".S8", ".U16", ".S16"].iter().any(|w| insn.op.contains(w)) {
            0
        } else {
            1
        };
        let forget_stack = |known: &mut Known| known.0.retain(|name, _| !name.starts_with('L'));
        match base {
            "STL" => match stack_slot() {
                Some(off) => {
                    let src = ops.last().map(String::as_str).unwrap_or_default();
                    for w in 0..words.max(1) {
                        let key = format!("L{}", (off & !3) + 4 * w);
                        let value = match (surely && words > 0, src) {
                            (true, "RZ") => Some(0),
                            (true, r) => r
                                .strip_prefix('R')
                                .and_then(|n| n.parse::<u32>().ok())
                                .and_then(|n| self.value(&format!("R{}", n + w))),
                            _ => None,
                        };
                        match value {
                            Some(v) => self.0.insert(key, v),
                            None => self.0.remove(&key),
                        };
                    }
                }
                None => forget_stack(self),
            },
            "ST" | "STG" | "ATOM" | "ATOMG" | "RED" => forget_stack(self),
            _ => {}
        }
        if ops.first().is_some_and(|d| d == "R1") && !matches!(base, "ST" | "STG" | "STL" | "STS") {
            forget_stack(self);
        }
    }

    /// Everything a recognised instruction writes, with the values known (`None` when `insn` is not one, or its
    /// result cannot be known: then [`destinations`] are forgotten).
    fn exact(&self, insn: &Insn, ops: &[String]) -> Option<Vec<(String, Option<u32>)>> {
        let reg = |o: &String| {
            let n = o.strip_prefix("UR").or_else(|| o.strip_prefix('R'));
            n.is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        };
        let known = |o: &String| self.value(o);
        match (insn.op.as_str(), ops) {
            ("MOV" | "R2UR", [d, s]) | ("IMAD.MOV.U32" | "IMAD.MOV" | "IMAD.U32", [d, _, _, s]) if reg(d) => {
                if !matches!(insn.op.as_str(), "MOV" | "R2UR") && (ops[1] != "RZ" || ops[2] != "RZ") {
                    return None;
                }
                Some(vec![(d.clone(), known(s))])
            }
            // One active lane, lane 0 (see the module docs): its lane id, the active mask and the lanes that
            // match its value are lane 0 alone.
            ("S2R", [d, s]) if reg(d) && s == "SR_LANEID" => Some(vec![(d.clone(), Some(0))]),
            ("VOTE.ANY", [d, _, _]) if reg(d) => Some(vec![(d.clone(), Some(1))]),
            (op, [d, _]) if op.starts_with("MATCH.ANY") && reg(d) => Some(vec![(d.clone(), Some(1))]),
            ("POPC" | "UPOPC", [d, a]) if reg(d) => Some(vec![(d.clone(), Some(known(a)?.count_ones()))]),
            ("IADD3" | "UIADD3", [d, a, b, c]) if reg(d) => {
                Some(vec![(d.clone(), Some(known(a)?.wrapping_add(known(b)?).wrapping_add(known(c)?)))])
            }
            ("VIADD", [d, a, b]) if reg(d) => Some(vec![(d.clone(), Some(known(a)?.wrapping_add(known(b)?)))]),
            // One active lane (see the module docs): a shuffle gives back the lane's own value.
            ("SHFL.IDX", [p, d, s, _, _]) if reg(d) => {
                let mut out = vec![(d.clone(), known(s))];
                if p != "PT" {
                    out.push((p.clone(), None));
                }
                Some(out)
            }
            ("CS2R", [d, s]) if reg(d) && s == "SRZ" => {
                let n: u32 = d[1..].parse().ok()?;
                Some(vec![(d.clone(), Some(0)), (format!("R{}", n + 1), Some(0))])
            }
            (op, [d, _]) if op.starts_with("LDL") && reg(d) => {
                let words = if op.contains(".128") {
                    4
                } else if op.contains(".64") {
                    2
                } else {
                    1
                };
                if [".U8", ".S8", ".U16", ".S16"].iter().any(|w| op.contains(w)) {
                    return None;
                }
                let inner = insn.text.split_once('[')?.1.split_once(']')?.0;
                let off = match inner.split_once('+') {
                    Some(("R1", off)) => u32::from_str_radix(off.trim().strip_prefix("0x")?, 16).ok()?,
                    None if inner == "R1" => 0,
                    _ => return None,
                };
                let n: u32 = d[1..].parse().ok()?;
                Some(
                    (0..words)
                        .map(|w| (format!("R{}", n + w), self.0.get(&format!("L{}", off + 4 * w)).copied()))
                        .collect(),
                )
            }
            ("PLOP3.LUT", [p, q, a, b, c, lut, lut2]) => {
                let index = 4 * known(a)? + 2 * known(b)? + known(c)?;
                let mut out = vec![(p.clone(), Some((known(lut)? >> index) & 1))];
                if q != "PT" {
                    out.push((q.clone(), Some((known(lut2)? >> index) & 1)));
                }
                Some(out)
            }
            ("SEL", [d, a, b, p]) if reg(d) => {
                let chosen = if known(p)? != 0 { a } else { b };
                Some(vec![(d.clone(), known(chosen))])
            }
            ("LOP3.LUT" | "ULOP3.LUT", [d, a, b, c, lut, q]) if reg(d) && (q == "!PT" || q == "!UPT") => {
                Some(vec![(d.clone(), Some(lop3(known(a)?, known(b)?, known(c)?, known(lut)?)))])
            }
            ("LOP3.LUT", [p, d, a, b, c, lut, q]) if p.starts_with('P') && q == "!PT" => {
                let r = lop3(known(a)?, known(b)?, known(c)?, known(lut)?);
                let mut out = vec![(p.clone(), Some(u32::from(r != 0)))];
                if reg(d) {
                    out.push((d.clone(), Some(r)));
                }
                Some(out)
            }
            (op, [p, q, a, b, c, low @ ..])
                if (op.starts_with("ISETP.") && q == "PT" || op.starts_with("UISETP.") && q == "UPT")
                    && low.len() <= 1 =>
            {
                let mut parts: Vec<&str> = op.split('.').skip(1).collect();
                let ex = parts.last() == Some(&"EX");
                if ex {
                    parts.pop();
                }
                let (cmp, unsigned, combine) = match parts.as_slice() {
                    [cmp, "U32", combine] => (*cmp, true, *combine),
                    [cmp, combine] => (*cmp, false, *combine),
                    _ => return None,
                };
                let (x, y) = (known(a)?, known(b)?);
                let ord = if unsigned { x.cmp(&y) } else { (x as i32).cmp(&(y as i32)) };
                let strict = match cmp {
                    "EQ" => ord.is_eq(),
                    "NE" => ord.is_ne(),
                    "LT" => ord.is_lt(),
                    "LE" => ord.is_le(),
                    "GT" => ord.is_gt(),
                    "GE" => ord.is_ge(),
                    _ => return None,
                };
                // `.EX` compares the high words of a 64-bit pair: the low words' result (the last operand)
                // decides when the high words are equal (EQ: both equal; NE: either differs).
                let holds = match (ex, low) {
                    (false, []) => strict,
                    (true, [low]) => {
                        let low = known(low)? != 0;
                        match cmp {
                            "EQ" => ord.is_eq() && low,
                            "NE" => ord.is_ne() || low,
                            _ => (ord.is_ne() && strict) || (ord.is_eq() && low),
                        }
                    }
                    _ => return None,
                };
                let c = known(c)? != 0;
                let value = match combine {
                    "AND" => holds && c,
                    "OR" => holds || c,
                    "XOR" => holds != c,
                    _ => return None,
                };
                Some(vec![(p.clone(), Some(u32::from(value)))])
            }
            _ => None,
        }
    }
}

/// `LOP3.LUT`: bit by bit, the bit of `lut` at index 4a + 2b + c.
fn lop3(a: u32, b: u32, c: u32, lut: u32) -> u32 {
    (0..32).fold(0, |r, i| {
        let index = ((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1);
        r | (((lut >> index) & 1) << i)
    })
}

/// The operands of `insn`, each reduced to its register, predicate or immediate with its prefix (`R2.reuse` →
/// `R2`, `-R33`, `!P0`, `-0x1`; an address `desc[UR8][R2.64]` → `desc`). [`Known::value`] knows `!` and a
/// negative immediate, and no other prefixed operand.
fn operands(insn: &Insn) -> Vec<String> {
    let body = insn.text.trim_start();
    let body = if insn.guard.is_some() {
        body.split_once(char::is_whitespace).map_or("", |(_, r)| r.trim_start())
    } else {
        body
    };
    let args = body.split_once(char::is_whitespace).map_or("", |(_, r)| r);
    args.split(',')
        .map(|a| {
            let a = a.trim();
            let name = a.trim_start_matches(['-', '~', '|', '!']);
            let prefix = &a[..a.len() - name.len()];
            let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
            format!("{prefix}{}", &name[..end])
        })
        .collect()
}

/// 32-bit integer operations (and their uniform forms, `U` before the name): each writes one 32-bit register
/// (besides predicate carry-outs), unless its opcode says `WIDE` or `.64`.
const NARROW: [&str; 18] = [
    "LOP3", "IADD3", "IMAD", "SHF", "PRMT", "SEL", "VIADD", "LEA", "POPC", "FLO", "BREV", "IABS", "IMNMX", "VIMNMX",
    "SGXT", "BMSK", "IADD", "MOV",
];

/// What `insn` may write, generously: its first operand when that is a register or predicate (with the three
/// registers after it, for 64- and 128-bit results, except after a [`NARROW`] operation and a load, which
/// writes the registers its width names), the operand after a
/// predicate result, and the predicates right after (carry-outs). Stores, branches and barriers write none.
fn destinations(insn: &Insn, ops: &[String]) -> Vec<String> {
    const NONE: [&str; 17] = [
        "ST",
        "STG",
        "STS",
        "STL",
        "RED",
        "BRA",
        "BSSY",
        "BSYNC",
        "BREAK",
        "CALL",
        "RET",
        "EXIT",
        "MEMBAR",
        "ERRBAR",
        "CGAERRBAR",
        "CCTL",
        "NOP",
    ];
    if NONE.contains(&insn.base()) {
        return Vec::new();
    }
    let is_pred = |o: &str| o.starts_with('P') || o.starts_with("UP");
    let base = insn.base();
    let narrow = NARROW.contains(&base.strip_prefix('U').filter(|b| NARROW.contains(b)).unwrap_or(base))
        && !insn.op.contains("WIDE")
        && !insn.op.contains(".64");
    // A load writes as many registers as its width: one, two (`.64`) or four (`.128`).
    let load = matches!(base, "LD" | "LDG" | "LDS" | "LDL" | "LDC" | "ULDC");
    let regs = if narrow {
        1
    } else if load {
        if insn.op.contains(".128") {
            4
        } else if insn.op.contains(".64") {
            2
        } else {
            1
        }
    } else {
        4
    };
    let mut out = Vec::new();
    let widen = |o: &str, out: &mut Vec<String>| {
        for prefix in ["UR", "R"] {
            if let Some(n) = o.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok()) {
                out.extend((0..regs).map(|d| format!("{prefix}{}", n + d)));
                return;
            }
        }
        out.push(o.to_string());
    };
    let Some(first) = ops.first() else { return out };
    widen(first, &mut out);
    let mut i = 1;
    if is_pred(first) {
        if let Some(o) = ops.get(1) {
            widen(o, &mut out);
        }
        i = 2;
    }
    while let Some(o) = ops.get(i).filter(|o| is_pred(o)) {
        out.push(o.clone());
        i += 1;
    }
    out
}

/// The fast path of `section`'s kernel with exactly `mmio` MMIO stores and at least `stored` bytes of other
/// global stores ([`Insn::stored_bytes`]; [`store_floor`]), or `None` if no path from the entry to `EXIT` has
/// them (see the module docs).
///
/// # Errors
/// Control flow the search does not model: indirect branches, calls outside the section, recursion, a branch
/// to a missing label; or a search too large.
pub fn fast_path(section: &Section, mmio: u32, stored: u32) -> Result<Option<Trace>> {
    if section.functions.first().is_none_or(|f| f.insns.is_empty()) {
        bail!("{}: no instructions", section.kernel);
    }
    let flat = Flat::new(section)?;
    let bound = flat.bounds(section, mmio, &|node| flat.end[node].is_some());
    let ends = |node: usize, allowed: &dyn Fn(Edge) -> bool| flat.end[node].is_some_and(allowed);
    search(section, &flat, 0, (mmio, stored), &|node, left| bound[node][left as usize], &ends)
}

/// Whether a search ends at a node, given which of the node's edges the known values allow.
type Done<'a> = dyn Fn(usize, &dyn Fn(Edge) -> bool) -> bool + 'a;

/// A* over (node, MMIO stores left, bytes of other stores made up to `goal.1`, known values) from `start`:
/// `estimate` (a lower bound of the instructions still to run, [`INF`] where no path goes on) never
/// overestimates, so the first state that has made `goal.0` MMIO stores and at least `goal.1` bytes of other
/// stores, for which `done` holds (given the node and which of its edges the known values allow), is a shortest
/// path among those the known values allow.
fn search(
    section: &Section,
    flat: &Flat,
    start: usize,
    (mmio, floor): (u32, u32),
    estimate: &dyn Fn(usize, u32) -> u64,
    done: &Done,
) -> Result<Option<Trace>> {
    struct State {
        node: usize,
        left: u32,
        stored: u32,
        known: Known,
        parent: usize,
        cost: u64,
    }
    let first = State { node: start, left: mmio, stored: 0, known: Known::default(), parent: usize::MAX, cost: 1 };
    let mut states = vec![first];
    let mut heap = std::collections::BinaryHeap::new();
    let mut closed = std::collections::HashSet::new();
    if estimate(start, mmio) < INF {
        heap.push(std::cmp::Reverse((estimate(start, mmio), 0usize)));
    }
    while let Some(std::cmp::Reverse((_, id))) = heap.pop() {
        if states.len() > MAX_STATES {
            bail!("{}: the path search gave up after {MAX_STATES} states", section.kernel);
        }
        let (node, left, stored, cost) = (states[id].node, states[id].left, states[id].stored, states[id].cost);
        if !closed.insert((node, left, stored, states[id].known.clone())) {
            continue;
        }
        let insn = flat.insn(section, node);
        if let Some(forks) = states[id].known.assume_guard(insn) {
            // Both outcomes of an unknown guard are runs: each goes on with its predicate known, so that a
            // later test of the same predicate (the other arm of an if-converted diamond, a branch on it)
            // follows it rather than combining outcomes no run combines.
            let parent = states[id].parent;
            for known in forks {
                states.push(State { node, left, stored, known, parent, cost });
                heap.push(std::cmp::Reverse((cost - 1 + estimate(node, left), states.len() - 1)));
            }
            continue;
        }
        let Some(left) = left.checked_sub(u32::from(insn.is_mmio())) else { continue };
        let guard = states[id].known.guard(insn);
        let stored = if guard == Some(true) { (stored + insn.stored_bytes()).min(floor) } else { stored };
        let allowed = |e: Edge| match e {
            Edge::Always => true,
            Edge::Taken => guard != Some(false),
            Edge::Fall => guard != Some(true),
        };
        if left == 0 && stored >= floor && done(node, &allowed) {
            let mut trace = Trace::new();
            let mut at = id;
            while at != usize::MAX {
                trace.push(flat.at[states[at].node]);
                at = states[at].parent;
            }
            trace.reverse();
            return Ok(Some(trace));
        }
        let known = states[id].known.step(insn);
        for &(s, e) in &flat.succ[node] {
            let h = estimate(s, left);
            if !allowed(e) || h >= INF {
                continue;
            }
            states.push(State { node: s, left, stored, known: known.clone(), parent: id, cost: cost + 1 });
            heap.push(std::cmp::Reverse((cost + h, states.len() - 1)));
        }
    }
    Ok(None)
}

/// The fast iteration of a posting loop with `mmio` MMIO stores: the fewest instructions from the loop's first
/// instruction to its branch back, taken, executing that many MMIO stores and no poll, as [`fast_path`]
/// counts them; `None` when no iteration has that many. Registers are unknown at the loop's start, so only
/// what the iteration itself sets decides a branch: a branch on a value carried from the last iteration (a
/// flag left by the previous post) may go either way. Where the loop's function is inlined at several calls,
/// the shortest iteration of any copy.
///
/// # Errors
/// As [`fast_path`].
pub fn loop_iteration(section: &Section, l: &PostingLoop, mmio: u32, stored: u32) -> Result<Option<Trace>> {
    loop_iteration_in(section, &Flat::new(section)?, l, (mmio, stored))
}

/// [`loop_iteration`] on `section`'s graph `flat`, built once for all its loops.
fn loop_iteration_in(section: &Section, flat: &Flat, l: &PostingLoop, goal: (u32, u32)) -> Result<Option<Trace>> {
    let mmio = goal.0;
    let Some(f) = section.functions.iter().position(|f| f.name == l.function) else {
        bail!("{}: no function {}", section.kernel, l.function);
    };
    let index = |addr: u32| section.functions[f].insns.iter().position(|i| i.addr == addr);
    let (Some(first), Some(back)) = (index(l.start), index(l.end)) else {
        bail!("{}: loop {:#x}-{:#x} is not in {}", section.kernel, l.start, l.end, l.function);
    };
    let mut best: Option<Trace> = None;
    // A copy of the function occupies consecutive nodes (`Flat::inline`): its branch back is `back - first`
    // nodes after its first instruction.
    for start in (0..flat.at.len()).filter(|&n| flat.at[n] == (f, first)) {
        let end = start + (back - first);
        let bound = flat.bounds(section, mmio, &|node| node == end);
        let done = |node: usize, allowed: &dyn Fn(Edge) -> bool| {
            let insn = flat.insn(section, node);
            node == end && (insn.unconditional() || allowed(Edge::Taken))
        };
        if let Some(t) = search(section, flat, start, goal, &|node, left| bound[node][left as usize], &done)? {
            if best.as_ref().is_none_or(|b| t.len() < b.len()) {
                best = Some(t);
            }
        }
    }
    Ok(best)
}

/// The path as a listing: a running count, the function, the address and the instruction, with a line where
/// the path changes function.
pub fn listing(section: &Section, path: &Trace) -> String {
    let mut out = String::new();
    let mut current = usize::MAX;
    for (n, &(f, i)) in path.iter().enumerate() {
        if f != current {
            current = f;
            let name = &section.functions[f].name;
            let short = name.strip_prefix(&format!("${}$", section.kernel)).unwrap_or(name);
            let _ = writeln!(out, "        // {:#}", rustc_demangle::demangle(short));
        }
        let insn = &section.functions[f].insns[i];
        let _ = writeln!(out, "{:>4}  /*{:04x}*/  {}", n + 1, insn.addr, insn.text);
    }
    out
}

/// A label for a number of MMIO stores.
pub fn path_name(mmio: u32) -> String {
    match mmio {
        DOORBELL_STORES => "doorbell (1 MMIO store)".to_string(),
        BLUE_FLAME_STORES => "BlueFlame (8 MMIO stores)".to_string(),
        k => format!("{k} MMIO stores"),
    }
}

/// Runs `cmd` and returns its standard output.
fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let output = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot run {shown}"))?;
    if !output.status.success() {
        bail!("{shown} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `cuobjdump -sass -fun <kernel> <cubin>`. cuobjdump runs nvdisasm for `-sass` and looks for it on PATH (or in
/// `$NVDISASM_PATH`), so the folder of `nvdisasm` goes first on PATH.
fn cuobjdump_sass(cuobjdump: &Path, nvdisasm: &Path, kernel: &str, cubin: &Path) -> Result<String> {
    let mut cmd = Command::new(cuobjdump);
    if let Some(dir) = nvdisasm.parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)))
            .context("cannot put nvdisasm's folder on PATH")?;
        cmd.env("PATH", joined).env("NVDISASM_PATH", dir);
    }
    output(cmd.args(["-sass", "-fun", kernel]).arg(cubin))
}

/// Instruction lines of a `cuobjdump -sass` listing (`/*0110*/ ... ;`; the encoding lines are comments only).
pub fn cuobjdump_count(listing: &str) -> usize {
    listing
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.strip_prefix("/*")
                .and_then(|r| r.split_once("*/"))
                .is_some_and(|(a, _)| !a.is_empty() && a.len() <= 8 && a.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .count()
}

/// A loop of one function whose body holds an MMIO store, or one nested in such a loop that stores 16-byte
/// segments ([`posting_loops`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostingLoop {
    /// Kernel of the section.
    pub kernel: String,
    /// Function the loop is in.
    pub function: String,
    /// Addresses of the loop's first instruction (the branch's target) and of its branch back.
    pub start: u32,
    /// See [`PostingLoop::start`].
    pub end: u32,
    /// Instructions from the first to the branch back, NOPs excluded.
    pub instructions: usize,
    /// MMIO stores among them.
    pub mmio: usize,
    /// Local-memory accesses (`LDL`, `STL`) among them.
    pub local: usize,
    /// Whether the loop is in a slow path the device crate runs out of line (`qp::out_of_line`: waiting
    /// for room, polling the CQ), where state on the stack costs nothing on the fast path.
    pub slow: bool,
    /// Instructions of the loop's fast iteration ([`loop_iteration`]) with each of [`ITERATION_MMIO`] MMIO
    /// stores: `None` where no iteration has that many; left `None` by [`posting_loops`], filled by
    /// [`analyse`].
    pub iteration: [Option<usize>; ITERATION_MMIO.len()],
}

/// MMIO stores of the loop iterations [`analyse`] counts: none (a post whose doorbell comes later), a
/// doorbell, a BlueFlame write.
pub const ITERATION_MMIO: [u32; 3] = [0, DOORBELL_STORES, BLUE_FLAME_STORES];

/// The functions the device crate's slow paths run in (`Qp::cold`, and the wait for room it calls, which
/// ptxas may keep as a function of its own), by their symbols' names.
const SLOW_PATH_FNS: [&str; 2] = ["out_of_line", "reserve_slow"];

/// The loops of `section` whose body holds an MMIO store, and the loops nested in one of those that store
/// 16-byte segments (a loop of WQE stores whose doorbell comes after it, inside a loop of batches): every branch to a label at or before it in the
/// same function is a loop from that label to the branch (the layouts of structured Rust put each loop's body
/// there, with the slow paths ptxas lays out inside it). Loops nested in one another are listed each.
pub fn posting_loops(section: &Section) -> Vec<PostingLoop> {
    let mut loops = Vec::new();
    for f in &section.functions {
        let mut all = Vec::new();
        for (i, insn) in f.insns.iter().enumerate() {
            if insn.base() != "BRA" || insn.never() {
                continue;
            }
            let Some(&start) = insn.target.as_ref().and_then(|t| f.labels.get(t)) else { continue };
            if start > i {
                continue;
            }
            let body = &f.insns[start..=i];
            all.push(PostingLoop {
                kernel: section.kernel.clone(),
                function: f.name.clone(),
                start: f.insns[start].addr,
                end: insn.addr,
                instructions: body.iter().filter(|b| b.base() != "NOP").count(),
                mmio: body.iter().filter(|b| b.is_mmio()).count(),
                local: body.iter().filter(|b| b.is_local()).count(),
                slow: SLOW_PATH_FNS.iter().any(|n| f.name.contains(n)),
                iteration: [None; ITERATION_MMIO.len()],
            });
        }
        let in_ringing = |l: &PostingLoop| all.iter().any(|o| o.mmio > 0 && o.start <= l.start && l.end <= o.end);
        let stores_segments =
            |l: &PostingLoop| f.insns.iter().any(|i| (l.start..=l.end).contains(&i.addr) && i.stored_bytes() == 16);
        loops.extend(all.iter().filter(|l| l.mmio > 0 || (in_ringing(l) && stores_segments(l))).cloned());
    }
    loops
}

/// Whether `l` is an innermost posting loop of `loops`: no other loop of its function that rings lies inside
/// its range. (A loop of WQE stores inside it does not count: a loop that rings each post and spilled may
/// hold a loop that copies segments.)
pub fn is_innermost(l: &PostingLoop, loops: &[PostingLoop]) -> bool {
    !loops.iter().any(|o| {
        o.kernel == l.kernel
            && o.function == l.function
            && o.mmio > 0
            && (o.start, o.end) != (l.start, l.end)
            && l.start <= o.start
            && o.end <= l.end
    })
}

/// Formats the posting loops as a table.
pub fn loop_table(loops: &[PostingLoop]) -> String {
    let width = loops.iter().map(|l| l.kernel.len()).max().unwrap_or(0).max("kernel".len());
    let mut out = format!(
        "{:<width$}  {:>15}  {:>12}  {:>4}  {:>11}  {:<4}  {:>19}  function\n",
        "kernel", "posting loop", "instructions", "MMIO", "local ld/st", "slow", "iteration: 0/db/BF"
    );
    for l in loops {
        let iteration: Vec<String> =
            l.iteration.iter().map(|n| n.map_or_else(|| "-".to_string(), |n| n.to_string())).collect();
        let _ = writeln!(
            out,
            "{:<width$}  {:>15}  {:>12}  {:>4}  {:>11}  {:<4}  {:>19}  {}",
            l.kernel,
            format!("{:#x}-{:#x}", l.start, l.end),
            l.instructions,
            l.mmio,
            l.local,
            if l.slow { "yes" } else { "" },
            iteration.join("/"),
            l.function
        );
    }
    out
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Kernel name.
    pub kernel: String,
    /// Instructions of its section, NOP padding excluded.
    pub static_count: usize,
    /// MMIO stores the path executes.
    pub mmio: u32,
    /// The path's counts; `None` when no path has that many MMIO stores.
    pub counts: Option<Counts>,
}

/// Disassembles `cubin`'s `kernels` (all `gdaki_sass_*` entries when empty): writes
/// `<out>/<kernel>.sass` (`cuobjdump -sass`), and for each of `mmio` (numbers of MMIO stores) the fast path's
/// listing `<out>/<kernel>.path-<k>.sass`; returns one row per kernel and path, and the kernels' posting
/// loops ([`posting_loops`]).
///
/// # Errors
/// A tool fails, a kernel is not in the cubin, the two disassemblers disagree on the instruction count, or
/// [`fast_path`] meets control flow it does not model.
pub fn analyse(
    cuobjdump: &Path,
    nvdisasm: &Path,
    cubin: &Path,
    kernels: &[String],
    mmio: &[u32],
    out: &Path,
) -> Result<(Vec<Row>, Vec<PostingLoop>)> {
    let text = output(Command::new(nvdisasm).arg("-c").arg(cubin))?;
    let sections = parse_nvdisasm(&text).context("cannot read nvdisasm's listing")?;
    let chosen: Vec<&Section> = if kernels.is_empty() {
        sections.iter().filter(|s| s.entry && s.kernel.starts_with(DEFAULT_PREFIX)).collect()
    } else {
        kernels
            .iter()
            .map(|k| {
                sections.iter().find(|s| &s.kernel == k).with_context(|| {
                    let names: Vec<&str> = sections.iter().filter(|s| s.entry).map(|s| s.kernel.as_str()).collect();
                    format!("no kernel {k} in {} (kernels: {})", cubin.display(), names.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    if chosen.is_empty() {
        bail!("no {DEFAULT_PREFIX}* kernel in {}", cubin.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut rows = Vec::new();
    let mut loops = Vec::new();
    for section in chosen {
        let kernel = &section.kernel;
        let floor = store_floor(kernel);
        let found = posting_loops(section);
        // One graph of the kernel for all its loops' searches (the inlining is the costly part).
        let flat = if found.is_empty() { None } else { Some(Flat::new(section)?) };
        for (mut l, flat) in found.into_iter().zip(flat.iter().cycle()) {
            for (i, &k) in ITERATION_MMIO.iter().enumerate() {
                let path = loop_iteration_in(section, flat, &l, (k, floor))
                    .with_context(|| format!("{kernel}: loop {:#x}-{:#x}, {k} MMIO stores", l.start, l.end))?;
                if let Some(path) = &path {
                    let header = format!(
                        "// {kernel}: loop {:#x}-{:#x}, fast iteration with {k} MMIO stores (cargo xtask sass)\n",
                        l.start, l.end
                    );
                    let name = format!("{kernel}.loop-{:x}.path-{k}.sass", l.start);
                    write(&out.join(name), &(header + &listing(section, path)))?;
                }
                l.iteration[i] = path.map(|p| p.len());
            }
            loops.push(l);
        }
        let sass = cuobjdump_sass(cuobjdump, nvdisasm, kernel, cubin)?;
        write(&out.join(format!("{kernel}.sass")), &sass)?;
        let listed = cuobjdump_count(&sass);
        if listed != section.total_count() {
            bail!("{kernel}: cuobjdump lists {listed} instructions, nvdisasm {}", section.total_count());
        }
        for &k in mmio {
            let path =
                fast_path(section, k, floor).with_context(|| format!("{kernel}: fast path with {k} MMIO stores"))?;
            if let Some(path) = &path {
                let header = format!(
                    "// {kernel}: fast path with {k} MMIO stores (cargo xtask sass; method: xtask/src/sass.rs)\n"
                );
                write(&out.join(format!("{kernel}.path-{k}.sass")), &(header + &listing(section, path)))?;
            }
            let counts = path.map(|p| count(section, &p));
            rows.push(Row { kernel: kernel.clone(), static_count: section.static_count(), mmio: k, counts });
        }
    }
    Ok((rows, loops))
}

/// Bytes of global stores other than MMIO (the ring, counters, the dbrec) that a kernel's fast path and its
/// posting loops' iterations make at least: a `gdaki_sass_*` kernel posts at least one WQE, whose smallest, an
/// RDMA WRITE, is 48 bytes (`gdaki_sass_put_with_signal` adds a 64-byte atomic); other kernels, 0. A shorter
/// path storing less has skipped a post by combining outcomes of two tests of one value that no run combines
/// (the search does not relate values it does not know, such as a length tested twice).
pub fn store_floor(kernel: &str) -> u32 {
    const WRITE: u32 = 48;
    match kernel {
        "gdaki_sass_put_with_signal" => WRITE + 64,
        k if k.starts_with(DEFAULT_PREFIX) => WRITE,
        _ => 0,
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Formats the rows as a table.
pub fn table(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(0).max("kernel".len());
    let mut out = format!(
        "{:<width$}  {:>6}  {:<25}  {:>12}  {:>6}  {:>4}  {:>5}  {:>13}  {:>6}  {:>11}\n",
        "kernel",
        "static",
        "fast path",
        "instructions",
        "fences",
        "MMIO",
        "loads",
        "ordered loads",
        "stores",
        "local ld/st"
    );
    for r in rows {
        let _ = match r.counts {
            Some(c) => writeln!(
                out,
                "{:<width$}  {:>6}  {:<25}  {:>12}  {:>6}  {:>4}  {:>5}  {:>13}  {:>6}  {:>11}",
                r.kernel,
                r.static_count,
                path_name(r.mmio),
                c.instructions,
                c.fences,
                c.mmio,
                c.loads,
                c.ordered_loads,
                c.stores,
                c.local
            ),
            None => writeln!(
                out,
                "{:<width$}  {:>6}  {:<25}  {:>12}",
                r.kernel,
                r.static_count,
                path_name(r.mmio),
                "no such path"
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel in nvdisasm 13's layout: a `tid != 0` skip of a clearing loop, then a call of a function with
    /// an argument check, a loop, a trap, a polling arm, and an error code tested after a join.
    const LISTING: &str = r#"
	.section	.text.k,"ax",@progbits
        .global         k
        .type           k,@function
        .other          k,@"STO_CUDA_ENTRY STV_DEFAULT"
k:
.text.k:
        /*0000*/                   S2R R2, SR_TID.X ;
        /*0010*/                   ISETP.NE.U32.AND P0, PT, R2, RZ, PT ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   ST.E.64.STRONG.SYS desc[UR4][R2.64], RZ ;
        /*0040*/                   ST.E.64.STRONG.SYS desc[UR4][R2.64+0x8], RZ ;
.L_x_1:
        /*0050*/                   MOV R0, 0x80 ;
        /*0060*/                   CALL.REL.NOINC `($k$f) ;
        /*0070*/                   EXIT ;
.L_x_9:
        /*0080*/                   BRA `(.L_x_9);
        .type           $k$f,@function
$k$f:
        /*0090*/                   LD.E.64 R4, desc[UR4][R2.64] ;
        /*00a0*/                   ISETP.NE.U32.AND P0, PT, R4, RZ, PT ;
        /*00b0*/               @P0 BRA `(.L_x_2) ;
        /*00c0*/                   RET.REL.NODEC R0 `(k) ;
.L_x_2:
        /*00d0*/                   LD.E.64 R6, desc[UR4][R2.64+0x8] ;
        /*00e0*/                   ISETP.EQ.U32.AND P1, PT, R6, RZ, PT ;
        /*00f0*/               @P1 BRA `(.L_x_2) ;
        /*0100*/               @P0 BRA `(.L_x_3) ;
        /*0110*/                   BPT.TRAP 0x1 ;
.L_x_3:
        /*0120*/                   ISETP.GE.U32.AND P2, PT, R6.reuse, 0x4, PT ;
        /*0130*/               @P2 BRA `(.L_x_4) ;
        /*0140*/                   LD.E.64.STRONG.SYS R10, desc[UR4][R2.64+0x10] ;
        /*0150*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*0160*/                   RET.REL.NODEC R0 `(k) ;
.L_x_4:
        /*0170*/                   IMAD.MOV.U32 R9, RZ, RZ, 0xa ;
        /*0180*/               @P1 BRA `(.L_x_5) ;
        /*0190*/                   MEMBAR.ALL.SYS ;
        /*01a0*/                   STL.64 [R1], R4 ;
        /*01b0*/                   MEMBAR.ALL.SYS ;
        /*01c0*/                   IMAD.MOV.U32 R9, RZ, RZ, 0xb ;
.L_x_5:
        /*01d0*/                   ISETP.NE.U32.AND P3, PT, R9, 0xb, PT ;
        /*01e0*/               @P3 BRA `(.L_x_6) ;
        /*01f0*/                   STG.E.64.MMIO.SYS [R8], R4 ;
.L_x_6:
        /*0200*/                   RET.REL.NODEC R0 `(k) ;
        /*0210*/                   NOP;
"#;

    #[test]
    fn parses_functions_labels_and_guards() {
        let sections = parse_nvdisasm(LISTING).expect("parses");
        assert_eq!(sections.len(), 1);
        let s = &sections[0];
        assert_eq!((s.kernel.as_str(), s.entry), ("k", true));
        let names: Vec<&str> = s.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["k", "$k$f"]);
        assert_eq!((s.functions[0].insns.len(), s.functions[1].insns.len()), (9, 25));
        assert_eq!((s.total_count(), s.static_count()), (34, 33));
        assert_eq!((s.functions[0].labels[".L_x_1"], s.functions[1].labels[".L_x_3"]), (5, 9));
        let branch = &s.functions[0].insns[2];
        assert_eq!(
            (branch.guard.as_deref(), branch.op.as_str(), branch.target.as_deref()),
            (Some("@P0"), "BRA", Some(".L_x_1"))
        );
        assert!(s.functions[1].insns[12].is_mmio() && !s.functions[0].insns[3].is_mmio());
        assert!(s.functions[1].insns[11].is_ordered_load() && !s.functions[1].insns[0].is_ordered_load());
    }

    #[test]
    fn fast_path_skips_the_clear_loop_trap_poll_and_infeasible_error_arm() {
        let s = &parse_nvdisasm(LISTING).expect("parses")[0];
        let path = fast_path(s, 1, 0).expect("search").expect("a path with one MMIO store");
        let addrs: Vec<u32> = path.iter().map(|&(f, i)| s.functions[f].insns[i].addr).collect();
        // Entry, the `tid != 0` skip, the call; in the callee the loop body once (its back edge cut), not the
        // polling arm (an ordered load), and not the shorter error arm, whose code 0xa makes the doorbell's
        // test (R9 != 0xb) skip the store; back, EXIT.
        assert_eq!(
            addrs,
            [
                0x00, 0x10, 0x20, 0x50, 0x60, 0x90, 0xa0, 0xb0, 0xd0, 0xe0, 0xf0, 0x100, 0x120, 0x130, 0x170, 0x180,
                0x190, 0x1a0, 0x1b0, 0x1c0, 0x1d0, 0x1e0, 0x1f0, 0x200, 0x70
            ]
        );
        assert_eq!(
            count(s, &path),
            Counts { instructions: 25, fences: 2, mmio: 1, loads: 2, ordered_loads: 0, stores: 0, local: 1 }
        );
        // Without a store, the argument error is the shortest way out; two stores are never made.
        assert_eq!(fast_path(s, 0, 0).expect("search").expect("a path without MMIO").len(), 10);
        assert_eq!(fast_path(s, 2, 0).expect("search"), None);
        let text = listing(s, &path);
        assert!(text.contains("// f") && text.contains("  25  /*0070*/  EXIT"), "{text}");
    }

    /// The addresses of the fast path of `s` with `mmio` MMIO stores and at least `stored` bytes of other stores.
    fn path_addrs(s: &Section, mmio: u32, stored: u32) -> Option<Vec<u32>> {
        let path = fast_path(s, mmio, stored).expect("search")?;
        Some(path.iter().map(|&(f, i)| s.functions[f].insns[i].addr).collect())
    }

    /// A warp leader's `Result`, broadcast with a shuffle: its error arm (shorter) is not taken when the value
    /// shuffled is known, and neither is the divergent warp's `BRA.DIV` detour.
    const SHUFFLED: &str = r#"
	.section	.text.w,"ax",@progbits
        .global         w
        .type           w,@function
        .other          w,@"STO_CUDA_ENTRY STV_DEFAULT"
w:
.text.w:
        /*0000*/                   IMAD.MOV.U32 R27, RZ, RZ, RZ ;
        /*0010*/                   IMAD.U32 R2, RZ, RZ, UR11 ;
        /*0020*/                   BRA.DIV UR10, `(.L_x_9) ;
        /*0030*/                   SHFL.IDX PT, R2, R27, R2, 0x1f ;
        /*0040*/                   ISETP.NE.U32.AND P0, PT, R2, RZ, PT ;
        /*0050*/              @!P0 BRA `(.L_x_1) ;
        /*0060*/                   STL.64 [R1+0x30], R20 ;
        /*0070*/                   EXIT ;
.L_x_1:
        /*0080*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0090*/                   IADD3 R4, R4, 0x1, RZ ;
        /*00a0*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*00b0*/                   EXIT ;
.L_x_9:
        /*00c0*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*00d0*/                   EXIT ;
"#;

    #[test]
    fn a_shuffled_known_result_decides_its_test_and_bra_div_is_not_taken() {
        let s = &parse_nvdisasm(SHUFFLED).expect("parses")[0];
        let addrs = |mmio| path_addrs(s, mmio, 0);
        assert_eq!(addrs(1), Some(vec![0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x80, 0x90, 0xa0, 0xb0]));
        // The error arm (no MMIO store) is never the leader's: the shuffled 0 sends every path past it.
        assert_eq!(addrs(0), None);
    }

    /// An if-converted diamond whose arms both set the `Result` code to Ok (0xf) under an unknown predicate,
    /// then the test of that code; and a put whose error arm (shorter, no WQE stored) rings too.
    const DIAMOND: &str = r#"
	.section	.text.d,"ax",@progbits
        .global         d
        .type           d,@function
        .other          d,@"STO_CUDA_ENTRY STV_DEFAULT"
d:
.text.d:
        /*0000*/                   ISETP.GE.U32.AND P0, PT, R17, 0x2, PT ;
        /*0010*/               @P0 IMAD.MOV.U32 R118, RZ, RZ, 0xf ;
        /*0020*/              @!P0 IMAD.MOV.U32 R118, RZ, RZ, 0xf ;
        /*0030*/                   ISETP.NE.U32.AND P1, PT, R118, 0xf, PT ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
        /*0050*/                   ST.E.128 desc[UR6][R4.64+0x10], R20 ;
        /*0060*/                   ST.E.128 desc[UR6][R4.64+0x20], R20 ;
        /*0070*/                   ST.E.128 desc[UR6][R4.64], R20 ;
        /*0080*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*0090*/                   EXIT ;
.L_x_1:
        /*00a0*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*00b0*/                   EXIT ;
"#;

    #[test]
    fn an_unknown_guard_is_followed_both_ways_and_a_store_floor_keeps_the_wqe() {
        let s = &parse_nvdisasm(DIAMOND).expect("parses")[0];
        let addrs = |stored| path_addrs(s, 1, stored);
        // Either way P0 goes, R118 is 0xf: the error arm at 0xa0 (shorter) is no run's, so even with no floor the
        // path stores the WQE (without the split on P0, R118 was unknown and the search took 0xa0).
        assert_eq!(addrs(0), Some(vec![0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90]));
        assert_eq!(addrs(48), addrs(0));
        // 48 bytes is all the path stores (three 16-byte stores); more is no path.
        assert_eq!(addrs(49), None);
        let insn = |t: &str| parse_insn(t).expect("parses");
        assert_eq!(insn("/*0000*/ ST.E.128 desc[UR6][R4.64], R20 ;").stored_bytes(), 16);
        assert_eq!(insn("/*0000*/ @!P0 ST.E.64 desc[UR6][R4.64+0x98], R10 ;").stored_bytes(), 8);
        assert_eq!(insn("/*0000*/ ST.E.STRONG.GPU desc[UR6][R10.64+0x4], R3 ;").stored_bytes(), 4);
        assert_eq!(insn("/*0000*/ STG.E.U8 desc[UR6][R10.64], R3 ;").stored_bytes(), 1);
        assert_eq!(insn("/*0000*/ STG.E.64.MMIO.SYS [R8], R4 ;").stored_bytes(), 0);
        assert_eq!(insn("/*0000*/ STL.64 [R1+0x30], R20 ;").stored_bytes(), 0);
    }

    #[test]
    fn destinations_are_generous() {
        let insn = |t: &str| parse_insn(t).expect("parses");
        let dest = |t: &str| {
            let i = insn(t);
            destinations(&i, &operands(&i))
        };
        // A 32-bit operation writes its register and carry-outs; a wide or unknown one up to four registers.
        assert_eq!(dest("/*0000*/ IADD3 R9, P1, RZ, R10, RZ ;"), ["R9", "P1"]);
        assert_eq!(dest("/*0000*/ LOP3.LUT P0, RZ, R151, R64, RZ, 0xc0, !PT ;"), ["P0", "RZ"]);
        assert_eq!(dest("/*0000*/ @!P0 IADD3.X R3, R3, -0x1, RZ, P0, !PT ;"), ["R3"]);
        assert_eq!(dest("/*0000*/ ULOP3.LUT UR4, UR4, 0xffff00, URZ, 0xc0, !UPT ;"), ["UR4"]);
        assert_eq!(dest("/*0000*/ IMAD.WIDE.U32 R24, R9, 0x40, R24 ;"), ["R24", "R25", "R26", "R27"]);
        assert_eq!(dest("/*0000*/ DADD R4, R6, R8 ;"), ["R4", "R5", "R6", "R7"]);
        assert!(dest("/*0000*/ ST.E.64 desc[UR8][R118.64], R66 ;").is_empty());
        // A load writes what its width says, no more: a flag in the register after a 64-bit load survives it.
        assert_eq!(dest("/*0000*/ LDG.E.64 R14, desc[UR6][R4.64+0x90] ;"), ["R14", "R15"]);
        assert_eq!(dest("/*0000*/ LDG.E R17, desc[UR6][R4.64+0xb0] ;"), ["R17"]);
        assert_eq!(dest("/*0000*/ LD.E.128 R8, desc[UR6][R4.64] ;"), ["R8", "R9", "R10", "R11"]);
        assert_eq!(dest("/*0000*/ LDC.64 R28, c[0x0][0x218] ;"), ["R28", "R29"]);
        let known = Known::default().step(&insn("/*0000*/ IMAD.MOV.U32 R148, RZ, RZ, 0xb ;"));
        assert_eq!(known.value("R148"), Some(0xb));
        let test = known.step(&insn("/*0000*/ ISETP.NE.U32.AND P0, PT, R148.reuse, 0xb, PT ;"));
        assert_eq!(test.value("P0"), Some(0));
        assert_eq!(test.step(&insn("/*0000*/ LD.E.64 R147, desc[UR8][R2.64] ;")).value("R148"), None);
        assert_eq!(test.step(&insn("/*0000*/ LD.E.64 R146, desc[UR8][R2.64] ;")).value("R148"), Some(0xb));
        // `n & 1 != 0` of a known n, and a 64-bit `>=` whose high words are equal.
        let k = ["/*0000*/ IMAD.MOV.U32 R63, RZ, RZ, 0x1 ;", "/*0000*/ LOP3.LUT P0, RZ, R63, 0x1, RZ, 0xc0, !PT ;"]
            .iter()
            .fold(Known::default(), |k, t| k.step(&insn(t)));
        assert_eq!((k.value("P0"), k.value("!P0")), (Some(1), Some(0)));
        let k = [
            "/*0000*/ CS2R R8, SRZ ;",
            "/*0000*/ IMAD.MOV.U32 R8, RZ, RZ, 0x5 ;",
            "/*0000*/ ISETP.GE.U32.AND P1, PT, R8, 0x3, PT ;",
            "/*0000*/ ISETP.GE.U32.AND.EX P1, PT, R9, RZ, PT, P1 ;",
            "/*0000*/ ISETP.LT.U32.AND P2, PT, R8, 0x3, PT ;",
            "/*0000*/ ISETP.LT.U32.OR.EX P2, PT, R9, RZ, !P1, P2 ;",
            "/*0000*/ IMAD.MOV.U32 R10, RZ, RZ, -R8 ;",
        ]
        .iter()
        .fold(Known::default(), |k, t| k.step(&insn(t)));
        assert_eq!((k.value("P1"), k.value("P2"), k.value("R10")), (Some(1), Some(0), None));
        // One active lane, lane 0, leads its warp: the leader test of an aggregated post (the lowest lane of
        // the matching lanes, through uniform registers) comes out true.
        let k = [
            "/*0000*/ VOTE.ANY R7, PT, PT ;",
            "/*0000*/ MATCH.ANY.U64 R4, R4 ;",
            "/*0000*/ S2R R0, SR_LANEID ;",
            "/*0000*/ UMOV UR8, 0x20 ;",
            "/*0000*/ R2UR UR7, R4 ;",
            "/*0000*/ UISETP.NE.U32.AND UP0, UPT, UR7, URZ, UPT ;",
            "/*0000*/ @UP0 UIADD3 UR4, UR7, -0x1, URZ ;",
            "/*0000*/ @UP0 ULOP3.LUT UR4, UR7, UR4, URZ, 0xc, !UPT ;",
            "/*0000*/ @UP0 UPOPC UR8, UR4 ;",
            "/*0000*/ UPOPC UR5, UR7 ;",
            "/*0000*/ IMAD.U32 R3, RZ, RZ, UR7 ;",
            "/*0000*/ VIADD R3, R3, 0xffffffff ;",
            "/*0000*/ IMAD.U32 R9, RZ, RZ, UR5 ;",
            "/*0000*/ ISETP.NE.U32.AND P2, PT, R0, UR8, PT ;",
        ]
        .iter()
        .fold(Known::default(), |k, t| k.step(&insn(t)));
        assert_eq!((k.value("R7"), k.value("UR8"), k.value("R9"), k.value("P2")), (Some(1), Some(0), Some(1), Some(0)));
        assert_eq!(k.value("R3"), Some(0), "VIADD of a known register");
        // PLOP3 with every input PT reads bit 7 of its table (0x8: false, 0x80: true, as ptxas sets flags);
        // a stack word survives a store elsewhere in the stack but not a generic store.
        let run = |lines: &[&str]| lines.iter().fold(Known::default(), |k, t| k.step(&insn(t)));
        let k = run(&[
            "/*0000*/ PLOP3.LUT P0, PT, PT, PT, PT, 0x8, 0x0 ;",
            "/*0000*/ PLOP3.LUT P1, PT, PT, PT, PT, 0x80, 0x0 ;",
            "/*0000*/ STL.64 [R1+0x28], RZ ;",
            "/*0000*/ STL.64 [R1+0x38], R4 ;",
            "/*0000*/ LDL.64 R6, [R1+0x28] ;",
        ]);
        assert_eq!((k.value("P0"), k.value("P1"), k.value("R6"), k.value("R7")), (Some(0), Some(1), Some(0), Some(0)));
        let k = run(&[
            "/*0000*/ STL.64 [R1+0x28], RZ ;",
            "/*0000*/ ST.E.64 desc[UR8][R132.64], R4 ;",
            "/*0000*/ LDL R6, [R1+0x28] ;",
        ]);
        assert_eq!(k.value("R6"), None);
    }

    /// A kernel with a posting loop that spilled (an `STL` and an `LDL` around its doorbell), a loop without an
    /// MMIO store, and a slow-path function whose waiting loop rings.
    const LOOPS: &str = r#"
	.section	.text.p,"ax",@progbits
        .type           p,@function
        .other          p,@"STO_CUDA_ENTRY STV_DEFAULT"
p:
.text.p:
        /*0000*/                   MOV R0, 0x4 ;
.L_x_1:
        /*0010*/                   LDL R5, [R1+0x8] ;
        /*0020*/                   ST.E.128 desc[UR4][R2.64], R4 ;
        /*0030*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*0040*/                   STL [R1+0x8], R5 ;
        /*0050*/                   VIADD R0, R0, 0xffffffff ;
        /*0060*/                   ISETP.NE.U32.AND P0, PT, R0, RZ, PT ;
        /*0070*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0080*/                   LDL R6, [R1] ;
        /*0090*/               @P1 BRA `(.L_x_2) ;
        /*00a0*/                   CALL.REL.NOINC `($p$_RNvNtCs1_5gdaki_device2qp11out_of_line) ;
        /*00b0*/                   EXIT ;
        .type           $p$_RNvNtCs1_5gdaki_device2qp11out_of_line,@function
$p$_RNvNtCs1_5gdaki_device2qp11out_of_line:
.L_x_3:
        /*00c0*/                   STL [R1], R4 ;
        /*00d0*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*00e0*/               @P2 BRA `(.L_x_3) ;
        /*00f0*/                   RET.REL.NODEC R0 `(p) ;
"#;

    #[test]
    fn posting_loops_are_the_loops_with_an_mmio_store_and_count_their_stack_accesses() {
        let sections = parse_nvdisasm(LOOPS).unwrap();
        let loops = posting_loops(&sections[0]);
        let got: Vec<_> = loops.iter().map(|l| (l.start, l.end, l.instructions, l.mmio, l.local, l.slow)).collect();
        // The loop without a doorbell (0x80-0x90) is not one; the slow path's is, marked slow.
        assert_eq!(got, [(0x10, 0x70, 7, 1, 2, false), (0xc0, 0xe0, 3, 1, 1, true)]);
        assert!(loop_table(&loops).lines().nth(2).unwrap().contains("yes"));
        // An iteration runs the body once with its store and takes the branch back; none has no store or two.
        assert_eq!(iterations(&sections[0], &loops[0]), [None, Some(7), None]);
        assert_eq!(iterations(&sections[0], &loops[1])[1], Some(3));
    }

    /// The lengths of `l`'s fastest iterations with 0, 1 and 2 MMIO stores (`None`: no such iteration).
    fn iterations(section: &Section, l: &PostingLoop) -> [Option<usize>; 3] {
        [0, 1, 2].map(|k| loop_iteration(section, l, k, 0).expect("search").map(|p| p.len()))
    }

    /// A loop of batches that rings after an inner loop of WQE stores and a loop that waits, and a loop that
    /// stores without ringing and is in no loop that rings.
    const NESTED: &str = r#"
	.section	.text.n,"ax",@progbits
        .type           n,@function
        .other          n,@"STO_CUDA_ENTRY STV_DEFAULT"
n:
.text.n:
        /*0000*/                   MOV R0, 0x4 ;
.L_x_1:
        /*0010*/                   MOV R7, R9 ;
.L_x_2:
        /*0020*/                   ST.E.128 desc[UR4][R2.64], R4 ;
        /*0030*/                   VIADD R7, R7, 0xffffffff ;
        /*0040*/                   ISETP.NE.U32.AND P1, PT, R7, RZ, PT ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
        /*0060*/                   STG.E.64.MMIO.SYS [R8], R4 ;
.L_x_4:
        /*0070*/                   LD.E.64 R10, [R12] ;
        /*0080*/               @P3 BRA `(.L_x_4) ;
        /*0090*/               @P0 BRA `(.L_x_1) ;
.L_x_3:
        /*00a0*/                   ST.E.128 desc[UR4][R2.64], R4 ;
        /*00b0*/               @P2 BRA `(.L_x_3) ;
        /*00c0*/                   EXIT ;
"#;

    #[test]
    fn a_loop_nested_in_a_posting_loop_is_one_and_counts_its_iteration_without_a_doorbell() {
        let sections = parse_nvdisasm(NESTED).unwrap();
        let loops = posting_loops(&sections[0]);
        let got: Vec<_> = loops.iter().map(|l| (l.start, l.end, l.instructions, l.mmio)).collect();
        // The waiting loop (0x70-0x80) stores nothing: not listed.
        assert_eq!(got, [(0x20, 0x50, 4, 0), (0x10, 0x90, 9, 1)]);
        assert_eq!(iterations(&sections[0], &loops[0]), [Some(4), None, None]);
        assert_eq!(iterations(&sections[0], &loops[1]), [None, Some(9), None]);
    }

    #[test]
    fn a_loop_around_another_is_not_innermost() {
        let l = |function: &str, start, end, mmio| PostingLoop {
            kernel: "k".into(),
            function: function.into(),
            start,
            end,
            instructions: 0,
            mmio,
            local: 0,
            slow: false,
            iteration: [None; ITERATION_MMIO.len()],
        };
        // Rounds (0x100-0x900) around a burst (0x200-0x400); a loop after it, which holds a loop of segment
        // stores that does not ring (0x520-0x540); one of another function whose range holds the burst's.
        let loops = [
            l("f", 0x100, 0x900, 2),
            l("f", 0x200, 0x400, 1),
            l("f", 0x500, 0x600, 1),
            l("f", 0x520, 0x540, 0),
            l("g", 0x0, 0x1000, 1),
        ];
        let innermost: Vec<bool> = loops.iter().map(|x| is_innermost(x, &loops)).collect();
        assert_eq!(innermost, [false, true, true, true, true]);
    }

    /// A loop whose body either rings (a flag carried from the last iteration says so) or skips the doorbell,
    /// with a polling arm and an error exit.
    const ITERATION: &str = r#"
	.section	.text.q,"ax",@progbits
        .type           q,@function
        .other          q,@"STO_CUDA_ENTRY STV_DEFAULT"
q:
.text.q:
        /*0000*/                   MOV R0, 0x4 ;
.L_x_1:
        /*0010*/                   ST.E.128 desc[UR4][R2.64], R4 ;
        /*0020*/                   ISETP.NE.U32.AND P1, PT, R9, RZ, PT ;
        /*0030*/               @P1 BRA `(.L_x_2) ;
        /*0040*/                   LD.E.64.STRONG.SYS R10, desc[UR4][R2.64+0x10] ;
        /*0050*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*0060*/                   BRA `(.L_x_3) ;
.L_x_2:
        /*0070*/                   MEMBAR.ALL.GPU ;
        /*0080*/                   STG.E.64.MMIO.SYS [R8], R4 ;
        /*0090*/                   IMAD.MOV.U32 R9, RZ, RZ, 0x1 ;
.L_x_3:
        /*00a0*/                   ISETP.NE.U32.AND P2, PT, R12, RZ, PT ;
        /*00b0*/               @P2 EXIT ;
        /*00c0*/                   VIADD R0, R0, 0xffffffff ;
        /*00d0*/                   ISETP.NE.U32.AND P0, PT, R0, RZ, PT ;
        /*00e0*/               @P0 BRA `(.L_x_1) ;
        /*00f0*/                   EXIT ;
"#;

    #[test]
    fn a_loop_iteration_avoids_polls_and_exits_and_takes_the_branch_back() {
        let s = &parse_nvdisasm(ITERATION).expect("parses")[0];
        let loops = posting_loops(s);
        assert_eq!(loops.len(), 1);
        let path = loop_iteration(s, &loops[0], 1, 0).expect("search").expect("an iteration with a doorbell");
        let addrs: Vec<u32> = path.iter().map(|&(f, i)| s.functions[f].insns[i].addr).collect();
        // R9 is unknown at the loop's start, so the ringing arm may be taken; the polling arm (shorter) may not,
        // nor the EXIT that leaves the loop.
        assert_eq!(addrs, [0x10, 0x20, 0x30, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0]);
        assert_eq!(loop_iteration(s, &loops[0], 0, 0).expect("search"), None);
    }

    #[test]
    fn a_jump_table_goes_to_each_of_its_targets() {
        // The same graph as the listing's guarded branch, as a one-entry jump table: the same fast path.
        let text = LISTING.replace("@P0 BRA `(.L_x_2)", "@P0 BRX R4 -0x10 (*\"BRANCH_TARGETS .L_x_2\"*)");
        let (bra, brx) = (&parse_nvdisasm(LISTING).expect("parses")[0], &parse_nvdisasm(&text).expect("parses")[0]);
        let with_bra = fast_path(bra, 1, 0).expect("followed").expect("a path");
        let with_brx = fast_path(brx, 1, 0).expect("followed").expect("a path");
        assert_eq!(count(brx, &with_brx), count(bra, &with_bra));
        let unknown = text.replace("BRANCH_TARGETS .L_x_2", "BRANCH_TARGETS .L_x_77");
        assert!(fast_path(&parse_nvdisasm(&unknown).expect("parses")[0], 1, 0).is_err(), "a target that is no label");
    }

    #[test]
    fn indirect_branches_are_refused() {
        let text = LISTING.replace("@P0 BRA `(.L_x_2)", "BRX R4 -0x10");
        let s = &parse_nvdisasm(&text).expect("parses")[0];
        let error = fast_path(s, 1, 0).expect_err("refused");
        assert!(format!("{error:#}").contains("indirect branch"), "{error:#}");
    }

    #[test]
    fn cuobjdump_instruction_lines() {
        let text = "        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n\
                                                                                    /* 0x000e220000000800 */\n\
                    /*0010*/                   S2R R2, SR_TID.X ;                   /* 0x0000000000027919 */\n\
                    \t\tFunction : k\n";
        assert_eq!(cuobjdump_count(text), 2);
    }
}
