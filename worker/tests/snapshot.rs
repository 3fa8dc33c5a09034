//! One-round-trip queue readings against a real redis-server.

use redis::AsyncCommands;
use serde_json::json;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::snapshot;
use workerpool_tests::TestRedis;

mod common;

#[tokio::test]
async fn a_snapshot_reads_backlog_retries_in_flight_counters_and_the_oldest_job() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let (high, low) = (QueueKeys::new("{m}:high"), QueueKeys::new("{m}:low"));
    let now = common::server_time_ms(&mut c).await;
    // high: 3 waiting (the head enqueued 90 s ago), 1 due retry, 1 retry later,
    // one delayed job due and one not, a dead letter; two workers holding 2 + 1.
    let _: () = c
        .lpush(
            high.name(),
            json!({"enqueued_at": now - 90_000}).to_string(),
        )
        .await
        .expect("lpush");
    let _: () = c
        .lpush(
            high.name(),
            json!({"enqueued_at": now - 10_000}).to_string(),
        )
        .await
        .expect("lpush");
    let _: () = c.lpush(high.name(), "{}").await.expect("lpush");
    let _: () = c.zadd(high.retry(), "r1", now - 1).await.expect("zadd");
    let _: () = c
        .zadd(high.retry(), "r2", now + 600_000)
        .await
        .expect("zadd");
    let _: () = c.zadd(high.scheduled(), "s1", now - 1).await.expect("zadd");
    let _: () = c
        .zadd(high.scheduled(), "s2", now + 600_000)
        .await
        .expect("zadd");
    let _: () = c.lpush(high.dead(), "{}").await.expect("lpush");
    let _: () = c.set(high.stats_processed(), 40).await.expect("set");
    let _: () = c.set(high.stats_failed(), 3).await.expect("set");
    let _: () = c.set(high.stats_dead(), 4).await.expect("set");
    let _: () = c.set(high.stats_recovered(), 6).await.expect("set");
    // pod-a reports its window; pod-b's details have expired (lost).
    let _: () = c
        .hset(high.worker("pod-a~1"), "dead_after_ms", 30_000)
        .await
        .expect("hset");
    let _: () = c
        .hset(
            high.worker("pod-a~1"),
            "handler_problem",
            "the handler exited before its first answer 3 times",
        )
        .await
        .expect("hset");
    for (instance, held) in [("pod-a~1", 2), ("pod-b~1", 1)] {
        let _: () = c.zadd(high.workers(), instance, now).await.expect("zadd");
        for n in 0..held {
            let _: () = c.lpush(high.processing(instance), n).await.expect("lpush");
        }
    }
    // low: 2 waiting without enqueued_at, 2 processed, pod-a holds one more.
    let _: () = c.lpush(low.name(), "{}").await.expect("lpush");
    let _: () = c.lpush(low.name(), "{}").await.expect("lpush");
    let _: () = c.set(low.stats_processed(), 2).await.expect("set");
    let _: () = c.zadd(low.workers(), "pod-a~1", now).await.expect("zadd");
    let _: () = c
        .lpush(low.processing("pod-a~1"), "x")
        .await
        .expect("lpush");

    let s = snapshot::read(&mut c, &[high.clone(), low.clone()])
        .await
        .expect("snapshot");
    let h = &s.queues[0];
    assert_eq!(
        (
            h.waiting,
            h.retries_due,
            h.retries,
            h.scheduled_due,
            h.scheduled,
            h.dead,
            h.processed_total,
            h.failed_total
        ),
        (3, 1, 2, 1, 2, 1, 40, 3)
    );
    let hc = h.counts(s.server_time_ms);
    assert_eq!(
        (
            hc.backlog(),
            hc.in_flight,
            hc.held_by_lost_workers,
            hc.held()
        ),
        (5, 2, 1, 3),
        "pod-b's job is held by a lost worker"
    );
    assert_eq!(
        (hc.retries_due, hc.retries_scheduled, hc.scheduled_due),
        (1, 1, 1)
    );
    assert_eq!((h.dead_total, h.recovered_total), (4, 6));
    let alive: Vec<(&str, bool)> = h
        .workers
        .iter()
        .map(|w| (w.instance.as_str(), w.alive(s.server_time_ms)))
        .collect();
    assert_eq!(alive, [("pod-a~1", true), ("pod-b~1", false)]);
    assert_eq!(s.queues[1].counts(s.server_time_ms).backlog(), 2);
    let all = s.counts();
    assert_eq!(
        (
            all.waiting,
            all.backlog(),
            all.held(),
            all.processed_total,
            all.due()
        ),
        (5, 7, 4, 42, 2)
    );
    // pod-a has no details hash on `low`: lost there, live on `high`.
    assert_eq!((all.workers_live, all.workers_lost), (1, 2));
    let age = all.oldest_job_age_seconds().expect("age");
    assert!((89.0..100.0).contains(&age), "{age}");
    // The live workers' jobs in hand, by pod: pod-a's job on `low` and
    // pod-b's are held by lost registrations, which the reaper returns.
    let by_pod: Vec<(String, u64)> = s
        .activity_by_worker_id()
        .into_iter()
        .map(|(pod, a)| (pod, a.in_flight))
        .collect();
    assert_eq!(by_pod, [("pod-a".to_string(), 2)]);
    // A live worker's handler problem, once per pod (it is registered on
    // both queues).
    let problems: Vec<(String, String)> = s.handler_problems().into_iter().collect();
    assert_eq!(
        problems,
        [(
            "pod-a".to_string(),
            "the handler exited before its first answer 3 times".to_string()
        )]
    );
    // An empty field (the handler runs) is no problem.
    let _: () = c
        .hset(high.worker("pod-a~1"), "handler_problem", "")
        .await
        .expect("hset");
    let s = snapshot::read(&mut c, &[high.clone(), low.clone()])
        .await
        .expect("snapshot");
    assert!(s.handler_problems().is_empty());
}

