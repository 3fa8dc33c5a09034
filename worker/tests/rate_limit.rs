//! `--rate-limit` across workers: the bucket lives in Redis, so two worker
//! processes of one queue together start no more jobs than the limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::json;
use workerpool_tests::{TestRedis, eventually};

mod common;
use common::{config, counter, len, processing_total, push, start};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::rate::RateLimit;
use workerpool_worker::{Handler, Job, Outcome};

/// Notes when each attempt started, with its job's id and attempt.
#[derive(Default)]
struct Starts(Mutex<Vec<(Instant, String, u32)>>);

impl Handler for Starts {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        let start = (Instant::now(), job.id().to_string(), job.attempt());
        self.0.lock().expect("lock").push(start);
        Box::pin(async { Outcome::Done })
    }
}

#[tokio::test]
async fn two_workers_together_start_no_more_jobs_than_the_rate_limit_and_run_each_once() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("limited");
    let jobs: Vec<String> = (0..200)
        .map(|n| json!({"task": "call", "data": {"n": n}}).to_string())
        .collect();
    push(&mut c, q.name(), &jobs).await;
    let limit: RateLimit = "20/s".parse().expect("limit");
    let handler = Arc::new(Starts::default());
    let workers: Vec<_> = ["rate-a", "rate-b"]
        .into_iter()
        .map(|id| {
            let mut config = config(&redis, &[q.name()], id);
            config.concurrency = 8;
            config.rate_limit = Some(limit);
            start(config, handler.clone())
        })
        .collect();
    eventually(Duration::from_secs(60), "200 jobs processed", || {
        let mut c = c.clone();
        let key = q.stats_processed();
        async move { (counter(&mut c, key).await == 200).then_some(()) }
    })
    .await;
    // Both register their limit, which `workerpool stats` and the dashboard show.
    let stats = workerpool_queue::snapshot::counts(&mut c, &q)
        .await
        .expect("snapshot");
    assert_eq!(stats.rate_limit.as_deref(), Some("20/s"));
    let limited: u64 = workers
        .iter()
        .map(|w| w.metrics.rate_limited.with_label_values(&[q.name()]).get())
        .sum();
    for w in workers {
        w.stop().await;
    }

    let mut starts = handler.0.lock().expect("lock").clone();
    starts.sort_by_key(|(at, _, _)| *at);
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for (_, id, attempt) in &starts {
        assert_eq!(
            *attempt, 1,
            "job {id}: held back jobs are not counted as attempts"
        );
        *runs.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(starts.len(), 200, "every job ran exactly once");
    assert_eq!(runs.len(), 200, "every job ran exactly once");
    assert_eq!(len(&mut c, q.name()).await, 0);
    assert_eq!(processing_total(&mut c, &q).await, 0);
    assert!(limited > 0, "the limit stopped fetches");

    // The guarantee is an upper bound: in any window of w seconds at most
    // 20 w + burst starts. The slack covers the handler starting a little
    // after Redis admitted the job, which can bunch starts up on a busy
    // machine; it never lets the 200 jobs run at the workers' own pace.
    let burst = f64::from(limit.burst());
    let slack = 4.0;
    for (i, (first, _, _)) in starts.iter().enumerate() {
        for (j, (last, _, _)) in starts.iter().enumerate().skip(i) {
            let window = last.duration_since(*first).as_secs_f64();
            let count = (j - i + 1) as f64;
            assert!(
                count <= limit.per_second() * window + burst + slack,
                "{count} starts within {window:.3}s: over 20/s"
            );
        }
    }
    let span = starts[199].0.duration_since(starts[0].0).as_secs_f64();
    assert!(
        span >= (200.0 - burst - slack) / limit.per_second(),
        "200 jobs at 20/s take about 10 s, not {span:.2}s"
    );
}
