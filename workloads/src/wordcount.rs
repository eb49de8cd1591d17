//! MapReduce word count over a text corpus, the per-word counts summed through gdaki.
//!
//! The default corpus is the license texts under `/usr/share/common-licenses` (Debian's `base-files`
//! package, on every Debian system): its regular files (the symbolic links there name the same texts
//! again), in name order. A word is a maximal run of alphanumeric characters, lowercased.
//!
//! Mapper (rank) `r` of `n` counts the words of lines `r, r + n, r + 2n, ...` of the corpus (its files'
//! lines, one after the other). The keys are agreed on the control plane: each mapper sends its sorted
//! distinct words to every other through the bootstrap's all-gather, and every mapper merges them into the
//! same sorted global vocabulary. The counts then go over the data path: each mapper writes its count of
//! every vocabulary word, as an `f32`, at the word's index, and the vectors are summed through
//! [`Aggregator::all_reduce_sum`] (on the NIC), so that every mapper ends with the global counts. The
//! result is checked against a count made in one pass over the whole corpus.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use gdaki::channel::RankSetup;
use gdaki::exec::ExecutorKind;
use serde::Serialize;

use crate::{on_ranks, Aggregator, Path};

/// The default corpus.
pub const DEFAULT_CORPUS: &str = "/usr/share/common-licenses";

/// Counts below this are exact in `f32`, and so are their sums on the NIC (see [`bound`]).
pub const EXACT_LIMIT: u64 = 1 << 24;

/// Reads the corpus: the regular files directly in `dir`, in name order, as (name, text).
///
/// # Errors
/// A one-line message: `dir` missing (naming the package that ships the default), unreadable, or holding
/// no regular file.
pub fn read_corpus(dir: &FsPath) -> Result<Vec<(String, String)>, String> {
    let missing = |e: std::io::Error| {
        format!(
            "corpus {}: {e} (the default is shipped by Debian's base-files package; pass --corpus DIR, a folder of \
             text files)",
            dir.display()
        )
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(missing)? {
        let entry = entry.map_err(missing)?;
        if entry.file_type().map_err(missing)?.is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(format!("corpus {}: no regular files", dir.display()));
    }
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let name = p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            Ok((name, String::from_utf8_lossy(&bytes).into_owned()))
        })
        .collect()
}

/// The words of `text`: maximal runs of alphanumeric characters, lowercased.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase)
}

/// Counts the words of mapper `rank`'s shard of `lines` (every `nranks`-th line from `rank`).
fn map(lines: &[&str], rank: usize, nranks: usize) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in lines.iter().skip(rank).step_by(nranks) {
        for w in words(line) {
            *counts.entry(w).or_insert(0) += 1;
        }
    }
    counts
}

/// The `max_abs` of the sum, from the largest mapper's word total `most` (every count of every mapper is at
/// most that), refusing counts that could not be summed exactly.
///
/// Why the sum is exact: let `c <= most < 2^24` be the counts, integers. An integer below `2^24` is an `f32`
/// exactly, so every input is exact, and so is `max_abs = most`. The NIC path quantizes `x` to `round(x *
/// s)` with `s` a power of two of at least 1 (the largest with `nranks * max_abs * s < 2^63`, and
/// `nranks * max_abs < 2^27 < 2^62`): `x * s` is an integer, so the rounding changes nothing. The integer
/// sum `Q = s * C` of the quantized counts is exact (the scale rule keeps it below `2^63`). `C`, the word's
/// global count, is at most the corpus's word total, which we require below `2^24`; so `Q` is an integer
/// of at most 24 significant bits times a power of two, exact in `f64`, `Q / s = C` is exact (a division
/// by a power of two), and `C < 2^24` is exact in `f32`. Hence every result is the integer count itself.
///
/// # Errors
/// A one-line message when the corpus has `2^24` words or more.
pub fn bound(total_words: u64, most: u64) -> Result<f32, String> {
    if total_words >= EXACT_LIMIT {
        return Err(format!(
            "the corpus has {total_words} words: counts summed as f32 are exact only below 2^24 = {EXACT_LIMIT}"
        ));
    }
    Ok(most.max(1) as f32)
}

