//! The snapshot reads a queue at one instant with plain commands: a job
//! that moves between the list and a processing list while it reads is
//! counted once, and a registry that changes while it reads is read again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::snapshot;
use workerpool_tests::TestRedis;

const JOBS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_is_counted_once_while_jobs_move_and_workers_come_and_go() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("moving");
    let mut c = redis.conn().await;
    for n in 0..JOBS {
        let _: () = c.lpush(q.waiting(), n).await.expect("lpush");
    }
    let holder = "holder~00000001";
    let _: () = c
        .zadd(q.workers(), holder, 1_700_000_000_000u64)
        .await
        .expect("zadd");
    let stop = Arc::new(AtomicBool::new(false));
    // Jobs taken into the holder's processing list and given back, as
    // fast as Redis goes, each move atomic (LMOVE).
    let mover = tokio::spawn({
        let (mut c, q, stop) = (redis.conn().await, q.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let _: Option<String> = c
                    .lmove(
                        q.waiting(),
                        q.processing(holder),
                        redis::Direction::Right,
                        redis::Direction::Left,
                    )
                    .await
                    .expect("take");
                let _: Option<String> = c
                    .lmove(
                        q.processing(holder),
                        q.waiting(),
                        redis::Direction::Right,
                        redis::Direction::Left,
                    )
                    .await
                    .expect("give back");
            }
        }
    });
    // Workers registering and leaving now and then.
    let churn = tokio::spawn({
        let (mut c, q, stop) = (redis.conn().await, q.clone(), stop.clone());
        async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("churn-{n}~00000001");
                let _: () = c
                    .zadd(q.workers(), &name, 1_700_000_000_000u64)
                    .await
                    .expect("zadd");
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _: () = c.zrem(q.workers(), &name).await.expect("zrem");
                n += 1;
            }
        }
    });
    let mut reader = redis.conn().await;
    for _ in 0..300 {
        let s = snapshot::read(&mut reader, std::slice::from_ref(&q))
            .await
            .expect("snapshot");
        let f = &s.queues[0];
        let held: u64 = f.workers.iter().map(|w| w.in_flight).sum();
        assert_eq!(f.waiting + held, JOBS, "{f:?}");
        assert!(f.workers.iter().any(|w| w.instance == holder), "{f:?}");
    }
    stop.store(true, Ordering::Relaxed);
    mover.await.expect("mover");
    churn.await.expect("churn");
}
