//! Data-parallel training of a one-hidden-layer MLP on the iris data set (150 flowers, 4 measurements, 3
//! species; shipped inside the `linfa-datasets` crate), its gradients by candle's automatic differentiation
//! (CPU), summed over the ranks through gdaki.
//!
//! The data is shuffled with a fixed seed and split into a test set (the first fifth) and a training set,
//! standardized with the training set's mean and deviation. Rank `r` of `n` holds shard `r` of the training
//! set (`ntrain / n` examples each, the remainder left out of every shard). Every rank starts from the same
//! weights (drawn from the seed). Each step every rank takes its next local batch, computes the gradient of
//! its mean cross-entropy, clips every element to `[-clip, clip]`, and sums the flat gradient with every
//! other rank's through [`Aggregator::all_reduce_sum`] with `max_abs = clip`: the bound is agreed because
//! it is the clip value every rank applies before quantizing, a setting of the run, so no value can exceed
//! it. Every rank then applies `lr * sum / n` to its weights: since every rank receives the same bytes and
//! does the same arithmetic, the weights stay bitwise equal across ranks.
//!
//! The single-rank reference trains on the whole training set with the same seed and initial weights, each
//! step on the union of the ranks' local batches of that step (so its mean gradient is what the ranks'
//! average would be without quantization), clipped the same way.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};
use gdaki::bootstrap::Launch;
use gdaki::channel::RankSetup;
use gdaki::exec::ExecutorKind;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::{on_ranks, Aggregator, Path};

/// Measurements per flower.
const FEATURES: usize = 4;
/// Species.
const CLASSES: usize = 3;

/// A training run's settings.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Ranks (1 to 8), threads of this process; ignored with [`TrainConfig::launch`].
    pub nranks: u32,
    /// This process's rank of a multi-process launch (one rank per process, its world size the rank count),
    /// or `None` for every rank in this process.
    pub launch: Option<Launch>,
    /// The GPU of every rank on the `gpu` executor (`None`: by local rank, [`RankSetup::gpu`]).
    pub gpu: Option<usize>,
    /// Bound of each rank's bootstrap setup ([`RankSetup::timeout`]).
    pub bootstrap_timeout: std::time::Duration,
    /// The wire of this process's NIC with [`TrainConfig::launch`] ([`RankSetup::wire`]).
    pub wire: gdaki::nic::emu::WireConfig,
    /// Executor of every rank.
    pub executor: ExecutorKind,
    /// How gradients are summed.
    pub path: Path,
    /// Passes over each rank's shard.
    pub epochs: usize,
    /// Examples per rank per step (the single-rank run takes `nranks` times as many).
    pub batch: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Learning rate of plain SGD.
    pub lr: f32,
    /// Every gradient element is clipped to `[-clip, clip]` before it is summed; the sum's `max_abs`.
    pub clip: f32,
    /// Seed of the split, the initial weights and the batches.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            nranks: 4,
            launch: None,
            gpu: None,
            bootstrap_timeout: std::time::Duration::from_secs(60),
            wire: gdaki::nic::emu::WireConfig::loopback(),
            executor: ExecutorKind::Cpu,
            path: Path::Nic,
            epochs: 60,
            batch: 6,
            hidden: 16,
            lr: 0.3,
            clip: 4.0,
            seed: 7,
        }
    }
}

/// Loss and accuracy after one epoch.
#[derive(Clone, Debug, Serialize)]
pub struct EpochRow {
    /// 1-based epoch.
    pub epoch: usize,
    /// Mean cross-entropy over the whole training set.
    pub train_loss: f32,
    /// Fraction of the test set classified right.
    pub test_accuracy: f32,
}

/// What one run (distributed or single-rank) gave.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// By epoch.
    pub curve: Vec<EpochRow>,
    /// Median wall time of one step (gradient, sum, update) in ms.
    pub step_ms_median: f64,
    /// Median wall time of the gradient sum alone in ms (0 for the single-rank run).
    pub sum_ms_median: f64,
    /// Gradient elements clipped, over the run (all ranks).
    pub clipped: u64,
    /// The final weights (rank 0's), flat: hidden weights, hidden biases, output weights, output biases.
    #[serde(skip)]
    pub weights: Vec<f32>,
}

