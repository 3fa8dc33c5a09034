//! The queue's mean job duration (`<q>:stats:duration`): folded by the
//! workers' heartbeats, kept without expiry, read by the snapshot.

use std::time::Duration;

use redis::AsyncCommands;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops::{self, JobsTimed};
use workerpool_queue::snapshot;
use workerpool_tests::TestRedis;

const TTL: Duration = Duration::from_secs(60);

fn timed(jobs: u64, ms: u64) -> Option<JobsTimed> {
    Some(JobsTimed {
        jobs,
        mean: Duration::from_millis(ms),
        deviation: None,
    })
}

async fn stored(c: &mut redis::aio::MultiplexedConnection, q: &QueueKeys) -> Option<f64> {
    let raw: Option<String> = c.get(q.stats_duration()).await.expect("get");
    raw.map(|ms| ms.parse().expect("a number of milliseconds"))
}

#[tokio::test]
async fn heartbeats_fold_the_jobs_they_report_into_a_mean_that_outlives_the_workers() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{mail}");
    let counts = snapshot::counts(&mut c, &q).await.expect("snapshot");
    assert_eq!(counts.job_duration_us, None, "no job has finished yet");

    // A beat that finished nothing records nothing.
    ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], None)
        .await
        .expect("beat");
    assert_eq!(stored(&mut c, &q).await, None);

    // The first report is the mean.
    ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], timed(10, 200))
        .await
        .expect("beat");
    assert_eq!(stored(&mut c, &q).await, Some(200.0));

    // Later ones move it by a weight that grows with the jobs they report:
    // 20 jobs (the time constant) move it 1 - 1/e of the way.
    ops::heartbeat_with(&mut c, &q, "b~1", TTL, &[], timed(20, 400))
        .await
        .expect("beat");
    let expected = 200.0 + (1.0 - (-1.0f64).exp()) * 200.0;
    assert!((ops::fold_duration(Some(200.0), 400.0, 20) - expected).abs() < 1e-9);
    let after = stored(&mut c, &q).await.expect("stored");
    assert!((after - expected).abs() < 0.001, "{after} vs {expected}");
    let one_job = {
        ops::heartbeat_with(&mut c, &q, "b~1", TTL, &[], timed(1, 10_000))
            .await
            .expect("beat");
        stored(&mut c, &q).await.expect("stored")
    };
    assert!(
        one_job > after && one_job < after + 0.05 * (10_000.0 - after),
        "one slow job moves the mean a little: {after} -> {one_job}"
    );
    let folded = ops::fold_duration(Some(after), 10_000.0, 1);
    assert!(
        (one_job - folded).abs() < 0.001,
        "the script and fold_duration agree: {one_job} vs {folded}"
    );

    // The workers leave; the duration stays, and the snapshot reads it.
    let _: () = redis::cmd("DEL")
        .arg(q.workers())
        .arg(q.worker("a~1"))
        .arg(q.worker("b~1"))
        .query_async(&mut c)
        .await
        .expect("del");
    let counts = snapshot::counts(&mut c, &q).await.expect("snapshot");
    let seconds = counts.job_seconds().expect("known after the workers left");
    assert!((seconds * 1000.0 - one_job).abs() < 0.01, "{seconds}");
    let ttl: i64 = c.pttl(q.stats_duration()).await.expect("pttl");
    assert_eq!(ttl, -1, "kept without expiry");
}

#[tokio::test]
async fn a_duration_key_of_another_type_stops_the_beat_before_it_writes() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("mail");
    let _: () = c.rpush(q.stats_duration(), "junk").await.expect("rpush");
    let error = ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], timed(3, 50))
        .await
        .expect_err("a list where the duration is kept");
    assert!(
        error.to_string().contains(&q.stats_duration()),
        "the error names the key: {error}"
    );
    let registered: Option<f64> = c.zscore(q.workers(), "a~1").await.expect("zscore");
    assert_eq!(registered, None, "nothing was written");
    // A plain beat does not touch the key, so a worker keeps beating.
    ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], None)
        .await
        .expect("a beat without jobs");
    // A value that does not read as a duration is read as none.
    let _: () = c.del(q.stats_duration()).await.expect("del");
    let _: () = c.set(q.stats_duration(), "soon").await.expect("set");
    let counts = snapshot::counts(&mut c, &q).await.expect("snapshot");
    assert_eq!(counts.job_duration_us, None);
}

#[tokio::test]
async fn queues_added_up_weigh_their_durations_by_the_jobs_they_processed() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (high, low) = (QueueKeys::new("{m}:high"), QueueKeys::new("{m}:low"));
    let _: () = c.set(high.stats_duration(), "100.000").await.expect("set");
    let _: () = c.set(high.stats_processed(), 30).await.expect("set");
    let _: () = c.set(low.stats_duration(), "500.000").await.expect("set");
    let _: () = c.set(low.stats_processed(), 10).await.expect("set");
    let s = snapshot::read(&mut c, &[high.clone(), low.clone()])
        .await
        .expect("snapshot");
    assert_eq!(s.queues[0].job_duration_us, Some(100_000));
    assert_eq!(s.queues[1].job_duration_us, Some(500_000));
    assert_eq!(
        s.counts().job_duration_us,
        Some(200_000),
        "(30 × 100 + 10 × 500) / 40 ms"
    );
}

#[tokio::test]
async fn heartbeats_keep_the_spread_of_the_durations_beside_their_mean() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("{mail}");
    let beat = |mean_ms: u64, deviation_ms: Option<u64>| {
        Some(JobsTimed {
            jobs: 20,
            mean: Duration::from_millis(mean_ms),
            deviation: deviation_ms.map(Duration::from_millis),
        })
    };
    // Jobs of one length: no spread.
    ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], beat(400, Some(0)))
        .await
        .expect("beat");
    let counts = snapshot::counts(&mut c, &q).await.expect("snapshot");
    assert_eq!(counts.job_seconds(), Some(0.4));
    assert_eq!(counts.job_seconds_deviation(), Some(0.0));

    // A second beat of 20 jobs whose spread is 300 ms around 400 ms: the
    // mean and the mean of the squares move 1 - 1/e of the way, so the
    // spread read back is that of the mixture the two make.
    ops::heartbeat_with(&mut c, &q, "a~1", TTL, &[], beat(400, Some(300)))
        .await
        .expect("beat");
    let w = 1.0 - (-1.0f64).exp();
    let square = 160_000.0 + w * (90_000.0 + 160_000.0 - 160_000.0);
    let expected = (square - 160_000.0f64).sqrt() / 1000.0;
    let counts = snapshot::counts(&mut c, &q).await.expect("snapshot");
    let deviation = counts.job_seconds_deviation().expect("known");
    assert!(
        (deviation - expected).abs() < 0.001,
        "{deviation} vs {expected}"
    );
    let stored: String = c.get(q.stats_duration_sq()).await.expect("get");
    let ttl: i64 = c.pttl(q.stats_duration_sq()).await.expect("pttl");
    assert_eq!(ttl, -1, "kept without expiry: {stored}");

    // A worker that reports no spread leaves the squares as they were.
    ops::heartbeat_with(&mut c, &q, "b~1", TTL, &[], beat(400, None))
        .await
        .expect("beat");
    let after: String = c.get(q.stats_duration_sq()).await.expect("get");
    assert_eq!(after, stored);
}
