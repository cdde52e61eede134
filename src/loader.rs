//! The data loader: epoch batch order, and worker threads that build batches ahead of the
//! training loop. Owns batching order, the worker pool, prefetch and worker lifetime; the
//! per-batch work (augment, normalise, stage for copy) is a function the caller passes in,
//! so this module knows nothing of tensors or devices.
//!
//! Order is PyTorch's: batch `i` of an epoch is built by worker `i % workers` and delivered
//! in index order, so the batches a seed gives are the same for any number of workers
//! (Burn's own multi-thread loader delivers whichever batch is ready first).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::rng::SplitMix64;

#[derive(Debug, Clone, PartialEq)]
pub struct LoaderConfig {
    pub batch_size: usize,
    pub workers: usize,
    pub persistent_workers: bool,
    /// Finished batches each worker may hold for the consumer (PyTorch's `prefetch_factor`).
    pub prefetch: usize,
    pub shuffle: bool,
    /// Drops the batches that do not make a whole optimizer step: the last batch when it
    /// is short, and after it the batches too few for `step_batches` of them.
    pub drop_last: bool,
    /// Micro-batches of an optimizer step (`optim.accumulation_steps`).
    pub step_batches: usize,
    pub seed: u64,
    pub batching: Batching,
}

/// How samples are grouped into batches.
#[derive(Debug, Clone, PartialEq)]
pub enum Batching {
    /// Consecutive samples of the (shuffled) order.
    Sequential,
    /// Samples of similar length together (see `data::pad::bucket_batches`).
    Buckets {
        lengths: Arc<Vec<usize>>,
        bounds: Vec<usize>,
    },
}

/// The sample indices of every batch of an epoch, in delivery order.
pub fn epoch_batches(n: usize, cfg: &LoaderConfig, epoch: usize) -> Vec<Vec<usize>> {
    let mut batches = batches_of(n, cfg, epoch);
    // With drop_last, what would make a short optimizer step goes too: a step is then
    // always `batch_size × step_batches` samples, as one batch that large would be (a
    // short step at full learning rate took what the large batch dropped).
    if cfg.drop_last {
        let step = cfg.step_batches.max(1);
        batches.truncate(batches.len() / step * step);
    }
    batches
}

fn batches_of(n: usize, cfg: &LoaderConfig, epoch: usize) -> Vec<Vec<usize>> {
    if let Batching::Buckets { lengths, bounds } = &cfg.batching {
        return crate::data::pad::bucket_batches(
            lengths,
            bounds,
            cfg.batch_size,
            cfg.step_batches,
            cfg.shuffle,
            cfg.drop_last,
            cfg.seed,
            epoch,
        );
    }
    let mut order: Vec<usize> = (0..n).collect();
    if cfg.shuffle {
        SplitMix64::new(cfg.seed)
            .fork(epoch as u64)
            .shuffle(&mut order);
    }
    let bs = cfg.batch_size.max(1);
    order
        .chunks(bs)
        .filter(|c| !(cfg.drop_last && c.len() < bs))
        .map(<[usize]>::to_vec)
        .collect()
}

/// What the workers run for each batch: (sample indices, epoch) → a prepared batch.
pub type MakeBatch<T> = Arc<dyn Fn(&[usize], usize) -> T + Send + Sync>;

/// Counters that show the knobs at work.
#[derive(Debug, Default)]
pub struct LoaderStats {
    /// Worker threads started so far (workers × epochs without persistence, workers with it).
    pub workers_started: AtomicUsize,
    /// Batches built and not yet taken by the consumer, and the most there ever were.
    pub ahead: AtomicUsize,
    pub max_ahead: AtomicUsize,
}

/// One delivered batch.
pub struct Delivered<T> {
    pub value: T,
    pub samples: usize,
    /// Time the consumer waited for it (with no workers: the time to build it).
    pub wait: Duration,
}

struct Task {
    epoch: usize,
    batches: Arc<Vec<Vec<usize>>>,
    /// The batch indices of the epoch this worker builds: `w, w + workers, ...`.
    mine: Vec<usize>,
}

struct Worker<T> {
    tasks: Option<Sender<Task>>,
    out: Receiver<(usize, T)>,
    handle: Option<JoinHandle<()>>,
}

impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        // Closing the task channel ends the worker's loop; a worker blocked on a full output
        // channel is released when `out` is dropped with the struct, after this returns.
        self.tasks.take();
    }
}

pub struct Loader<T: Send + 'static> {
    cfg: LoaderConfig,
    samples: usize,
    make: MakeBatch<T>,
    pool: Vec<Worker<T>>,
    pub stats: Arc<LoaderStats>,
}

