//! Every queue script against a real redis-server, one row per rule: the
//! state before, the operation, its reply, and every key after.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use workerpool_queue::job::Stamp;
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops::{self, IntakeAction};
use workerpool_queue::rate::RateLimit;
use workerpool_tests::TestRedis;

/// One operation of the contract, with its arguments.
#[derive(Debug, Clone, Copy)]
enum Op {
    GiveBack(&'static [(&'static str, &'static str)]),
    Promote(usize),
    /// Takes up to `n` jobs (attempt limit 10).
    Fetch(usize),
    SettleRun(&'static str, &'static str),
    SettleSchedule(&'static str, &'static str, u64),
    Reap(&'static str, Option<u64>),
    Deregister(&'static str),
    /// Settles held payloads (`A`: done, `T`: retry, `B`: dead) and takes
    /// up to `n` jobs.
    Settle(&'static [(char, &'static str)], usize),
    /// Enqueues JSON jobs through `admin::enqueue`.
    Enqueue(&'static [&'static str]),
    /// Settles (kind, payload, release token) and takes nothing.
    SettleReleasing(&'static [(char, &'static str, &'static str)]),
    /// Dead-letters a fresh payload at intake, freeing a unique key.
    IntakeDeadReleasing(&'static str, &'static str, &'static str),
    /// Fires schedule `s` at unix ms `at` with a JSON job (`fire.lua`).
    Fire(&'static str, i64, &'static str),
    /// Takes up to `n` jobs under a rate limit (`20/s`).
    FetchLimited(usize, &'static str),
    /// Settles as [`Op::Settle`], taking up to `n` jobs under a rate limit.
    SettleLimited(&'static [(char, &'static str)], usize, &'static str),
    /// Takes up to `n` jobs with a payload size limit of `max` bytes.
    FetchCapped(usize, u64),
    /// Settles as [`Op::Settle`], taking up to `n` jobs with a payload size
    /// limit of `max` bytes.
    SettleCapped(&'static [(char, &'static str)], usize, u64),
    /// Reads the dead list's oldest entry's place, length and digest, then
    /// runs `dead_pick.lua` on it with the action (`R` or `Q`).
    DeadPickOldest(&'static str),
    /// Reads the two newest dead letters (`admin::dead_page`).
    DeadPage,
}

struct Row {
    rule: &'static str,
    /// Redis commands that set the scene (keys are relative to the queue).
    given: &'static [&'static [&'static str]],
    op: Op,
    /// The operation's reply, as Debug.
    reply: &'static str,
    /// Every key of the queue afterwards, as `key=contents` (lists and sets
    /// in order, counters by value), sorted; `<q>` stands for the queue.
    then: &'static [&'static str],
}

const ROWS: &[Row] = &[
    Row {
        rule: "a fetch dead-letters a payload over the size limit whole, as too_large, and takes one at the limit",
        given: &[&[
            "LPUSH",
            "<q>",
            "0123456789abcdefghijk",
            "0123456789abcdefghij",
        ]],
        op: Op::FetchCapped(2, 20),
        reply: "[0123456789abcdefghij] too_large [payload of 21 bytes is over the limit of 20 bytes (--max-payload-bytes); it starts: 0123456789abcdefghijk]",
        then: &[
            // The state keeps the JSON escapes of the error's own quotes.
            r"<q>:dead=[{reason:too_large,error:payload of 21 bytes is over the limit of 20 bytes (--max-payload-bytes); it starts: \0123456789abcdefghijk\,attempts:0,died_at:<now>,worker:w~1,size:21,encoding:raw,job:0123456789abcdefghijk}]",
            "<q>:processing:w~1=[0123456789abcdefghij]",
            "<q>:stats:dead=1",
        ],
    },
    Row {
        rule: "a settle takes no payload over the size limit either, and counts its attempt from the payload",
        given: &[
            &[
                "LPUSH",
                "<q>",
                r#"{"attempt":3,"id":"i","data":"long enough"}"#,
            ],
            &["LPUSH", "<q>:processing:w~1", "a"],
        ],
        op: Op::SettleCapped(&[('A', "a")], 1, 20),
        reply: "([true], []) too_large [payload of 43 bytes is over the limit of 20 bytes (--max-payload-bytes); it starts: {attempt:3,id:i,data:long enough}]",
        then: &[
            r"<q>:dead=[{reason:too_large,error:payload of 43 bytes is over the limit of 20 bytes (--max-payload-bytes); it starts: \{\\\attempt\\\:3,\\\id\\\:\\\i\\\,\\\data\\\:\\\long enough\\\}\,attempts:3,died_at:<now>,worker:w~1,size:43,encoding:raw,job:{attempt:3,id:i,data:long enough}}]",
            "<q>:stats:dead=1",
            "<q>:stats:processed=1",
        ],
    },
    Row {
        rule: "a too_large dead letter's payload goes back onto the queue exactly as it was taken",
        given: &[&[
            "LPUSH",
            "<q>:dead",
            r#"{"reason":"too_large","error":"e","attempts":0,"died_at":1,"worker":"w~1","size":7,"encoding":"raw","job":{"a":1}}"#,
            "newer",
        ]],
        op: Op::DeadPickOldest("Q"),
        reply: "[1]",
        then: &["<q>=[{a:1}]", "<q>:dead=[newer]"],
    },
    Row {
        rule: "a dead letter found by its digest is removed; one that is not too_large is not requeued",
        given: &[&["LPUSH", "<q>:dead", "old", "newer"]],
        op: Op::DeadPickOldest("R"),
        reply: "[1]",
        then: &["<q>:dead=[newer]"],
    },
    Row {
        rule: "requeueing a dead letter that keeps no payload leaves it",
        given: &[&["LPUSH", "<q>:dead", "old"]],
        op: Op::DeadPickOldest("Q"),
        reply: "[-1]",
        then: &["<q>:dead=[old]"],
    },
    Row {
        rule: "a page of the dead list reads short entries whole, newest first",
        given: &[&["LPUSH", "<q>:dead", "a", "b", "c"]],
        op: Op::DeadPage,
        reply: "[(c, 1), (b, 1)]",
        then: &["<q>:dead=[c, b, a]"],
    },
    Row {
        rule: "a settle round trip completes, retries and buries in one script",
        given: &[&["LPUSH", "<q>:processing:w~1", "a", "t", "b"]],
        op: Op::Settle(&[('A', "a"), ('T', "t"), ('B', "b")], 0),
        reply: "([true, true, true], [])",
        then: &[
            "<q>:dead=[b-letter]",
            "<q>:retry={t-next}",
            "<q>:stats:dead=1",
            "<q>:stats:failed=2",
            "<q>:stats:processed=1",
        ],
    },
    Row {
        rule: "a job the handler could not start goes back to the retry set without counting a failure",
        given: &[&["LPUSH", "<q>:processing:w~1", "r", "t"]],
        op: Op::Settle(&[('R', "r"), ('T', "t")], 0),
        reply: "([true, true], [])",
        then: &["<q>:retry={r-next, t-next}", "<q>:stats:failed=1"],
    },
    Row {
        rule: "settling a payload a reaper already returned changes nothing: settle, and the others still settle",
        given: &[
            &["LPUSH", "<q>", "gone"],
            &["LPUSH", "<q>:processing:w~1", "a"],
        ],
        op: Op::Settle(
            &[('A', "gone"), ('T', "gone"), ('B', "gone"), ('A', "a")],
            0,
        ),
        reply: "([false, false, false, true], [])",
        then: &["<q>=[gone]", "<q>:stats:processed=1"],
    },
    Row {
        rule: "a settle takes no more jobs than asked into the freed slots, oldest first",
        given: &[
            &["LPUSH", "<q>", "j1", "j2", "j3"],
            &["LPUSH", "<q>:processing:w~1", "a"],
        ],
        op: Op::Settle(&[('A', "a")], 2),
        reply: "([true], [j1, j2])",
        then: &[
            "<q>=[j3]",
            "<q>:processing:w~1=[j2, j1]",
            "<q>:stats:processed=1",
        ],
    },
    Row {
        rule: "a give-back pushes each pair to the head, the last pair at the very head",
        given: &[
            &["RPUSH", "<q>", "older"],
            &["LPUSH", "<q>:processing:w~1", "a", "b"],
        ],
        op: Op::GiveBack(&[("a", "a2"), ("b", "b2"), ("gone", "x")]),
        reply: "2",
        then: &["<q>=[older, a2, b2]"],
    },
    Row {
        rule: "promotion moves only what is due, from both sets, to the tail",
        given: &[
            &[
                "ZADD",
                "<q>:retry",
                "1",
                "r-due",
                "99999999999999",
                "r-later",
            ],
            &["ZADD", "<q>:scheduled", "1", "s-due"],
            &["RPUSH", "<q>", "waiting"],
        ],
        op: Op::Promote(100),
        reply: "2",
        then: &["<q>=[s-due, r-due, waiting]", "<q>:retry={r-later}"],
    },
    Row {
        rule: "a fetch takes no more than asked, oldest first",
        given: &[&["LPUSH", "<q>", "1", "2", "3"]],
        op: Op::Fetch(2),
        reply: "[1, 2]",
        then: &["<q>=[3]", "<q>:processing:w~1=[2, 1]"],
    },
    Row {
        rule: "a fetch stamps a fresh job: attempt 1, an id and enqueued_at before the producer's bytes",
        given: &[&["LPUSH", "<q>", r#"{"task":"t", "data":{"id":7}}"#]],
        op: Op::Fetch(1),
        reply: "[{attempt:1,id:<id>,enqueued_at:<now>,task:t, data:{id:7}} ~fresh]",
        then: &["<q>:processing:w~1=[{attempt:1,id:<id>,enqueued_at:<now>,task:t, data:{id:7}}]"],
    },
    Row {
        rule: "a fetch keeps a producer's id and enqueued_at, and stamps an empty object without a stray comma",
        given: &[&["LPUSH", "<q>", r#"{"id":"mine","enqueued_at":5}"#, "{ }"]],
        op: Op::Fetch(2),
        reply: "[{attempt:1,id:mine,enqueued_at:5} ~fresh, {attempt:1,id:<id>,enqueued_at:<now> } ~fresh]",
        then: &[
            "<q>:processing:w~1=[{attempt:1,id:<id>,enqueued_at:<now> }, {attempt:1,id:mine,enqueued_at:5}]",
        ],
    },
    Row {
        rule: "a fetch adds only the attempt to what workerpool's producers write, id and enqueued_at last, and reads the fields of other objects that name an id",
        given: &[&[
            "LPUSH",
            "<q>",
            r#"{"task":"t","data":{"id":7},"id":"mine","enqueued_at":5}"#,
            r#"{"data":{"id":7},"task":"t","enqueued_at":5}"#,
        ]],
        op: Op::Fetch(2),
        reply: "[{attempt:1,task:t,data:{id:7},id:mine,enqueued_at:5} ~fresh, {attempt:1,id:<id>,data:{id:7},task:t,enqueued_at:5} ~fresh]",
        then: &[
            "<q>:processing:w~1=[{attempt:1,id:<id>,data:{id:7},task:t,enqueued_at:5}, {attempt:1,task:t,data:{id:7},id:mine,enqueued_at:5}]",
        ],
    },
    Row {
        rule: "a fetch counts the leading attempt of a job that ran before",
        given: &[&[
            "LPUSH",
            "<q>",
            r#"{"attempt":9,"id":"a","enqueued_at":5,"error":"e"}"#,
        ]],
        op: Op::Fetch(1),
        reply: "[{attempt:10,id:a,enqueued_at:5,error:e} ~counted]",
        then: &["<q>:processing:w~1=[{attempt:10,id:a,enqueued_at:5,error:e}]"],
    },
    Row {
        rule: "a fetch leaves to intake what a text stamp cannot settle: delayed, out of attempts, an attempt not first, no object, not JSON",
        given: &[&[
            "LPUSH",
            "<q>",
            r#"{"run_at":1}"#,
            r#"{"attempt":10,"id":"a"}"#,
            r#"{"id":"a","attempt":1}"#,
            r#"{"attempt":07,"id":"a"}"#,
            "[1]",
            r#"{"id":"a""#,
        ]],
        op: Op::Fetch(6),
        reply: "[{run_at:1}, {attempt:10,id:a}, {id:a,attempt:1}, {attempt:07,id:a}, [1], {id:a]",
        then: &[
            "<q>:processing:w~1=[{id:a, [1], {attempt:07,id:a}, {id:a,attempt:1}, {attempt:10,id:a}, {run_at:1}]",
        ],
    },
    Row {
        rule: "a settle stamps the jobs it takes as a fetch does",
        given: &[
            &["LPUSH", "<q>", r#"{"task":"t"}"#],
            &["LPUSH", "<q>:processing:w~1", "a"],
        ],
        op: Op::Settle(&[('A', "a")], 1),
        reply: "([true], [{attempt:1,id:<id>,enqueued_at:<now>,task:t} ~fresh])",
        then: &[
            "<q>:processing:w~1=[{attempt:1,id:<id>,enqueued_at:<now>,task:t}]",
            "<q>:stats:processed=1",
        ],
    },
    Row {
        rule: "intake parks a delayed job as it was pushed, removing the held one",
        given: &[&["LPUSH", "<q>:processing:w~1", "held"]],
        op: Op::SettleSchedule("held", "pushed", 42),
        reply: "[true]",
        then: &["<q>:scheduled={pushed}"],
    },
    Row {
        rule: "intake replaces a held payload with its stamped form",
        given: &[&["LPUSH", "<q>:processing:w~1", "raw"]],
        op: Op::SettleRun("raw", "stamped"),
        reply: "[true]",
        then: &["<q>:processing:w~1=[stamped]"],
    },
    Row {
        rule: "intake of a payload no longer held changes nothing",
        given: &[&["LPUSH", "<q>", "raw"]],
        op: Op::SettleRun("raw", "stamped"),
        reply: "[false]",
        then: &["<q>=[raw]"],
    },
    Row {
        rule: "a reaper returns a silent worker's jobs to the head, oldest at the very head, and forgets it",
        given: &[
            &["ZADD", "<q>:workers", "1", "w~2"],
            &["HSET", "<q>:worker:w~2", "pid", "1"],
            &["LPUSH", "<q>:processing:w~2", "first", "second"],
            &["RPUSH", "<q>", "waiting"],
        ],
        op: Op::Reap("w~2", Some(1_000)),
        reply: "Some(2)",
        then: &["<q>=[waiting, second, first]", "<q>:stats:recovered=2"],
    },
    Row {
        rule: "a reaper leaves a worker that has just beaten alone",
        given: &[
            &["ZADD", "<q>:workers", "99999999999999", "w~2"],
            &["LPUSH", "<q>:processing:w~2", "held"],
        ],
        op: Op::Reap("w~2", Some(1_000)),
        reply: "None",
        then: &["<q>:processing:w~2=[held]", "<q>:workers={w~2}"],
    },
    Row {
        rule: "a reaper judges a worker by the window the worker declared, not by its own: silent 5 s of a declared 60 s is alive",
        given: &[
            &["ZADD", "<q>:workers", "<now+-5000>", "w~2"],
            &["HSET", "<q>:worker:w~2", "dead_after_ms", "60000"],
            &["LPUSH", "<q>:processing:w~2", "held"],
        ],
        op: Op::Reap("w~2", Some(1_000)),
        reply: "None",
        then: &["<q>:processing:w~2=[held]", "<q>:workers={w~2}"],
    },
    Row {
        rule: "a worker silent longer than the window it declared is lost, whatever the reaper's own window",
        given: &[
            &["ZADD", "<q>:workers", "<now+-5000>", "w~2"],
            &["HSET", "<q>:worker:w~2", "dead_after_ms", "2000"],
            &["LPUSH", "<q>:processing:w~2", "held"],
        ],
        op: Op::Reap("w~2", Some(60_000)),
        reply: "Some(1)",
        then: &["<q>=[held]", "<q>:stats:recovered=1"],
    },
    Row {
        rule: "a worker leaves the registry only when it holds nothing",
        given: &[
            &["ZADD", "<q>:workers", "1", "w~1"],
            &["LPUSH", "<q>:processing:w~1", "held"],
        ],
        op: Op::Deregister("w~1"),
        reply: "false",
        then: &["<q>:processing:w~1=[held]", "<q>:workers={w~1}"],
    },
    Row {
        rule: "a worker holding nothing leaves the registry and its details",
        given: &[
            &["ZADD", "<q>:workers", "1", "w~1"],
            &["HSET", "<q>:worker:w~1", "pid", "1"],
        ],
        op: Op::Deregister("w~1"),
        reply: "true",
        then: &[],
    },
    Row {
        rule: "a unique job goes in and holds its key, for an hour by default",
        given: &[],
        op: Op::Enqueue(&[r#"{"id":"a","unique_key":"k"}"#]),
        reply: "[true]",
        then: &[
            "<q>=[{id:a,unique_key:k,enqueued_at:<now>}]",
            "<q>:unique={k: a}",
            "<q>:unique:expiry={k}",
        ],
    },
    Row {
        rule: "a job whose unique key another job holds is refused and changes nothing",
        given: &[
            &["HSET", "<q>:unique", "k", "a"],
            &["ZADD", "<q>:unique:expiry", "99999999999999", "k"],
        ],
        op: Op::Enqueue(&[r#"{"id":"b","unique_key":"k"}"#]),
        reply: "[false]",
        then: &["<q>:unique={k: a}", "<q>:unique:expiry={k}"],
    },
    Row {
        rule: "a hold whose time ran out no longer counts: the new job takes the key",
        given: &[
            &["HSET", "<q>:unique", "k", "a", "old", "z"],
            &["ZADD", "<q>:unique:expiry", "1", "k", "2", "old"],
        ],
        op: Op::Enqueue(&[r#"{"id":"b","unique_key":"k"}"#]),
        reply: "[true]",
        then: &[
            "<q>=[{id:b,unique_key:k,enqueued_at:<now>}]",
            "<q>:unique={k: b}",
            "<q>:unique:expiry={k}",
        ],
    },
    Row {
        rule: "in one batch the first job with a key goes in, the next with it is refused, jobs without a key go in",
        given: &[],
        op: Op::Enqueue(&[
            r#"{"id":"a","unique_key":"k"}"#,
            r#"{"id":"b","unique_key":"k"}"#,
            r#"{"id":"c"}"#,
        ]),
        reply: "[true, false, true]",
        then: &[
            "<q>=[{id:c,enqueued_at:<now>}, {id:a,unique_key:k,enqueued_at:<now>}]",
            "<q>:unique={k: a}",
            "<q>:unique:expiry={k}",
        ],
    },
    Row {
        rule: "completing a job frees its key only while it holds it: a newer job keeps the key it took",
        given: &[
            &["LPUSH", "<q>:processing:w~1", "p"],
            &["HSET", "<q>:unique", "k", "b"],
            &["ZADD", "<q>:unique:expiry", "99999999999999", "k"],
        ],
        op: Op::SettleReleasing(&[('A', "p", "1:ak")]),
        reply: "[true]",
        then: &[
            "<q>:stats:processed=1",
            "<q>:unique={k: b}",
            "<q>:unique:expiry={k}",
        ],
    },
    Row {
        rule: "a job no longer ours frees nothing",
        given: &[
            &["HSET", "<q>:unique", "k", "a"],
            &["ZADD", "<q>:unique:expiry", "99999999999999", "k"],
        ],
        op: Op::SettleReleasing(&[('A', "p", "1:ak")]),
        reply: "[false]",
        then: &["<q>:unique={k: a}", "<q>:unique:expiry={k}"],
    },
    Row {
        rule: "a settle round trip frees the keys of done and dead jobs; a retried job keeps its key",
        given: &[
            &["LPUSH", "<q>:processing:w~1", "a", "t", "b"],
            &["HSET", "<q>:unique", "ka", "a", "kt", "t", "kb", "b"],
            &[
                "ZADD",
                "<q>:unique:expiry",
                "99999999999999",
                "ka",
                "99999999999999",
                "kt",
                "99999999999999",
                "kb",
            ],
        ],
        op: Op::SettleReleasing(&[
            ('A', "a", "1:aka"),
            ('T', "t", "1:tkt"),
            ('B', "b", "1:bkb"),
        ]),
        reply: "[true, true, true]",
        then: &[
            "<q>:dead=[b-letter]",
            "<q>:retry={t-next}",
            "<q>:stats:dead=1",
            "<q>:stats:failed=2",
            "<q>:stats:processed=1",
            "<q>:unique={kt: t}",
            "<q>:unique:expiry={kt}",
        ],
    },
    Row {
        rule: "a job dead-lettered at intake frees its key",
        given: &[
            &["LPUSH", "<q>:processing:w~1", "p"],
            &["HSET", "<q>:unique", "k", "a"],
            &["ZADD", "<q>:unique:expiry", "99999999999999", "k"],
        ],
        op: Op::IntakeDeadReleasing("p", "letter", "1:ak"),
        reply: "[true]",
        then: &["<q>:dead=[letter]", "<q>:stats:dead=1"],
    },
    Row {
        rule: "a fire not claimed before is claimed and its job enqueued",
        given: &[],
        op: Op::Fire("ns/p/s", 1000, r#"{"id":"ns/p/s/1000","task":"t"}"#),
        reply: "Enqueued",
        then: &["<q>=[{id:ns/p/s/1000,task:t}]", "<q>:fires={ns/p/s: 1000}"],
    },
    Row {
        rule: "a fire at or before its schedule's latest claim is not claimed and changes nothing",
        given: &[&["HSET", "<q>:fires", "ns/p/s", "2000"]],
        op: Op::Fire("ns/p/s", 1000, r#"{"id":"ns/p/s/1000","task":"t"}"#),
        reply: "AlreadyClaimed { latest_ms: 2000 }",
        then: &["<q>:fires={ns/p/s: 2000}"],
    },
    Row {
        rule: "the same fire claimed twice enqueues once",
        given: &[&["HSET", "<q>:fires", "ns/p/s", "1000"]],
        op: Op::Fire("ns/p/s", 1000, r#"{"id":"ns/p/s/1000","task":"t"}"#),
        reply: "AlreadyClaimed { latest_ms: 1000 }",
        then: &["<q>:fires={ns/p/s: 1000}"],
    },
    Row {
        rule: "a fire whose unique key the schedule's previous job still holds is claimed and its job refused",
        given: &[
            &["HSET", "<q>:fires", "ns/p/s", "1000"],
            &["HSET", "<q>:unique", "schedule:ns/p/s", "ns/p/s/1000"],
            &[
                "ZADD",
                "<q>:unique:expiry",
                "99999999999999",
                "schedule:ns/p/s",
            ],
        ],
        op: Op::Fire(
            "ns/p/s",
            2000,
            r#"{"id":"ns/p/s/2000","unique_key":"schedule:ns/p/s","unique_for":60}"#,
        ),
        reply: "Refused",
        then: &[
            "<q>:fires={ns/p/s: 2000}",
            "<q>:unique={schedule:ns/p/s: ns/p/s/1000}",
            "<q>:unique:expiry={schedule:ns/p/s}",
        ],
    },
    Row {
        rule: "a fire after the previous job freed the key is enqueued and holds it",
        given: &[&["HSET", "<q>:fires", "ns/p/s", "1000"]],
        op: Op::Fire(
            "ns/p/s",
            2000,
            r#"{"id":"ns/p/s/2000","unique_key":"schedule:ns/p/s","unique_for":60}"#,
        ),
        reply: "Enqueued",
        then: &[
            "<q>=[{id:ns/p/s/2000,unique_key:schedule:ns/p/s,unique_for:60}]",
            "<q>:fires={ns/p/s: 2000}",
            "<q>:unique={schedule:ns/p/s: ns/p/s/2000}",
            "<q>:unique:expiry={schedule:ns/p/s}",
        ],
    },
    Row {
        rule: "the claims of other schedules on the queue do not count",
        given: &[&["HSET", "<q>:fires", "ns/p/other", "5000"]],
        op: Op::Fire("ns/p/s", 1000, r#"{"id":"ns/p/s/1000"}"#),
        reply: "Enqueued",
        then: &[
            "<q>=[{id:ns/p/s/1000}]",
            "<q>:fires={ns/p/other: 5000, ns/p/s: 1000}",
        ],
    },
    Row {
        rule: "a rate-limited fetch takes only what the bucket allows and leaves the rest untouched; the reply says when the next may start",
        given: &[&["LPUSH", "<q>", "j1", "j2", "j3"]],
        op: Op::FetchLimited(3, "1/s"),
        reply: "[j1] limited 1000ms",
        then: &[
            "<q>=[j3, j2]",
            "<q>:processing:w~1=[j1]",
            "<q>:rate=now+1000ms",
        ],
    },
    Row {
        rule: "a rate limit lets a tenth of its count start at once after a quiet spell, then spaces the starts",
        given: &[&["LPUSH", "<q>", "j1", "j2", "j3", "j4", "j5"]],
        op: Op::FetchLimited(5, "20/s"),
        reply: "[j1, j2] limited 50ms",
        then: &[
            "<q>=[j5, j4, j3]",
            "<q>:processing:w~1=[j2, j1]",
            "<q>:rate=now+100ms",
        ],
    },
    Row {
        rule: "a fetch at the rate limit takes nothing, stamps and counts nothing, and says the wait",
        given: &[
            &["SET", "<q>:rate", "<now+3000>", "PX", "10000"],
            &["LPUSH", "<q>", r#"{"task":"t"}"#],
        ],
        op: Op::FetchLimited(1, "1/s"),
        reply: "[] limited 3000ms",
        then: &["<q>=[{task:t}]", "<q>:rate=now+3000ms"],
    },
    Row {
        rule: "a rate-limited fetch that empties the queue or finds it empty says no wait",
        given: &[&["LPUSH", "<q>", "j1"]],
        op: Op::FetchLimited(3, "1/s"),
        reply: "[j1]",
        then: &["<q>:processing:w~1=[j1]", "<q>:rate=now+1000ms"],
    },
    Row {
        rule: "a rate-limited fetch on an empty queue leaves no bucket behind",
        given: &[],
        op: Op::FetchLimited(3, "1/s"),
        reply: "[]",
        then: &[],
    },
    Row {
        rule: "a settle takes new jobs into the freed slots only as the rate limit allows",
        given: &[
            &["LPUSH", "<q>", "j1", "j2"],
            &["LPUSH", "<q>:processing:w~1", "a", "b"],
        ],
        op: Op::SettleLimited(&[('A', "a"), ('A', "b")], 2, "1/s"),
        reply: "([true, true], [j1]) limited 1000ms",
        then: &[
            "<q>=[j2]",
            "<q>:processing:w~1=[j1]",
            "<q>:rate=now+1000ms",
            "<q>:stats:processed=2",
        ],
    },
    Row {
        rule: "a settle at the rate limit still settles, and takes nothing",
        given: &[
            &["SET", "<q>:rate", "<now+2000>", "PX", "10000"],
            &["LPUSH", "<q>", "j1"],
            &["LPUSH", "<q>:processing:w~1", "a"],
        ],
        op: Op::SettleLimited(&[('A', "a")], 1, "1/s"),
        reply: "([true], []) limited 2000ms",
        then: &["<q>=[j1]", "<q>:rate=now+2000ms", "<q>:stats:processed=1"],
    },
];

async fn run(c: &mut MultiplexedConnection, q: &QueueKeys, op: Op) -> String {
    let w = "w~1";
    let r = match op {
        Op::Enqueue(jobs) => {
            let jobs = jobs
                .iter()
                .map(|j| match serde_json::from_str(j) {
                    Ok(serde_json::Value::Object(fields)) => fields,
                    _ => panic!("a row's job is a JSON object: {j}"),
                })
                .collect();
            format!(
                "{:?}",
                workerpool_queue::admin::enqueue(c, q, jobs, None)
                    .await
                    .map(|done| done.iter().map(|e| e.accepted).collect::<Vec<_>>())
            )
        }
        Op::Fire(schedule, at, job) => {
            let Ok(serde_json::Value::Object(job)) = serde_json::from_str(job) else {
                panic!("a row's job is a JSON object: {job}");
            };
            format!(
                "{:?}",
                workerpool_queue::schedule::fire(c, q, schedule, at, &job).await
            )
        }
        Op::IntakeDeadReleasing(held, envelope, token) => {
            let action = IntakeAction::Dead {
                held: held.as_bytes().to_vec(),
                envelope: envelope.into(),
                release: Some(token.into()),
                kept: None,
            };
            format!("{:?}", ops::settle_intake(c, q, w, &[action]).await)
        }
        Op::SettleReleasing(jobs) => {
            let settlements: Vec<ops::Settlement> = jobs
                .iter()
                .map(|(kind, p, _)| settlement(*kind, p))
                .collect();
            let finished: Vec<ops::Finished<'_>> = jobs
                .iter()
                .zip(&settlements)
                .map(|((_, p, token), settlement)| ops::Finished {
                    queue: 0,
                    payload: p.as_bytes(),
                    settlement,
                    release: Some(token),
                    kept: None,
                })
                .collect();
            format!(
                "{:?}",
                ops::settle(
                    c,
                    std::slice::from_ref(q),
                    w,
                    &finished,
                    0,
                    MAX_ATTEMPTS,
                    None
                )
                .await
                .map(|(kept, _)| kept)
            )
        }
        Op::GiveBack(pairs) => {
            let jobs: Vec<ops::Back<'_>> = pairs
                .iter()
                .map(|(a, b)| ops::Back {
                    held: a.as_bytes(),
                    push: b.as_bytes(),
                    kept: None,
                })
                .collect();
            format!("{:?}", ops::give_back(c, q, w, &jobs, ops::STOPPING).await)
        }
        Op::Promote(limit) => format!("{:?}", ops::promote_due(c, q, limit).await),
        Op::Fetch(n) => format!(
            "{:?}",
            ops::fetch(c, std::slice::from_ref(q), w, n, MAX_ATTEMPTS, None)
                .await
                .map(|f| f.jobs.iter().map(shown).collect::<Vec<_>>())
        ),
        Op::SettleRun(held, stamped) => {
            let action = IntakeAction::Run {
                held: held.as_bytes().to_vec(),
                stamped: stamped.into(),
            };
            format!("{:?}", ops::settle_intake(c, q, w, &[action]).await)
        }
        Op::SettleSchedule(held, payload, run_at) => {
            let action = IntakeAction::Schedule {
                held: held.as_bytes().to_vec(),
                payload: payload.as_bytes().to_vec(),
                run_at,
                kept: None,
            };
            format!("{:?}", ops::settle_intake(c, q, w, &[action]).await)
        }
        Op::Reap(instance, ms) => format!(
            "{:?}",
            ops::reap(c, q, instance, ms.map(Duration::from_millis)).await
        ),
        Op::Deregister(instance) => format!("{:?}", ops::deregister(c, q, instance).await),
        Op::FetchLimited(n, rate) => {
            let rate: RateLimit = rate.parse().expect("a row's rate limit parses");
            match ops::fetch(c, std::slice::from_ref(q), w, n, MAX_ATTEMPTS, Some(&rate)).await {
                Ok(taken) => limited_shown(
                    format!("{:?}", taken.jobs.iter().map(shown).collect::<Vec<_>>()),
                    &taken,
                ),
                Err(e) => format!("{e:?}"),
            }
        }
        Op::FetchCapped(n, max) => {
            let limits = ops::Limits {
                max_attempts: MAX_ATTEMPTS,
                max_payload_bytes: max,
                keep_outcomes: None,
            };
            match ops::fetch(c, std::slice::from_ref(q), w, n, limits, None).await {
                Ok(taken) => too_large_shown(
                    format!("{:?}", taken.jobs.iter().map(shown).collect::<Vec<_>>()),
                    &taken,
                ),
                Err(e) => format!("{e:?}"),
            }
        }
        Op::SettleCapped(jobs, take, max) => {
            let settlements: Vec<ops::Settlement> =
                jobs.iter().map(|(kind, p)| settlement(*kind, p)).collect();
            let finished: Vec<ops::Finished<'_>> = jobs
                .iter()
                .zip(&settlements)
                .map(|((_, p), settlement)| ops::Finished {
                    queue: 0,
                    payload: p.as_bytes(),
                    settlement,
                    release: None,
                    kept: None,
                })
                .collect();
            let limits = ops::Limits {
                max_attempts: MAX_ATTEMPTS,
                max_payload_bytes: max,
                keep_outcomes: None,
            };
            match ops::settle(c, std::slice::from_ref(q), w, &finished, take, limits, None).await {
                Ok((kept, taken)) => too_large_shown(
                    format!(
                        "{:?}",
                        (kept, taken.jobs.iter().map(shown).collect::<Vec<_>>())
                    ),
                    &taken,
                ),
                Err(e) => format!("{e:?}"),
            }
        }
        Op::DeadPickOldest(action) => {
            // The place, length and digest admin::dead_page gives a cut entry.
            let found: redis::RedisResult<Vec<redis::Value>> = redis::cmd("EVAL")
                .arg("local e = redis.call('LINDEX', KEYS[1], -1) return e and {#e, redis.sha1hex(e)} or {}")
                .arg(1)
                .arg(q.dead())
                .query_async(c)
                .await;
            let (size, digest) = match found.as_deref() {
                Ok([size, digest]) => (
                    redis::from_redis_value_ref::<u64>(size).expect("length"),
                    redis::from_redis_value_ref::<String>(digest).expect("digest"),
                ),
                // A wrong-typed dead list: the script is to refuse it.
                _ => (0, String::new()),
            };
            let reply: redis::RedisResult<Vec<i64>> = workerpool_queue::scripts::DEAD_PICK
                .key(q.dead())
                .key(q.waiting())
                .arg(action)
                .arg(-1)
                .arg(size)
                .arg(digest)
                .invoke_async(c)
                .await;
            format!("{reply:?}")
        }
        Op::DeadPage => format!(
            "{:?}",
            workerpool_queue::admin::dead_page(c, q, 0, 2)
                .await
                .map(|page| page
                    .iter()
                    .map(|e| (String::from_utf8_lossy(&e.raw).into_owned(), e.size))
                    .collect::<Vec<_>>())
        ),
        Op::SettleLimited(jobs, take, rate) => {
            let rate: RateLimit = rate.parse().expect("a row's rate limit parses");
            let settlements: Vec<ops::Settlement> =
                jobs.iter().map(|(kind, p)| settlement(*kind, p)).collect();
            let finished: Vec<ops::Finished<'_>> = jobs
                .iter()
                .zip(&settlements)
                .map(|((_, p), settlement)| ops::Finished {
                    queue: 0,
                    payload: p.as_bytes(),
                    settlement,
                    release: None,
                    kept: None,
                })
                .collect();
            let reply = ops::settle(
                c,
                std::slice::from_ref(q),
                w,
                &finished,
                take,
                MAX_ATTEMPTS,
                Some(&rate),
            )
            .await;
            match reply {
                Ok((kept, taken)) => limited_shown(
                    format!(
                        "{:?}",
                        (kept, taken.jobs.iter().map(shown).collect::<Vec<_>>())
                    ),
                    &taken,
                ),
                Err(e) => format!("{e:?}"),
            }
        }
        Op::Settle(jobs, take) => {
            let settlements: Vec<ops::Settlement> =
                jobs.iter().map(|(kind, p)| settlement(*kind, p)).collect();
            let finished: Vec<ops::Finished<'_>> = jobs
                .iter()
                .zip(&settlements)
                .map(|((_, p), settlement)| ops::Finished {
                    queue: 0,
                    payload: p.as_bytes(),
                    settlement,
                    release: None,
                    kept: None,
                })
                .collect();
            format!(
                "{:?}",
                ops::settle(
                    c,
                    std::slice::from_ref(q),
                    w,
                    &finished,
                    take,
                    MAX_ATTEMPTS,
                    None
                )
                .await
                .map(|(kept, taken)| (kept, taken.jobs.iter().map(shown).collect::<Vec<_>>()))
            )
        }
    };
    // Ok(x) -> x: the rows state replies without the Result.
    normalized(
        &r.strip_prefix("Ok(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or(&r)
            .replace(['"', '\\'], ""),
    )
}

const MAX_ATTEMPTS: u32 = 10;

/// A row's settlement of kind `A`, `T`, `R` or `B` for payload `p`.
fn settlement(kind: char, p: &str) -> ops::Settlement {
    match kind {
        'A' => ops::Settlement::Done,
        'T' => ops::Settlement::Retry {
            next: format!("{p}-next"),
            delay: Duration::from_secs(60),
        },
        'R' => ops::Settlement::NotRun {
            next: format!("{p}-next"),
            delay: Duration::from_secs(60),
        },
        _ => ops::Settlement::Dead {
            envelope: format!("{p}-letter"),
        },
    }
}

/// A reply with the rate limit's wait, rounded to 50 ms, when it stopped
/// the taking.
fn limited_shown(jobs: String, taken: &ops::Taken) -> String {
    match taken.limited {
        Some(l) => format!("{jobs} limited {}ms", round_50(l.wait.as_millis() as i64)),
        None => jobs,
    }
}

/// A reply with the errors of the payloads dead-lettered as too large.
fn too_large_shown(jobs: String, taken: &ops::Taken) -> String {
    if taken.too_large.is_empty() {
        return jobs;
    }
    let errors: Vec<&str> = taken.too_large.iter().map(|t| t.error.as_str()).collect();
    format!("{jobs} too_large {errors:?}")
}

/// To the nearest 50 (ms): the rows' waits and buckets, which the time
/// between a row's steps shifts by a few ms.
/// A time ahead of the server's clock, up to the next 50 ms: time only
/// passes between the scene and the read, so such a figure can only come
/// out short of the row's (by the round trips between, longer on a busy
/// machine), never long.
fn round_50(ms: i64) -> i64 {
    (ms + 49).div_euclid(50) * 50
}

/// A taken payload as a row states it: with `~fresh` or `~counted` when
/// the script stamped it.
fn shown(f: &ops::Fetched) -> String {
    let payload = String::from_utf8_lossy(&f.payload);
    match f.stamp {
        Stamp::Untouched => payload.into_owned(),
        Stamp::Fresh(n) => {
            // The count is the bytes added after the brace.
            let added = &f.payload[1..1 + n];
            assert!(added.starts_with(b"\"attempt\":1"), "{payload}: {n}");
            format!("{payload} ~fresh")
        }
        Stamp::Counted => format!("{payload} ~counted"),
    }
}

/// Generated ids as `<id>`, and the server's clock in ms as `<now>`.
fn normalized(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    let next = |r: &str| {
        ["id:", "enqueued_at:", "died_at:"]
            .iter()
            .filter_map(|n| r.find(n))
            .min()
    };
    while let Some(at) = next(rest) {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let (name, value) = if let Some(v) = tail.strip_prefix("id:") {
            ("id:", v)
        } else if let Some(v) = tail.strip_prefix("died_at:") {
            ("died_at:", v)
        } else {
            ("enqueued_at:", &tail["enqueued_at:".len()..])
        };
        out.push_str(name);
        let generated = value
            .get(..32)
            .filter(|v| v.bytes().all(|b| b.is_ascii_hexdigit()));
        let clock = value
            .get(..13)
            .filter(|v| v.bytes().all(|b| b.is_ascii_digit()) && v.starts_with('1'));
        rest = match (generated, clock) {
            (Some(_), _) if name == "id:" => {
                out.push_str("<id>");
                &value[32..]
            }
            (_, Some(_)) if name != "id:" => {
                out.push_str("<now>");
                &value[13..]
            }
            _ => value,
        };
    }
    out.push_str(rest);
    out
}

/// The Redis server's clock, unix ms.
async fn server_ms(c: &mut MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(c).await.expect("time");
    secs * 1000 + micros / 1000
}

/// Every key of the queue, as `key=contents`, sorted.
async fn state(c: &mut MultiplexedConnection, q: &QueueKeys) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", q.name()))
        .query_async(c)
        .await
        .expect("keys");
    keys.sort();
    // One clock for every key, read before any of them.
    let now = server_ms(c).await;
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(c)
            .await
            .expect("type");
        let contents = match kind.as_str() {
            "list" => {
                let v: Vec<String> = redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(c)
                    .await
                    .expect("lrange");
                format!("[{}]", v.join(", "))
            }
            "zset" => {
                let v: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(c)
                    .await
                    .expect("zrange");
                format!("{{{}}}", v.join(", "))
            }
            // Worker hashes are checked through the registry rows; their
            // contents are the heartbeat's business.
            "hash" if key.contains(":worker:") => continue,
            "hash" => {
                let mut v: Vec<(String, String)> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(c)
                    .await
                    .expect("hgetall");
                v.sort();
                let pairs: Vec<String> = v.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!("{{{}}}", pairs.join(", "))
            }
            // The bucket's arrival time, relative to the server's clock.
            _ if key.ends_with(":rate") => {
                let v: f64 = redis::cmd("GET")
                    .arg(&key)
                    .query_async(c)
                    .await
                    .expect("get");
                format!("now+{}ms", round_50(v as i64 - now))
            }
            _ => {
                let v: String = redis::cmd("GET")
                    .arg(&key)
                    .query_async(c)
                    .await
                    .expect("get");
                v
            }
        };
        let name = key.replacen(q.name(), "<q>", 1);
        out.push(format!("{name}={contents}"));
    }
    out
}

#[tokio::test]
async fn every_script_follows_its_rule() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let mut failures = Vec::new();
    for (i, row) in ROWS.iter().enumerate() {
        let q = QueueKeys::new(format!("t{i}"));
        for command in row.given {
            let mut cmd = redis::cmd(command[0]);
            for arg in &command[1..] {
                let arg = match arg.strip_prefix("<now+").and_then(|a| a.strip_suffix('>')) {
                    Some(ahead) => {
                        let ahead: i64 = ahead.parse().expect("<now+ms>");
                        (server_ms(&mut c).await + ahead).to_string()
                    }
                    None => arg.replace("<q>", q.name()),
                };
                cmd.arg(arg);
            }
            let _: redis::Value = cmd.query_async(&mut c).await.expect("given");
        }
        let reply = run(&mut c, &q, row.op).await;
        let then: Vec<String> = state(&mut c, &q)
            .await
            .iter()
            .map(|s| normalized(&s.replace('"', "")))
            .collect();
        let expected: Vec<String> = row.then.iter().map(|s| s.to_string()).collect();
        if reply != row.reply || then != expected {
            failures.push(format!(
                "{}:\n  reply {reply} (expected {})\n  then  {then:?}\n  want  {expected:?}",
                row.rule, row.reply
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_pools_claims_of_schedules_it_no_longer_has_are_forgotten_and_no_others() {
    use redis::AsyncCommands;
    use workerpool_queue::schedule::{Fired, fire, forget_fires, last_fire};
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("fires");
    let job = |id: &str| {
        let mut job = serde_json::Map::new();
        job.insert("id".into(), id.into());
        job
    };
    for (n, schedule) in ["ns/a/x", "ns/a/y", "ns/ab/y", "other/a/y"]
        .into_iter()
        .enumerate()
    {
        let fired = fire(&mut c, &q, schedule, 1_000, &job(&format!("j{n}"))).await;
        assert_eq!(fired, Ok(Fired::Enqueued), "{schedule}");
    }
    let forgotten = forget_fires(&mut c, &q, "ns/a/", &["x"]).await;
    assert_eq!(forgotten, Ok(1));
    let mut left: Vec<String> = c.hkeys(q.fires()).await.expect("hkeys");
    left.sort();
    assert_eq!(left, ["ns/a/x", "ns/ab/y", "other/a/y"]);
    // Added again, the schedule starts afresh: its earlier claim is gone.
    assert_eq!(last_fire(&mut c, &q, "ns/a/y").await, Ok(None));
    assert_eq!(
        fire(&mut c, &q, "ns/a/y", 500, &job("again")).await,
        Ok(Fired::Enqueued)
    );
    assert_eq!(forget_fires(&mut c, &q, "ns/a/", &["x", "y"]).await, Ok(0));
    assert_eq!(forget_fires(&mut c, &q, "ns/a/", &[]).await, Ok(2));
}

/// Every key of the layout the rows' scripts name, with the type the
/// contract keeps there.
fn layout(q: &QueueKeys) -> Vec<(String, &'static str)> {
    let mut keys = vec![
        (q.waiting().to_string(), "list"),
        (q.retry(), "zset"),
        (q.scheduled(), "zset"),
        (q.dead(), "list"),
        (q.workers(), "zset"),
        (q.unique(), "hash"),
        (q.unique_expiry(), "zset"),
        (q.rate(), "string"),
        (q.stats_processed(), "string"),
        (q.stats_failed(), "string"),
        (q.stats_dead(), "string"),
        (q.stats_recovered(), "string"),
        (q.stats_duration(), "string"),
        (q.stats_duration_sq(), "string"),
        (q.fires(), "hash"),
    ];
    for instance in ["w~1", "w~2"] {
        keys.push((q.processing(instance), "list"));
        keys.push((q.worker(instance), "hash"));
    }
    keys
}

/// Two commands that leave `key` holding a type other than `kept`.
fn wrong_types(key: &str, kept: &str) -> [Vec<String>; 2] {
    let s = |parts: &[&str]| parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let string = s(&["SET", key, "junk"]);
    let list = s(&["RPUSH", key, "junk"]);
    let hash = s(&["HSET", key, "junk", "junk"]);
    match kept {
        "string" => [list, hash],
        "hash" => [string, list],
        _ => [string, hash],
    }
}

/// Sets the scene of `row` on `q`.
async fn given(c: &mut MultiplexedConnection, q: &QueueKeys, row: &Row) {
    for command in row.given {
        let mut cmd = redis::cmd(command[0]);
        for arg in &command[1..] {
            let arg = match arg.strip_prefix("<now+").and_then(|a| a.strip_suffix('>')) {
                Some(ahead) => {
                    let ahead: i64 = ahead.parse().expect("<now+ms>");
                    (server_ms(c).await + ahead).to_string()
                }
                None => arg.replace("<q>", q.name()),
            };
            cmd.arg(arg);
        }
        let _: redis::Value = cmd.query_async(c).await.expect("given");
    }
}

/// Redis does not undo a script's writes when a later command fails. Every
/// row's operation is run again with each key of the layout it did not
/// set up holding the wrong type (another program's key, or a queue named
/// like this queue's key): either the script did not need that key and
/// did exactly what the row says, or it refused with an error naming the
/// key and changed nothing, so no job was moved out of one key and lost on
/// its way to the next.
#[tokio::test]
async fn a_script_that_meets_a_wrong_typed_key_changes_nothing() {
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let mut failures = Vec::new();
    let (mut refused, mut untouched) = (0, 0);
    let mut n = 0;
    for row in ROWS {
        for (key, kept) in layout(&QueueKeys::new("x")) {
            for wrong in wrong_types(&key, kept) {
                n += 1;
                let q = QueueKeys::new(format!("w{n}"));
                let key = key.replacen('x', q.name(), 1);
                given(&mut c, &q, row).await;
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut c)
                    .await
                    .expect("exists");
                if exists {
                    continue;
                }
                let mut cmd = redis::cmd(&wrong[0]);
                cmd.arg(&key).arg(&wrong[2..]);
                let _: redis::Value = cmd.query_async(&mut c).await.expect("wrong type");
                let before = state(&mut c, &q).await;
                let reply = run(&mut c, &q, row.op).await;
                let after = state(&mut c, &q).await;
                let junk = key.replacen(q.name(), "<q>", 1);
                if reply.contains("WRONGTYPE") {
                    refused += 1;
                    if after != before || !reply.contains(&key) {
                        failures.push(format!(
                            "{} with {key} {}: {reply}\n  before {before:?}\n  after  {after:?}",
                            row.rule, wrong[0]
                        ));
                    }
                } else {
                    untouched += 1;
                    let then: Vec<String> = after
                        .iter()
                        .filter(|s| !s.starts_with(&format!("{junk}=")))
                        .map(|s| normalized(&s.replace('"', "")))
                        .collect();
                    let kept_junk = after.iter().any(|s| s.starts_with(&format!("{junk}=")))
                        == before.iter().any(|s| s.starts_with(&format!("{junk}=")));
                    if reply != row.reply || then != row.then || !kept_junk {
                        failures.push(format!(
                            "{} with {key} {}: reply {reply}\n  then {then:?}\n  want {:?}",
                            row.rule, wrong[0], row.then
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Both ways are taken: the rows name most keys and leave others alone.
    assert!(
        refused > 100 && untouched > 100,
        "{refused} refused, {untouched} untouched"
    );
}

#[tokio::test]
async fn a_large_payload_is_settled_by_its_name_and_only_its_exact_bytes_go() {
    use redis::AsyncCommands;
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("named");
    let w = "w~1";
    // Two held payloads of the same length over the threshold, one byte
    // apart, and a small one: only the named one is removed.
    let big = |last: char| format!("{{\"d\":\"{}{last}\"}}", "x".repeat(ops::NAMED_ABOVE));
    let (one, two) = (big('1'), big('2'));
    let small = r#"{"id":"s"}"#;
    let _: () = c
        .rpush(q.processing(w), &[one.as_str(), two.as_str(), small])
        .await
        .expect("rpush");
    assert_eq!(settle_done(&mut c, &q, w, &two).await, [true]);
    let left = ops::processing(&mut c, &q, w).await.expect("lrange");
    assert_eq!(left, [one.as_bytes(), small.as_bytes()]);
    let again = settle_done(&mut c, &q, w, &two).await;
    assert_eq!(again, [false], "gone: not settled twice");
    assert_eq!(settle_done(&mut c, &q, w, small).await, [true]);
    assert_eq!(settle_done(&mut c, &q, w, &one).await, [true]);
    let processed: u64 = c.get(q.stats_processed()).await.expect("get");
    assert_eq!(processed, 3);
    assert!(
        ops::processing(&mut c, &q, w)
            .await
            .expect("lrange")
            .is_empty()
    );
}

/// Settles one held payload as done, taking nothing; whether it was held.
async fn settle_done(
    c: &mut MultiplexedConnection,
    q: &QueueKeys,
    w: &str,
    payload: &str,
) -> Vec<bool> {
    let done = ops::Settlement::Done;
    let finished = [ops::Finished {
        queue: 0,
        payload: payload.as_bytes(),
        settlement: &done,
        release: None,
        kept: None,
    }];
    ops::settle(
        c,
        std::slice::from_ref(q),
        w,
        &finished,
        0,
        MAX_ATTEMPTS,
        None,
    )
    .await
    .expect("settle")
    .0
}

#[tokio::test]
async fn a_large_payload_named_at_intake_is_stamped_by_the_script_as_the_worker_did() {
    use workerpool_queue::job::{fresh_stamp, take_stamped};
    let redis = TestRedis::start();
    let mut c = redis.conn().await;
    let q = QueueKeys::new("named-intake");
    let w = "w~1";
    let pushed = format!(
        r#"{{"task":"big","data":"{}","n":1.10}}"#,
        "x".repeat(ops::NAMED_ABOVE)
    );
    let other = r#"{"task":"small"}"#;
    let _: () = redis::cmd("RPUSH")
        .arg(q.processing(w))
        .arg(&pushed)
        .arg(other)
        .query_async(&mut c)
        .await
        .expect("rpush");
    let added = fresh_stamp(pushed.as_bytes(), 1_700_000_000_000, 5).expect("a fresh job");
    let action = IntakeAction::RunNamed {
        name: ops::name_of(pushed.as_bytes()),
        added: added.clone(),
    };
    let kept = ops::settle_intake(&mut c, &q, w, std::slice::from_ref(&action))
        .await
        .expect("settle_intake");
    assert_eq!(kept, [true]);
    let held = ops::processing(&mut c, &q, w).await.expect("lrange");
    let stamped = format!("{{{added}{}", &pushed[1..]);
    assert_eq!(held, [stamped.as_bytes(), other.as_bytes()]);
    let (job, _) = take_stamped(held[0].clone(), Stamp::Fresh(added.len())).expect("stands");
    assert_eq!((job.attempt(), job.task()), (1, Some("big")));
    // Gone meanwhile (a reaper returned it): nothing is written.
    let again = ops::settle_intake(&mut c, &q, w, std::slice::from_ref(&action))
        .await
        .expect("settle_intake");
    assert_eq!(again, [false]);
    assert_eq!(
        ops::processing(&mut c, &q, w).await.expect("lrange").len(),
        2
    );
}
