//! MapReduce word count over a corpus of text files, the per-word counts summed through gdaki, checked
//! against a single-pass count (see the library's `wordcount` module for the method). Exits 1 on a
//! mismatch.
//!
//! `cargo run --release -p gdaki-workloads --bin wordcount -- --executor cpu [--nranks 4] [--corpus DIR]`

use std::process::ExitCode;

use clap::Parser;
use gdaki::exec::ExecutorKind;
use gdaki_workloads::wordcount::{read_corpus, run, DEFAULT_CORPUS};
use gdaki_workloads::{resolve_executor, Path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "MapReduce word count, per-word counts summed through gdaki")]
struct Args {
    /// Executor: cpu or gpu (default: the GPU if there is one, else cpu).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Mappers (ranks: threads of this process, 1 to 8).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=gdaki_shared::coll::MAX_RANKS as i64))]
    nranks: u32,
    /// How counts are summed: nic (fixed point, RDMA fetch-adds) or ring (ring reduce-scatter + all-gather, summed by device code).
    #[arg(long, value_enum, default_value_t = Path::Nic)]
    path: Path,
    /// Folder of text files (its regular files are read).
    #[arg(long, default_value = DEFAULT_CORPUS)]
    corpus: std::path::PathBuf,
    /// Most frequent words to print.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Writes the totals and the check as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    gdaki_examples::apply_queues(None);
    let corpus = match read_corpus(&args.corpus) {
        Ok(c) => c,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let executor = match resolve_executor(args.executor, 0) {
        Ok(k) => k,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let texts: Vec<String> = corpus.iter().map(|(_, t)| t.clone()).collect();
    let names: Vec<&str> = corpus.iter().map(|(n, _)| n.as_str()).collect();
    let r = match run(&texts, args.nranks, executor, args.path) {
        Ok(r) => r,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    gdaki_examples::outln!(
        "gdaki wordcount (commit {}): {} mappers on the {} executor, path {}, corpus {} ({} files: {})",
        gdaki_workloads::COMMIT,
        r.nranks,
        executor,
        args.path.name(),
        args.corpus.display(),
        r.files,
        names.join(" ")
    );
    gdaki_examples::outln!("top {} words:", args.top);
    for (i, (w, c)) in r.top(args.top).into_iter().enumerate() {
        gdaki_examples::outln!("{:>4}. {w:<16} {c}", i + 1);
    }
    gdaki_examples::outln!(
        "totals: {} lines, {} words, {} distinct; aggregation (vocabulary exchange + sum on rank 0) {:.1} ms",
        r.lines,
        r.total_words,
        r.vocabulary,
        r.aggregate_ms
    );
    let ok = r.mismatches == 0 && r.ranks_agree;
    gdaki_examples::outln!(
        "check against a single-process count: {} words differ, mappers {}: {}",
        r.mismatches,
        if r.ranks_agree { "agree" } else { "DISAGREE" },
        if ok { "OK" } else { "MISMATCH" }
    );
    if let Some(p) = &args.json {
        let text = match serde_json::to_string_pretty(&r) {
            Ok(t) => t,
            Err(e) => {
                gdaki_examples::eprintln_line!("error: --json: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(p, text + "\n") {
            gdaki_examples::eprintln_line!("error: --json {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