impl<T: Send + 'static> Loader<T> {
    pub fn new(cfg: LoaderConfig, samples: usize, make: MakeBatch<T>) -> Self {
        Self {
            cfg,
            samples,
            make,
            pool: vec![],
            stats: Arc::new(LoaderStats::default()),
        }
    }

    /// Starts worker `w`; `Err` says why the system would not start its thread.
    fn spawn(&self, w: usize) -> Result<Worker<T>, String> {
        let (task_tx, task_rx) = mpsc::channel::<Task>();
        let (out_tx, out_rx) = mpsc::sync_channel::<(usize, T)>(self.cfg.prefetch.max(1) - 1);
        let make = Arc::clone(&self.make);
        let stats = Arc::clone(&self.stats);
        let handle = std::thread::Builder::new()
            .name(format!("loader-{w}"))
            .spawn(move || worker_loop(task_rx, out_tx, make, stats))
            .map_err(|e| {
                format!(
                    "loader worker {} of {} could not be started: {e}; lower loader.workers (each worker is a thread, with its own stack and, under glibc, memory arena: a tight `ulimit -v` or `ulimit -u` allows few)",
                    w + 1,
                    self.cfg.workers
                )
            })?;
        self.stats.workers_started.fetch_add(1, Ordering::Relaxed);
        Ok(Worker {
            tasks: Some(task_tx),
            out: out_rx,
            handle: Some(handle),
        })
    }

    /// The batches of one epoch, in order. Without persistence, workers start here and end
    /// when the iterator is dropped. `Err` where a worker could not be started (those that
    /// were are stopped again).
    pub fn epoch(&mut self, epoch: usize) -> Result<EpochIter<'_, T>, String> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of one epoch from batch `skip` on: what a resumed run has left of the
    /// epoch it stopped in. Each batch is the one the whole epoch would have delivered
    /// (order and augmentation depend on the seed, the epoch and the sample only).
    pub fn epoch_from(&mut self, epoch: usize, skip: usize) -> Result<EpochIter<'_, T>, String> {
        let batches = Arc::new(epoch_batches(self.samples, &self.cfg, epoch));
        let w = self.cfg.workers;
        if w > 0 {
            if !self.cfg.persistent_workers || self.pool.is_empty() {
                self.shutdown();
                for i in 0..w {
                    match self.spawn(i) {
                        Ok(worker) => self.pool.push(worker),
                        Err(e) => {
                            self.shutdown();
                            return Err(e);
                        }
                    }
                }
            }
            for (i, worker) in self.pool.iter().enumerate() {
                let mine = (i..batches.len())
                    .step_by(w)
                    .filter(|&b| b >= skip)
                    .collect();
                let task = Task {
                    epoch,
                    batches: Arc::clone(&batches),
                    mine,
                };
                if let Some(t) = &worker.tasks {
                    let _ = t.send(task);
                }
            }
        }
        Ok(EpochIter {
            loader: self,
            epoch,
            next: skip.min(batches.len()),
            batches,
        })
    }

    fn shutdown(&mut self) {
        for mut w in self.pool.drain(..) {
            w.tasks.take();
            let handle = w.handle.take();
            drop(w);
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
    }
}

impl<T: Send + 'static> Drop for Loader<T> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker_loop<T>(
    tasks: Receiver<Task>,
    out: SyncSender<(usize, T)>,
    make: MakeBatch<T>,
    stats: Arc<LoaderStats>,
) {
    while let Ok(task) = tasks.recv() {
        for &b in &task.mine {
            let value = make(&task.batches[b], task.epoch);
            let now = stats.ahead.fetch_add(1, Ordering::AcqRel) + 1;
            stats.max_ahead.fetch_max(now, Ordering::AcqRel);
            if out.send((task.epoch, value)).is_err() {
                return;
            }
        }
    }
}

pub struct EpochIter<'a, T: Send + 'static> {
    loader: &'a mut Loader<T>,
    epoch: usize,
    batches: Arc<Vec<Vec<usize>>>,
    next: usize,
}

impl<T: Send + 'static> EpochIter<'_, T> {
    /// Batches still to come.
    pub fn len(&self) -> usize {
        self.batches.len() - self.next
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The samples of the next `k` batches (fewer where the epoch has fewer): what an
    /// optimizer step of `k` micro-batches weighs each of them against.
    pub fn samples_ahead(&self, k: usize) -> usize {
        self.batches[self.next..].iter().take(k).map(Vec::len).sum()
    }
}

impl<T: Send + 'static> Iterator for EpochIter<'_, T> {
    type Item = Delivered<T>;