/// Both runs and how they compare.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    /// Commit of the code.
    pub commit: &'static str,
    /// Ranks of the distributed run.
    pub nranks: u32,
    /// Where the ranks ran: `"threads of one process"`, or one process per rank and the launcher's name.
    pub ranks_in: String,
    /// Executor name (`cpu` or `gpu`).
    pub executor: String,
    /// Aggregation path name.
    pub path: &'static str,
    /// Training and test examples.
    pub train_examples: usize,
    /// Test examples.
    pub test_examples: usize,
    /// Examples per rank shard.
    pub shard_examples: usize,
    /// Parameters (gradient values summed per step).
    pub parameters: usize,
    /// Steps per epoch.
    pub steps_per_epoch: usize,
    /// The distributed run.
    pub distributed: RunResult,
    /// The single-rank reference.
    pub single: RunResult,
    /// Largest `|w_r - w_0|` over ranks `r` and weights after training (0 when all ranks agree).
    pub max_rank_weight_diff: f32,
    /// Largest `|w - w_single|` between the distributed and single-rank weights.
    pub max_single_weight_diff: f32,
}

/// The iris data, split and standardized.
struct Data {
    train_x: Vec<f32>,
    train_y: Vec<u32>,
    test_x: Vec<f32>,
    test_y: Vec<u32>,
}

impl Data {
    fn load(seed: u64) -> Result<Self, String> {
        let ds = linfa_datasets::iris();
        let (x, y) = (&ds.records, &ds.targets);
        let n = x.nrows();
        if x.ncols() != FEATURES || y.len() != n || y.iter().any(|&c| c >= CLASSES) {
            return Err(format!("iris: unexpected shape {}x{} with {} targets", n, x.ncols(), y.len()));
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed));
        let (test, train) = order.split_at(n / 5);
        let row = |i: usize| (0..FEATURES).map(move |j| x[[i, j]] as f32);
        let mut mean = [0f32; FEATURES];
        let mut dev = [0f32; FEATURES];
        for &i in train {
            row(i).enumerate().for_each(|(j, v)| mean[j] += v / train.len() as f32);
        }
        for &i in train {
            row(i).enumerate().for_each(|(j, v)| dev[j] += (v - mean[j]).powi(2) / train.len() as f32);
        }
        let scaled = |idx: &[usize]| -> Vec<f32> {
            idx.iter().flat_map(|&i| row(i).enumerate().map(|(j, v)| (v - mean[j]) / dev[j].sqrt())).collect()
        };
        let labels = |idx: &[usize]| idx.iter().map(|&i| y[i] as u32).collect();
        Ok(Self { train_x: scaled(train), train_y: labels(train), test_x: scaled(test), test_y: labels(test) })
    }

    fn ntrain(&self) -> usize {
        self.train_y.len()
    }

    /// Rows `idx` of the training set as (features, labels).
    fn batch(&self, idx: &[usize]) -> (Vec<f32>, Vec<u32>) {
        let x = idx.iter().flat_map(|&i| self.train_x[i * FEATURES..][..FEATURES].iter().copied()).collect();
        (x, idx.iter().map(|&i| self.train_y[i]).collect())
    }
}

/// The MLP's parameter shapes, in the flat order.
fn shapes(hidden: usize) -> [Vec<usize>; 4] {
    [vec![FEATURES, hidden], vec![hidden], vec![hidden, CLASSES], vec![CLASSES]]
}

/// Initial weights from `seed`: uniform in `±1/sqrt(fan_in)`, biases 0.
fn init(hidden: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut w = Vec::new();
    for (k, s) in shapes(hidden).iter().enumerate() {
        let len: usize = s.iter().product();
        let a = 1.0 / (s[0] as f32).sqrt();
        w.extend((0..len).map(|_| if k % 2 == 0 { rng.random_range(-a..a) } else { 0.0 }));
    }
    w
}

/// The parameters as candle variables.
fn vars(w: &[f32], hidden: usize) -> candle_core::Result<Vec<Var>> {
    let mut at = 0;
    shapes(hidden)
        .iter()
        .map(|s| {
            let len: usize = s.iter().product();
            let v = Var::from_slice(&w[at..at + len], s.as_slice(), &Device::Cpu);
            at += len;
            v
        })
        .collect()
}

/// Logits of `rows` examples `x`.
fn forward(p: &[Var], x: &[f32], rows: usize) -> candle_core::Result<Tensor> {
    let x = Tensor::from_slice(x, (rows, FEATURES), &Device::Cpu)?;
    let h = x.matmul(p[0].as_tensor())?.broadcast_add(p[1].as_tensor())?.relu()?;
    h.matmul(p[2].as_tensor())?.broadcast_add(p[3].as_tensor())
}

/// Mean cross-entropy of `x`, `y` and its gradient by every parameter, flat.
fn gradient(w: &[f32], hidden: usize, x: &[f32], y: &[u32]) -> candle_core::Result<Vec<f32>> {
    let p = vars(w, hidden)?;
    let y = Tensor::from_slice(y, y.len(), &Device::Cpu)?;
    let loss = candle_nn::loss::cross_entropy(&forward(&p, x, y.dims1()?)?, &y)?;
    let grads = loss.backward()?;
    let mut g = Vec::with_capacity(w.len());
    for v in &p {
        match grads.get(v.as_tensor()) {
            Some(t) => g.extend(t.flatten_all()?.to_vec1::<f32>()?),
            None => g.extend(std::iter::repeat_n(0.0, v.elem_count())),
        }
    }
    Ok(g)
}