#[tokio::test]
async fn an_unknown_queue_reads_as_empty() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let s = snapshot::read(&mut c, &[QueueKeys::new("nothing-here")])
        .await
        .expect("snapshot");
    let c = s.counts();
    assert_eq!((c.backlog(), c.held(), c.processed_total), (0, 0, 0));
    assert!(c.oldest_job_age_seconds().is_none());
    assert!(s.server_time_ms > 0);
}

/// Sleeps as many milliseconds as the job's data says.
struct Sleeps;

impl workerpool_worker::Handler for Sleeps {
    fn handle<'a>(
        &'a self,
        job: &'a workerpool_worker::Job,
    ) -> futures::future::BoxFuture<'a, workerpool_worker::Outcome> {
        let ms = job.data().as_u64().unwrap_or(0);
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            workerpool_worker::Outcome::Done
        })
    }
}

#[tokio::test]
async fn a_worker_keeps_its_queues_mean_job_duration_and_its_spread_in_redis_for_the_engine() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("timed");
    // Half the jobs take 50 ms, half 250 ms: a mean of 150 ms, 100 ms
    // either side (as the heartbeats fold them, weighing later beats more:
    // about that).
    let jobs: Vec<String> = (0..20)
        .map(|n| json!({"data": if n % 2 == 0 { 50 } else { 250 }}).to_string())
        .collect();
    common::push(&mut c, q.name(), &jobs).await;
    let mut config = common::config(&redis, &[q.name()], "timer");
    config.concurrency = 4;
    let worker = common::start(config, std::sync::Arc::new(Sleeps));
    let (seconds, deviation) = workerpool_tests::eventually(
        std::time::Duration::from_secs(20),
        "the mean job duration and its spread in the snapshot",
        || {
            let mut c = c.clone();
            let q = q.clone();
            async move {
                let counts = snapshot::counts(&mut c, &q).await.ok()?;
                (counts.processed_total == 20)
                    .then_some(counts.job_seconds().zip(counts.job_seconds_deviation()))
                    .flatten()
            }
        },
    )
    .await;
    worker.stop().await;
    assert!(
        (0.05..0.25).contains(&seconds),
        "jobs that sleep 50 or 250 ms: a mean of {seconds} s"
    );
    assert!(
        (0.04..0.15).contains(&deviation),
        "jobs that sleep 50 or 250 ms: a spread of {deviation} s"
    );
    let ttl: i64 = c.pttl(q.stats_duration()).await.expect("pttl");
    assert_eq!(ttl, -1, "kept after the worker left");
}

/// What the operator reads to protect a busy pod from node disruption: a
/// worker's heartbeat says how long its oldest job has run, and once it
/// holds none, for how long it has been idle.
#[tokio::test]
async fn a_worker_tells_how_long_its_oldest_job_has_run_and_how_long_it_has_been_idle() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("held");
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let worker = common::start(
        common::config(&redis, &[q.name()], "holder"),
        common::Recorder::gated(gate.clone()),
    );
    let activity = |c: &redis::aio::MultiplexedConnection| {
        let (mut c, q) = (c.clone(), q.clone());
        async move {
            let s = snapshot::read(&mut c, &[q]).await.ok()?;
            s.activity_by_worker_id().get("holder").copied()
        }
    };
    // Registered and idle before any job.
    let idle = workerpool_tests::eventually(
        std::time::Duration::from_secs(10),
        "the idle worker's heartbeat",
        || async { activity(&c).await.filter(|a| a.idle_ms.is_some()) },
    )
    .await;
    assert_eq!((idle.in_flight, idle.busy_ms), (0, None));

    common::push(&mut c, q.name(), &[json!({"data": 1}).to_string()]).await;
    let busy = workerpool_tests::eventually(
        std::time::Duration::from_secs(10),
        "the job held for a second",
        || async {
            activity(&c)
                .await
                .filter(|a| a.busy_ms.is_some_and(|ms| ms >= 1_000))
        },
    )
    .await;
    assert_eq!((busy.in_flight, busy.idle_ms), (1, None), "{busy:?}");
    assert!(
        busy.busy_ms < Some(10_000),
        "held for as long as the test waited, not longer: {busy:?}"
    );

    gate.add_permits(1);
    let after =
        workerpool_tests::eventually(std::time::Duration::from_secs(10), "idle again", || async {
            activity(&c).await.filter(|a| a.in_flight == 0)
        })
        .await;
    assert_eq!(after.busy_ms, None);
    assert!(
        after.idle_ms.is_some_and(|ms| ms < 1_000),
        "idle since the job ended, not since the worker started: {after:?}"
    );
    worker.stop().await;
}