/// One run's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct WordCount {
    /// Mappers.
    pub nranks: u32,
    /// Files of the corpus.
    pub files: usize,
    /// Lines of the corpus.
    pub lines: usize,
    /// Words of the corpus (the single-pass count).
    pub total_words: u64,
    /// Words in the agreed vocabulary.
    pub vocabulary: usize,
    /// The global counts the mappers got through gdaki, by word (rank 0's).
    #[serde(skip)]
    pub counts: BTreeMap<String, u64>,
    /// The single-pass counts.
    #[serde(skip)]
    pub reference: BTreeMap<String, u64>,
    /// Words whose count (rank 0's) differs from the single-pass count, or that one side lacks.
    pub mismatches: usize,
    /// Whether every mapper ended with the same counts.
    pub ranks_agree: bool,
    /// Wall time of the aggregation (vocabulary exchange and sum) on rank 0.
    pub aggregate_ms: f64,
}

impl WordCount {
    /// The `k` most frequent words, most frequent first (ties by word).
    pub fn top(&self, k: usize) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.counts.iter().map(|(w, &c)| (w.as_str(), c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.truncate(k);
        v
    }
}

/// Counts the words of `texts` with `nranks` mappers on `kind`, summing by `path`, and checks them against a
/// single-pass count.
///
/// # Errors
/// A one-line message: a corpus of `2^24` words or more, the collectives' or the bootstrap's errors, or a
/// count that did not come back as an integer.
pub fn run(texts: &[String], nranks: u32, kind: ExecutorKind, path: Path) -> Result<WordCount, String> {
    let lines: Vec<&str> = texts.iter().flat_map(|t| t.lines()).collect();
    let mut reference: BTreeMap<String, u64> = BTreeMap::new();
    for w in texts.iter().flat_map(|t| words(t)) {
        *reference.entry(w).or_insert(0) += 1;
    }
    let total_words: u64 = reference.values().sum();
    // Refused before any rank starts; each mapper checks its own bound again below.
    bound(total_words, total_words)?;
    let n = nranks.max(1) as usize;

    let per_rank = on_ranks(RankSetup::local(nranks, kind), path, |a: &Aggregator| {
        let rank = a.rank() as usize;
        let local = map(&lines, rank, n);
        let t0 = Instant::now();
        // Keys on the control plane: every mapper's distinct words (sorted, one per line) to every mapper.
        let mine: Vec<u8> = local.keys().flat_map(|w| w.bytes().chain([b'\n'])).collect();
        let all = a.bootstrap().all_gather(&mine).map_err(|e| format!("vocabulary exchange: {e}"))?;
        let mut vocab: BTreeSet<String> = BTreeSet::new();
        for part in &all {
            let text = std::str::from_utf8(part).map_err(|e| format!("vocabulary exchange: {e}"))?;
            vocab.extend(text.lines().map(str::to_owned));
        }
        // Each mapper's word total, for the agreed bound.
        let total: u64 = local.values().sum();
        let totals = a.bootstrap().all_gather(&total.to_le_bytes()).map_err(|e| format!("totals: {e}"))?;
        let totals: Vec<u64> =
            totals.iter().map(|b| u64::from_le_bytes(b.as_slice().try_into().unwrap_or_default())).collect();
        let max_abs = bound(totals.iter().sum(), totals.iter().copied().max().unwrap_or(0))?;
        let index: HashMap<&str, usize> = vocab.iter().enumerate().map(|(i, w)| (w.as_str(), i)).collect();
        let mut counts = vec![0f32; vocab.len()];
        for (w, &c) in &local {
            counts[index[w.as_str()]] = c as f32;
        }
        a.all_reduce_sum(&mut counts, max_abs)?;
        let elapsed = t0.elapsed();
        let mut out = BTreeMap::new();
        for (w, c) in vocab.into_iter().zip(counts) {
            if c.fract() != 0.0 || c < 0.0 {
                return Err(format!("the count of {w:?} came back as {c}, not a count"));
            }
            out.insert(w, c as u64);
        }
        Ok((out, elapsed))
    })?;

    let ranks_agree = per_rank.iter().all(|(c, _)| *c == per_rank[0].0);
    let (counts, elapsed): (BTreeMap<String, u64>, Duration) = per_rank.into_iter().next().unwrap_or_default();
    let keys: BTreeSet<&String> = counts.keys().chain(reference.keys()).collect();
    let mismatches = keys.into_iter().filter(|w| counts.get(*w) != reference.get(*w)).count();
    Ok(WordCount {
        nranks,
        files: texts.len(),
        lines: lines.len(),
        total_words,
        vocabulary: counts.len(),
        counts,
        reference,
        mismatches,
        ranks_agree,
        aggregate_ms: elapsed.as_secs_f64() * 1e3,
    })
}
