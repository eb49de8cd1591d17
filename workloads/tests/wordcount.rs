//! Word count on the `cpu` executor, counts summed on the NIC, against a count made here.

use std::collections::BTreeMap;

use gdaki::exec::ExecutorKind;
use gdaki_workloads::wordcount::{bound, read_corpus, run, DEFAULT_CORPUS, EXACT_LIMIT};
use gdaki_workloads::Path;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Random texts over a small alphabet (so that words repeat), with punctuation, case and line breaks.
fn texts(seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..3)
        .map(|_| {
            (0..rng.random_range(200..400))
                .map(|_| {
                    let len = rng.random_range(1..4);
                    let w: String = (0..len).map(|_| ["a", "B", "c", "d", "é"][rng.random_range(0..5)]).collect();
                    let sep = [" ", ", ", "\n", ". ", "--"][rng.random_range(0..5)];
                    w + sep
                })
                .collect()
        })
        .collect()
}

/// The counts made here, independently of the library's splitter.
fn count(texts: &[String]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for t in texts {
        let mut w = String::new();
        for c in t.chars().chain([' ']) {
            if c.is_alphanumeric() {
                w.extend(c.to_lowercase());
            } else if !w.is_empty() {
                *m.entry(std::mem::take(&mut w)).or_insert(0) += 1;
            }
        }
    }
    m
}

#[test]
fn cpu_counts_equal_a_single_process_count() {
    let mut t = texts(1);
    // A real license text too, when the system has one.
    if let Ok(c) = read_corpus(std::path::Path::new(DEFAULT_CORPUS)) {
        if let Some((_, text)) = c.into_iter().find(|(n, _)| n == "Apache-2.0") {
            t.push(text);
        }
    }
    let want = count(&t);
    for n in [1, 3] {
        let r = run(&t, n, ExecutorKind::Cpu, Path::Nic).expect("word count");
        assert!(r.ranks_agree, "{n} mappers disagree");
        assert_eq!(r.counts, want, "{n} mappers");
        assert_eq!(r.mismatches, 0);
        assert_eq!(r.total_words, want.values().sum::<u64>());
    }
}

#[test]
fn counts_too_large_for_f32_are_refused() {
    assert!(bound(EXACT_LIMIT - 1, 10).is_ok());
    assert!(bound(EXACT_LIMIT, 10).is_err());
}

#[test]
fn a_missing_corpus_says_where_it_comes_from() {
    let e = read_corpus(std::path::Path::new("/nonexistent-corpus-dir")).expect_err("missing corpus");
    assert!(e.contains("base-files"), "{e}");
}