/// (training loss, test accuracy) of weights `w`.
fn evaluate(w: &[f32], hidden: usize, d: &Data) -> candle_core::Result<(f32, f32)> {
    let p = vars(w, hidden)?;
    let y = Tensor::from_slice(&d.train_y, d.ntrain(), &Device::Cpu)?;
    let loss = candle_nn::loss::cross_entropy(&forward(&p, &d.train_x, d.ntrain())?, &y)?.to_scalar::<f32>()?;
    let pred = forward(&p, &d.test_x, d.test_y.len())?.argmax(1)?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
    let right = pred.iter().zip(&d.test_y).filter(|(a, b)| a == b).count();
    Ok((loss, right as f32 / d.test_y.len() as f32))
}

/// Training-set indices of rank `rank`'s batch `step` of epoch `epoch`: its shard shuffled by a seed of
/// (run seed, epoch, rank).
fn local_batch(cfg: &TrainConfig, shard: usize, epoch: usize, rank: u32, step: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (rank as usize * shard..(rank as usize + 1) * shard).collect();
    let s = cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((epoch as u64) << 8) ^ rank as u64;
    order.shuffle(&mut StdRng::seed_from_u64(s));
    order[step * cfg.batch..(step + 1) * cfg.batch].to_vec()
}

/// Fails, saying the training diverged, when a gradient or weight of `v` (after step `step` of epoch `epoch`,
/// both 0-based) is an infinity or a NaN: too large a learning rate overflows the weights, and a NaN gradient
/// would otherwise be refused by the sum as a value out of the clip's bound.
fn check_finite(v: &[f32], cfg: &TrainConfig, epoch: usize, step: usize) -> Result<(), String> {
    match v.iter().find(|x| !x.is_finite()) {
        None => Ok(()),
        Some(x) => Err(format!(
            "the training diverged at epoch {} step {}: a value became {x} (try a smaller --lr than {})",
            epoch + 1,
            step + 1,
            cfg.lr
        )),
    }
}