    fn next(&mut self) -> Option<Delivered<T>> {
        let i = self.next;
        let indices = self.batches.get(i)?;
        self.next += 1;
        let start = Instant::now();
        let w = self.loader.cfg.workers;
        let value = if w == 0 {
            (self.loader.make)(indices, self.epoch)
        } else {
            let worker = &self.loader.pool[i % w];
            loop {
                match worker.out.recv() {
                    // A persistent worker may still hold batches of an epoch cut short.
                    Ok((e, _)) if e != self.epoch => {
                        self.loader.stats.ahead.fetch_sub(1, Ordering::AcqRel);
                    }
                    Ok((_, v)) => {
                        self.loader.stats.ahead.fetch_sub(1, Ordering::AcqRel);
                        break v;
                    }
                    Err(_) => panic!("loader worker {} stopped unexpectedly", i % w),
                }
            }
        };
        Some(Delivered {
            value,
            samples: indices.len(),
            wait: start.elapsed(),
        })
    }
}

impl<T: Send + 'static> Drop for EpochIter<'_, T> {
    fn drop(&mut self) {
        if !self.loader.cfg.persistent_workers {
            self.loader.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(workers: usize, persistent: bool) -> LoaderConfig {
        LoaderConfig {
            batch_size: 4,
            workers,
            persistent_workers: persistent,
            prefetch: 2,
            shuffle: true,
            drop_last: false,
            step_batches: 1,
            seed: 9,
            batching: Batching::Sequential,
        }
    }

    fn ids() -> MakeBatch<Vec<usize>> {
        Arc::new(|idx: &[usize], _| {
            // Uneven work, so workers finish out of order.
            std::thread::sleep(Duration::from_micros((idx[0] % 5) as u64 * 300));
            idx.to_vec()
        })
    }

    #[test]
    fn batches_cover_every_sample_once_and_drop_last_drops() {
        let c = cfg(0, false);
        let b = epoch_batches(10, &c, 0);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        let mut all: Vec<usize> = b.concat();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        let d = LoaderConfig {
            drop_last: true,
            ..c.clone()
        };
        assert_eq!(epoch_batches(10, &d, 0).len(), 2);
        // Steps of 3 batches: 9 samples of 31 make 7 whole batches, 2 whole steps.
        let steps = LoaderConfig {
            step_batches: 3,
            ..d.clone()
        };
        assert_eq!(epoch_batches(31, &steps, 0).len(), 6);
        let kept = LoaderConfig {
            drop_last: false,
            ..steps
        };
        assert_eq!(epoch_batches(31, &kept, 0).len(), 8);
        assert_ne!(
            epoch_batches(10, &c, 0),
            epoch_batches(10, &c, 1),
            "reshuffled each epoch"
        );
        let s = LoaderConfig {
            shuffle: false,
            ..c
        };
        assert_eq!(epoch_batches(10, &s, 3)[0], vec![0, 1, 2, 3]);
    }

    #[test]
    fn order_is_the_same_for_any_worker_count() {
        let run = |w: usize, p: bool| -> Vec<Vec<usize>> {
            let mut l = Loader::new(cfg(w, p), 37, ids());
            (0..3)
                .flat_map(|e| l.epoch(e).unwrap().map(|d| d.value).collect::<Vec<_>>())
                .collect()
        };
        let want = run(0, false);
        for w in [1, 2, 3, 4] {
            assert_eq!(run(w, false), want, "workers = {w}");
            assert_eq!(run(w, true), want, "workers = {w}, persistent");
        }
    }

    #[test]
    fn persistent_workers_start_once() {
        for (persistent, started) in [(false, 3 * 4), (true, 3)] {
            let mut l = Loader::new(cfg(3, persistent), 20, ids());
            for e in 0..4 {
                for _ in l.epoch(e).unwrap() {}
            }
            assert_eq!(
                l.stats.workers_started.load(Ordering::Relaxed),
                started,
                "persistent = {persistent}"
            );
        }
    }

    #[test]
    fn prefetch_bounds_the_batches_built_ahead() {
        for prefetch in [1, 3] {
            let c = LoaderConfig {
                prefetch,
                ..cfg(2, false)
            };
            let mut l = Loader::new(c, 200, Arc::new(|idx: &[usize], _| idx.len()));
            for d in l.epoch(0).unwrap() {
                // A slow consumer lets the workers run as far ahead as they may.
                std::thread::sleep(Duration::from_millis(2));
                let _ = d;
            }
            let max = l.stats.max_ahead.load(Ordering::Relaxed);
            // Each worker holds at most `prefetch` finished batches, plus the one it is
            // building when the consumer takes one (counted before the consumer's receipt).
            assert!(
                max <= 2 * (prefetch + 1),
                "prefetch {prefetch}: {max} batches ahead"
            );
            assert!(
                max >= 2 * prefetch - 1,
                "prefetch {prefetch}: workers never ran ahead ({max})"
            );
        }
    }

    #[test]
    fn an_epoch_resumed_at_batch_k_delivers_the_rest_of_the_same_epoch() {
        for workers in [0, 3] {
            let full: Vec<_> = Loader::new(cfg(workers, false), 41, ids())
                .epoch(2)
                .unwrap()
                .map(|d| d.value)
                .collect();
            let mut l = Loader::new(cfg(workers, false), 41, ids());
            let it = l.epoch_from(2, 4).unwrap();
            assert_eq!(it.len(), full.len() - 4);
            let rest: Vec<_> = it.map(|d| d.value).collect();
            assert_eq!(rest, full[4..], "workers = {workers}");
        }
    }

    #[test]
    fn an_epoch_cut_short_leaves_no_stale_batch() {
        let mut l = Loader::new(cfg(2, true), 40, ids());
        let first: Vec<_> = l.epoch(0).unwrap().take(2).map(|d| d.value).collect();
        assert_eq!(first.len(), 2);
        let next: Vec<_> = l.epoch(1).unwrap().map(|d| d.value).collect();
        assert_eq!(next, epoch_batches(40, &cfg(2, true), 1));
    }
}