/// Clips every element of `g` to `[-clip, clip]`; how many were clipped.
fn clip(g: &mut [f32], clip: f32) -> u64 {
    let mut n = 0;
    for v in g {
        if v.abs() > clip {
            *v = v.clamp(-clip, clip);
            n += 1;
        }
    }
    n
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Runs the distributed training and, where rank 0 runs, the single-rank reference with `cfg`. Every rank
/// learns every rank's final weights and clip count (a bootstrap all-gather), so the comparison holds across
/// processes too. Returns the report where rank 0 ran, `None` in a process of other ranks.
///
/// # Errors
/// A one-line message: bad settings (a batch larger than a shard, a clip that is not positive and
/// finite), a run that diverged (a gradient or weight became an infinity or a NaN: too large a learning
/// rate), the collectives' errors, candle's errors.
pub fn run(cfg: &TrainConfig) -> Result<Option<TrainReport>, String> {
    if !(cfg.clip.is_finite() && cfg.clip > 0.0) {
        return Err(format!("--clip must be positive and finite, not {}", cfg.clip));
    }
    let d = Data::load(cfg.seed)?;
    let nranks = cfg.launch.as_ref().map_or(cfg.nranks, |l| l.world_size);
    let n = nranks.max(1) as usize;
    let shard = d.ntrain() / n;
    if cfg.batch == 0 || cfg.batch > shard {
        return Err(format!(
            "--batch must be 1 to {shard} (a shard of {} training examples over {n} ranks)",
            d.ntrain()
        ));
    }
    let steps = shard / cfg.batch;
    let w0 = init(cfg.hidden, cfg.seed);
    let ce = |e: candle_core::Error| format!("candle: {e}");

    let setup = RankSetup {
        launch: cfg.launch.clone(),
        gpu: cfg.gpu,
        timeout: cfg.bootstrap_timeout,
        wire: cfg.wire,
        ..RankSetup::local(nranks, cfg.executor)
    };
    let ranks = on_ranks(setup, cfg.path, |a: &Aggregator| {
        let rank = a.rank();
        let mut w = w0.clone();
        let (mut curve, mut step_t, mut sum_t, mut clipped) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for epoch in 0..cfg.epochs {
            for step in 0..steps {
                let t0 = Instant::now();
                let (x, y) = d.batch(&local_batch(cfg, shard, epoch, rank, step));
                let mut g = gradient(&w, cfg.hidden, &x, &y).map_err(ce)?;
                // Before the sum: a gradient that is not finite would fail there as a value out of bound.
                check_finite(&g, cfg, epoch, step)?;
                clipped += clip(&mut g, cfg.clip);
                let t1 = Instant::now();
                a.all_reduce_sum(&mut g, cfg.clip)?;
                sum_t.push(t1.elapsed());
                for (wi, gi) in w.iter_mut().zip(&g) {
                    *wi -= cfg.lr * (gi / n as f32);
                }
                check_finite(&w, cfg, epoch, step)?;
                step_t.push(t0.elapsed());
            }
            if rank == 0 {
                let (train_loss, test_accuracy) = evaluate(&w, cfg.hidden, &d).map_err(ce)?;
                curve.push(EpochRow { epoch: epoch + 1, train_loss, test_accuracy });
            }
        }
        let mine =
            RunResult { curve, step_ms_median: median(step_t), sum_ms_median: median(sum_t), clipped, weights: w };
        let (max_diff, clipped) = compare_ranks(a, &mine)?;
        Ok((rank, RunResult { clipped, ..mine }, max_diff))
    })?;
    let Some((_, distributed, max_rank_weight_diff)) = ranks.into_iter().find(|(rank, ..)| *rank == 0) else {
        return Ok(None);
    };

    let mut w = w0.clone();
    let (mut curve, mut step_t, mut clipped) = (Vec::new(), Vec::new(), 0);
    for epoch in 0..cfg.epochs {
        for step in 0..steps {
            let t0 = Instant::now();
            let idx: Vec<usize> = (0..n as u32).flat_map(|r| local_batch(cfg, shard, epoch, r, step)).collect();
            let (x, y) = d.batch(&idx);
            let mut g = gradient(&w, cfg.hidden, &x, &y).map_err(ce)?;
            check_finite(&g, cfg, epoch, step).map_err(|e| format!("single-rank run: {e}"))?;
            clipped += clip(&mut g, cfg.clip);
            for (wi, gi) in w.iter_mut().zip(&g) {
                *wi -= cfg.lr * gi;
            }
            check_finite(&w, cfg, epoch, step).map_err(|e| format!("single-rank run: {e}"))?;
            step_t.push(t0.elapsed());
        }
        let (train_loss, test_accuracy) = evaluate(&w, cfg.hidden, &d).map_err(ce)?;
        curve.push(EpochRow { epoch: epoch + 1, train_loss, test_accuracy });
    }
    let single = RunResult { curve, step_ms_median: median(step_t), sum_ms_median: 0.0, clipped, weights: w };

    let max_single_weight_diff = max_diff(&distributed.weights, &single.weights);
    Ok(Some(TrainReport {
        commit: crate::COMMIT,
        nranks,
        ranks_in: match &cfg.launch {
            None => "threads of one process".into(),
            Some(l) => format!("one process per rank ({})", l.source),
        },
        executor: cfg.executor.to_string(),
        path: cfg.path.name(),
        train_examples: d.ntrain(),
        test_examples: d.test_y.len(),
        shard_examples: shard,
        parameters: w0.len(),
        steps_per_epoch: steps,
        distributed,
        single,
        max_rank_weight_diff,
        max_single_weight_diff,
    }))
}

/// Largest `|x - y|` over the pairs of `a` and `b`.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// Every rank's final weights and clip count, gathered over the bootstrap: the largest difference of any
/// rank's weights from rank 0's (0 when all agree), and the clips of all ranks.
fn compare_ranks(a: &Aggregator, mine: &RunResult) -> Result<(f32, u64), String> {
    let mut bytes = mine.clipped.to_le_bytes().to_vec();
    bytes.extend(mine.weights.iter().flat_map(|w| w.to_le_bytes()));
    let all = a.bootstrap().all_gather(&bytes).map_err(|e| format!("rank {}: gathering the weights: {e}", a.rank()))?;
    let decode = |b: &[u8]| -> (u64, Vec<f32>) {
        let (c, w) = b.split_at(8.min(b.len()));
        let clipped = c.try_into().map_or(0, u64::from_le_bytes);
        (clipped, w.chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().unwrap_or_default())).collect())
    };
    let ranks: Vec<_> = all.iter().map(|b| decode(b)).collect();
    let w0 = &ranks[0].1;
    let mut diff = 0f32;
    for (_, w) in &ranks {
        // A rank with fewer weights than rank 0 differs by infinity: a bug, not a rounding.
        diff = diff.max(if w.len() == w0.len() { max_diff(w, w0) } else { f32::INFINITY });
    }
    Ok((diff, ranks.iter().map(|r| r.0).sum()))
}
