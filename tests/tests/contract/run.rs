//! One run: a case with one producer and one handler, on a Redis of its
//! own, step by step, each check saying what differed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::process::Child;
use workerpool_tests::{TestRedis, TestRedisCluster, TestTlsRedis, free_port};

use crate::adapters::{
    AdapterProcess, Answer, Producer, Program, bins, cli_op, cli_produce, parse_answer, tail,
};
use crate::case::{
    CancelStep, Case, CaseJob, DeadExpect, Expect, Produce, RedisKind, StatusStep, Step, WaitStep,
    WorkerStep,
};
use crate::json::{difference, mismatch};

/// How far `enqueued_at` (and the times derived from the clock: a delayed
/// job's `run_at`) may stray from the Redis clock during the call: a
/// client may keep the offset to the Redis clock from an earlier `TIME`
/// (saving a round trip per call), which is right to within that reading's
/// round trip. The oldest job's age, which the field is for, is read in
/// seconds.
const ENQUEUED_AT_SLACK_MS: u64 = 250;

/// The Redis of one run.
enum Server {
    Plain(TestRedis),
    Tls(TestTlsRedis, bool),
    Cluster(TestRedisCluster),
}

impl Server {
    fn start(kind: RedisKind) -> Self {
        match kind {
            RedisKind::Plain => Server::Plain(TestRedis::start()),
            RedisKind::Tls => Server::Tls(TestTlsRedis::start(false), false),
            RedisKind::Mtls => Server::Tls(TestTlsRedis::start(true), true),
            RedisKind::Cluster => Server::Cluster(TestRedisCluster::start(3, 0)),
        }
    }

    fn url(&self) -> String {
        match self {
            Server::Plain(r) => r.url(),
            Server::Tls(r, _) => r.url(),
            Server::Cluster(c) => c.url(0),
        }
    }

    /// The adapter request's `tls`.
    fn tls(&self) -> Value {
        match self {
            Server::Tls(r, mutual) => {
                let path = |p: &Path| Value::from(p.display().to_string());
                json!({
                    "ca": path(&r.certs.ca),
                    "cert": if *mutual { path(&r.certs.client_cert) } else { Value::Null },
                    "key": if *mutual { path(&r.certs.client_key) } else { Value::Null },
                })
            }
            _ => Value::Null,
        }
    }

    /// The worker's and the command line's connection flags.
    fn flags(&self) -> Vec<String> {
        let mut out = vec!["--redis-url".to_string(), self.url()];
        match self {
            Server::Tls(r, mutual) => {
                out.push("--redis-ca-file".into());
                out.push(r.certs.ca.display().to_string());
                if *mutual {
                    out.push("--redis-client-cert".into());
                    out.push(r.certs.client_cert.display().to_string());
                    out.push("--redis-client-key".into());
                    out.push(r.certs.client_key.display().to_string());
                }
            }
            Server::Cluster(_) => out.extend(["--redis-mode".into(), "cluster".into()]),
            Server::Plain(_) => {}
        }
        out
    }

    async fn conn(&self) -> Conn {
        match self {
            Server::Plain(r) => Conn::Single(r.conn().await),
            Server::Tls(r, _) => Conn::Single(r.conn().await),
            Server::Cluster(c) => Conn::Cluster(c.conn().await),
        }
    }
}

/// A connection for the runner's own reads.
enum Conn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, String> {
        let r = match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        };
        r.map_err(|e| format!("redis: {e}"))
    }
}

/// `text` cut to a length that keeps a failure readable.
fn short(text: &str) -> String {
    const MAX: usize = 600;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}… ({} bytes)", &text[..end], text.len()),
        None => text.to_string(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A job a produce step got accepted.
#[derive(Debug, Clone)]
struct Produced {
    id: String,
    task: String,
    data: Value,
    /// Not to run before this (unix ms), for a delayed job.
    not_before: Option<u64>,
}

/// A line of the record file and when the runner first saw it.
#[derive(Debug, Clone)]
struct Seen {
    record: Value,
    at_ms: u64,
}

/// The state of one run.
struct Run<'a> {
    case: &'a Case,
    producer: &'a Producer,
    handler: &'a Program,
    bins: PathBuf,
    server: Server,
    conn: Conn,
    dir: tempfile::TempDir,
    adapter: Option<AdapterProcess>,
    worker: Option<Child>,
    jobs: HashMap<String, Produced>,
    /// Payloads each queue should hold while no worker has run.
    held: BTreeMap<String, usize>,
    seen: Vec<Seen>,
}

impl Run<'_> {
    fn records_path(&self) -> PathBuf {
        self.dir.path().join("records.jsonl")
    }

    fn worker_log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default();
        if text.trim().is_empty() {
            String::new()
        } else {
            format!("\nthe worker's last lines:\n{}", tail(&text, 25))
        }
    }

    /// The request line of a produce step, with run_at_in_ms made absolute.
    fn request(&self, p: &Produce) -> Value {
        let now = now_ms();
        let jobs: Vec<Value> = p
            .jobs
            .iter()
            .map(|j| {
                json!({
                    "task": j.task,
                    "data": j.data,
                    "id": j.id,
                    "delay_ms": j.delay_ms,
                    "run_at_ms": j.run_at_in_ms.map(|d| now + d),
                    "unique_key": j.unique_key,
                    "unique_for_s": j.unique_for_s,
                    "keep_s": j.keep_s,
                })
            })
            .collect();
        json!({
            "url": self.server.url(),
            "tls": self.server.tls(),
            "cluster": matches!(self.server, Server::Cluster(_)),
            "queue": p.queue,
            "many": p.many,
            "jobs": jobs,
        })
    }

    /// Sends `request` through `concurrent` producers at once.
    async fn produce(&mut self, request: &Value, concurrent: usize) -> Result<Vec<Answer>, String> {
        let jobs = request["jobs"].as_array().map_or(0, Vec::len);
        match self.producer.clone() {
            Producer::Cli => {
                // Each producer a thread of its own, so their commands overlap.
                let (bins, flags) = (&self.bins, self.server.flags());
                std::thread::scope(|s| {
                    let calls: Vec<_> = (0..concurrent)
                        .map(|_| s.spawn(|| cli_produce(bins, &flags, request)))
                        .collect();
                    calls
                        .into_iter()
                        .map(|c| c.join().expect("a producer thread"))
                        .collect()
                })
            }
            Producer::Adapter(program) if concurrent == 1 => {
                if self.adapter.is_none() {
                    self.adapter = Some(AdapterProcess::start(&program)?);
                }
                let a = self.adapter.as_mut().expect("started");
                a.send(request).await?;
                let answer = a.answer().await?;
                Ok(vec![
                    parse_answer(answer, jobs).map_err(|e| format!("{}{}", e, a.said()))?,
                ])
            }
            Producer::Adapter(program) => {
                let mut procs = Vec::new();
                for _ in 0..concurrent {
                    procs.push(AdapterProcess::start(&program)?);
                }
                for p in &mut procs {
                    p.send(request).await?;
                }
                let mut out = Vec::new();
                for p in &mut procs {
                    let answer = p.answer().await?;
                    out.push(parse_answer(answer, jobs)?);
                }
                Ok(out)
            }
        }
    }

    async fn produce_step(&mut self, n: usize, p: &Produce) -> Result<(), String> {
        let before: Option<u64> = match self.server {
            Server::Cluster(_) => None,
            _ => Some(self.conn.query(&redis::cmd("DBSIZE")).await?),
        };
        let request = self.request(p);
        let t0 = now_ms();
        let answers = self.produce(&request, p.concurrent).await?;
        let t1 = now_ms() + 1;
        let labels: Vec<&str> = p.jobs.iter().map(|j| j.label.as_str()).collect();
        if p.error {
            for answer in &answers {
                match answer {
                    Err(e) if !e.trim().is_empty() => {}
                    Err(_) => return Err(format!("step {n}: jobs {labels:?}: the error is empty")),
                    Ok(ids) => {
                        return Err(format!(
                            "step {n}: jobs {labels:?} must be refused with an error, the producer answered ids {ids:?}"
                        ));
                    }
                }
            }
            if let Some(before) = before {
                let after: u64 = self.conn.query(&redis::cmd("DBSIZE")).await?;
                if after != before {
                    return Err(format!(
                        "step {n}: jobs {labels:?} were refused but the database went from {before} to {after} keys"
                    ));
                }
            }
            return Ok(());
        }
        let mut all = Vec::new();
        for answer in answers {
            match answer {
                Ok(ids) => all.push(ids),
                Err(e) => {
                    return Err(format!(
                        "step {n}: jobs {labels:?}: the producer raised: {e}"
                    ));
                }
            }
        }
        let jobs = request["jobs"].as_array().expect("jobs").clone();
        let mut fresh = Vec::new();
        for (i, job) in p.jobs.iter().enumerate() {
            let want = p.accepted.as_ref().is_none_or(|a| a[i]);
            let got: Vec<&String> = all.iter().filter_map(|ids| ids[i].as_ref()).collect();
            let what = if p.concurrent > 1 {
                format!("of {} producers at once, ", p.concurrent)
            } else {
                String::new()
            };
            match (want, got.as_slice()) {
                (true, [id]) => {
                    if let Some(given) = &job.id {
                        if *id != given {
                            return Err(format!(
                                "step {n}: job {:?}: the id {given:?} was given, the producer answered {id:?}",
                                job.label
                            ));
                        }
                    } else if !is_fresh_id(id) {
                        return Err(format!(
                            "step {n}: job {:?}: the new id {id:?} is not 32 lowercase hex digits",
                            job.label
                        ));
                    }
                    let produced = Produced {
                        id: id.to_string(),
                        task: job.task.clone(),
                        data: job.data.clone(),
                        not_before: jobs[i]["run_at_ms"]
                            .as_u64()
                            .or(job.delay_ms.map(|d| t0 + d)),
                    };
                    fresh.push((job, i, produced.clone()));
                    self.jobs.insert(job.label.clone(), produced);
                    *self.held.entry(p.queue.clone()).or_default() += 1;
                }
                (false, []) => {}
                (true, _) => {
                    return Err(format!(
                        "step {n}: job {:?}: {what}exactly one must be accepted, the ids answered were {got:?}",
                        job.label
                    ));
                }
                (false, _) => {
                    return Err(format!(
                        "step {n}: job {:?}: {what}none must be accepted (its unique key is held), the ids answered were {got:?}",
                        job.label
                    ));
                }
            }
        }
        if self.worker.is_none() {
            self.check_payloads(n, p, &jobs, &fresh, t0, t1).await?;
        }
        Ok(())
    }

    /// Reads the payloads of a produce step's jobs from Redis (before any
    /// worker runs) and checks them against the contract.
    async fn check_payloads(
        &mut self,
        n: usize,
        p: &Produce,
        request_jobs: &[Value],
        fresh: &[(&CaseJob, usize, Produced)],
        t0: u64,
        t1: u64,
    ) -> Result<(), String> {
        let q = &p.queue;
        let list: Vec<String> = self
            .conn
            .query(redis::cmd("LRANGE").arg(q).arg(0).arg(-1))
            .await?;
        let scheduled: Vec<(String, f64)> = self
            .conn
            .query(
                redis::cmd("ZRANGE")
                    .arg(format!("{q}:scheduled"))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await?;
        let held = self.held.get(q).copied().unwrap_or(0);
        if list.len() + scheduled.len() != held {
            return Err(format!(
                "step {n}: {q} and {q}:scheduled hold {} payloads, {held} jobs were accepted: {}",
                list.len() + scheduled.len(),
                short(&format!("{list:?} {scheduled:?}"))
            ));
        }
        let entries = list
            .iter()
            .map(|p| (p, None))
            .chain(scheduled.iter().map(|(p, s)| (p, Some(*s))));
        let mut by_id: HashMap<String, Vec<(Value, Option<f64>, String)>> = HashMap::new();
        for (raw, score) in entries {
            let v: Value = serde_json::from_str(raw)
                .map_err(|e| format!("step {n}: a payload on {q} is not JSON ({e}): {raw}"))?;
            let id = v["id"].as_str().unwrap_or_default().to_string();
            by_id.entry(id).or_default().push((v, score, raw.clone()));
        }
        for (job, i, produced) in fresh {
            let label = &job.label;
            let found = by_id
                .get(&produced.id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let [(payload, score, raw)] = found else {
                return Err(format!(
                    "step {n}: job {label:?}: {} payloads with the id {:?} on {q} and {q}:scheduled (one expected); they hold {}",
                    found.len(),
                    produced.id,
                    short(&format!("{list:?} {scheduled:?}"))
                ));
            };
            let fail = |what: String| {
                Err(format!(
                    "step {n}: job {label:?}: {what}; the payload: {}",
                    short(raw)
                ))
            };
            let Some(fields) = payload.as_object() else {
                return fail("the payload is not a JSON object".into());
            };
            if fields.get("task") != Some(&Value::String(job.task.clone())) {
                return fail(format!("\"task\" must be {:?}", job.task));
            }
            let data = fields.get("data").cloned().unwrap_or(Value::Null);
            if let Some(diff) = difference(&job.data, &data, "data") {
                return fail(format!("the payload's data differs: {diff}"));
            }
            match (job.keep_s, fields.get("keep")) {
                (None, None) => {}
                (Some(s), Some(k)) if k.as_f64() == Some(s) => {
                    // Kept from the start: the enqueue wrote its outcome.
                    let state: Option<String> = self
                        .conn
                        .query(
                            redis::cmd("HGET")
                                .arg(format!("{q}:job:{}", produced.id))
                                .arg("state"),
                        )
                        .await?;
                    if !matches!(state.as_deref(), Some("waiting" | "scheduled")) {
                        return fail(format!(
                            "a job enqueued with keep must read waiting (or scheduled) at once: {q}:job:{} has the state {state:?}",
                            produced.id
                        ));
                    }
                }
                (Some(s), _) => return fail(format!("\"keep\" must be {s}, as asked")),
                (None, Some(_)) => {
                    return fail("a job without keep_s must not carry \"keep\"".into());
                }
            }
            match fields.get("enqueued_at").and_then(Value::as_u64) {
                Some(at)
                    if (t0.saturating_sub(ENQUEUED_AT_SLACK_MS)..=t1 + ENQUEUED_AT_SLACK_MS)
                        .contains(&at) => {}
                Some(at) => {
                    return fail(format!(
                        "\"enqueued_at\" {at} is outside the enqueue call ({t0}..={t1} unix ms, give or take {ENQUEUED_AT_SLACK_MS} ms): it must be the Redis clock at the call, read with TIME then or kept as an offset from an earlier reading"
                    ));
                }
                None => return fail("\"enqueued_at\" (unix ms, an integer) is missing".into()),
            }
            let keys: Vec<&str> = fields
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "run_at")
                .collect();
            if !keys.ends_with(&["id", "enqueued_at"]) {
                return fail(format!(
                    "\"id\" and \"enqueued_at\" must be the object's last two fields (\"run_at\" may follow), the fields are {:?}",
                    fields.keys().collect::<Vec<_>>()
                ));
            }
            let run_at = fields.get("run_at");
            let asked = request_jobs[*i]["run_at_ms"].as_u64();
            match (job.delay_ms, asked) {
                (None, None) => {
                    if score.is_some() || run_at.is_some() {
                        return fail(format!(
                            "a job without delay must wait on {q}, not in {q}:scheduled, without run_at"
                        ));
                    }
                }
                (Some(delay), _) => {
                    let Some(at) = run_at.and_then(Value::as_u64) else {
                        return fail("a delayed job must carry \"run_at\" (unix ms)".into());
                    };
                    if !((t0 + delay).saturating_sub(ENQUEUED_AT_SLACK_MS)
                        ..=t1 + delay + ENQUEUED_AT_SLACK_MS)
                        .contains(&at)
                    {
                        return fail(format!(
                            "\"run_at\" {at} is not the enqueue call's time plus {delay} ms ({}..={})",
                            t0 + delay,
                            t1 + delay
                        ));
                    }
                    if *score != Some(at as f64) {
                        return fail(format!(
                            "a delayed job must be in {q}:scheduled scored by its run_at {at}, its score is {score:?}"
                        ));
                    }
                }
                (None, Some(asked)) => {
                    if run_at.and_then(Value::as_u64) != Some(asked) {
                        return fail(format!("\"run_at\" must be {asked}, as asked"));
                    }
                    if score.is_some_and(|s| s != asked as f64) {
                        return fail(format!(
                            "the score in {q}:scheduled must be {asked}, it is {score:?}"
                        ));
                    }
                }
            }
            if let Some(key) = &job.unique_key {
                if fields.get("unique_key").and_then(Value::as_str) != Some(key) {
                    return fail(format!("\"unique_key\" must be {key:?}"));
                }
                if let Some(s) = job.unique_for_s
                    && fields.get("unique_for").and_then(Value::as_f64) != Some(s)
                {
                    return fail(format!("\"unique_for\" must be {s}"));
                }
                let holder: Option<String> = self
                    .conn
                    .query(redis::cmd("HGET").arg(format!("{q}:unique")).arg(key))
                    .await?;
                if holder.as_deref() != Some(produced.id.as_str()) {
                    return fail(format!(
                        "{q}:unique must name the job {:?} for {key:?}, it holds {holder:?}",
                        produced.id
                    ));
                }
                let until: Option<f64> = self
                    .conn
                    .query(
                        redis::cmd("ZSCORE")
                            .arg(format!("{q}:unique:expiry"))
                            .arg(key),
                    )
                    .await?;
                let hold = (job.unique_for_s.unwrap_or(3600.0) * 1000.0) as u64;
                if !until.is_some_and(|u| {
                    (t0 + hold).saturating_sub(ENQUEUED_AT_SLACK_MS) as f64 <= u
                        && u <= (t1 + hold + ENQUEUED_AT_SLACK_MS) as f64
                }) {
                    return fail(format!(
                        "{q}:unique:expiry must end the hold of {key:?} {hold} ms after the call ({}..={}), it says {until:?}",
                        t0 + hold,
                        t1 + hold
                    ));
                }
            }
        }
        Ok(())
    }

    fn start_worker(&mut self, w: &WorkerStep) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("worker.log"))
            .map_err(|e| format!("worker log: {e}"))?;
        let mut cmd = Program {
            name: "worker".into(),
            argv: vec![self.bins.join("workerpool-worker").display().to_string()],
            env: self.handler.env.clone(),
        }
        .command();
        cmd.args(self.server.flags());
        for q in &w.queues {
            cmd.arg("--queue").arg(q);
        }
        if let Some(children) = w.children {
            cmd.args(["--children", &children.to_string()]);
        }
        if let Some(beat) = &w.heartbeat {
            cmd.args(["--heartbeat-interval", beat]);
        }
        cmd.args(["--concurrency", &w.concurrency.to_string()])
            .args(["--max-attempts", &w.max_attempts.to_string()])
            .args([
                "--backoff-base",
                &w.backoff_base,
                "--backoff-max",
                &w.backoff_max,
            ])
            .args(["--shutdown-timeout", "1s", "--worker-id", "contract"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--handler", "exec", "--"])
            .args(&self.handler.argv)
            .env("CONTRACT_RECORD", self.records_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        self.worker = Some(
            cmd.spawn()
                .map_err(|e| format!("cannot start the worker: {e}"))?,
        );
        Ok(())
    }

    /// Reads the lines of the record file the runner has not seen yet.
    fn read_records(&mut self) -> Result<(), String> {
        let text = std::fs::read_to_string(self.records_path()).unwrap_or_default();
        let now = now_ms();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in complete.lines().skip(self.seen.len()) {
            let record: Value = serde_json::from_str(line).map_err(|e| {
                format!("the handler recorded a line that is not JSON ({e}): {line:?}")
            })?;
            self.seen.push(Seen { record, at_ms: now });
        }
        Ok(())
    }

    fn label_of(&self, id: &str) -> Option<&str> {
        self.jobs
            .iter()
            .find(|(_, j)| j.id == id)
            .map(|(l, _)| l.as_str())
    }

    async fn counter(&mut self, q: &str, name: &str) -> Result<u64, String> {
        let v: Option<u64> = self
            .conn
            .query(redis::cmd("GET").arg(format!("{q}:stats:{name}")))
            .await?;
        Ok(v.unwrap_or(0))
    }

    async fn dead_entries(&mut self, q: &str) -> Result<Vec<Value>, String> {
        let raw: Vec<String> = self
            .conn
            .query(redis::cmd("LRANGE").arg(format!("{q}:dead")).arg(0).arg(-1))
            .await?;
        raw.iter()
            .map(|r| {
                serde_json::from_str(r).map_err(|e| {
                    format!("a dead letter on {q}:dead is not JSON ({e}): {}", short(r))
                })
            })
            .collect()
    }

    /// What an expect step still waits for (empty when everything is there).
    async fn missing(&mut self, e: &Expect) -> Result<Vec<String>, String> {
        self.read_records()?;
        let mut missing = Vec::new();
        let recorded: HashSet<&str> = self
            .seen
            .iter()
            .filter_map(|s| s.record["id"].as_str())
            .collect();
        for r in &e.records {
            if !recorded.contains(self.jobs[&r.job].id.as_str()) {
                missing.push(format!("a record of {:?}", r.job));
            }
        }
        let mut dead_by_queue: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
        for d in &e.dead {
            if !dead_by_queue.contains_key(d.queue.as_str()) {
                dead_by_queue.insert(&d.queue, self.dead_entries(&d.queue).await?);
            }
            let id = &self.jobs[&d.job].id;
            if !dead_by_queue[d.queue.as_str()]
                .iter()
                .any(|x| x["job"]["id"] == **id)
            {
                missing.push(format!(
                    "the dead letter of {:?} on {}:dead",
                    d.job, d.queue
                ));
            }
        }
        for (kind, want) in [("processed", &e.processed), ("failed", &e.failed)] {
            for (q, n) in want {
                let got = self.counter(q, kind).await?;
                if got < *n {
                    missing.push(format!("{q}:stats:{kind} at {n} (it is {got})"));
                }
            }
        }
        Ok(missing)
    }

    async fn expect_step(&mut self, n: usize, e: &Expect) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(e.timeout_ms);
        loop {
            let missing = self.missing(e).await?;
            if missing.is_empty() {
                break;
            }
            if let Some(Ok(Some(status))) = self.worker.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "step {n}: the worker exited ({status}) while waiting for {missing:?}{}",
                    self.worker_log()
                ));
            }
            if Instant::now() > deadline {
                let seen: Vec<String> = self
                    .seen
                    .iter()
                    .map(|s| {
                        let id = s.record["id"].as_str().unwrap_or_default();
                        format!(
                            "{} {}",
                            self.label_of(id).unwrap_or("?"),
                            short(&s.record.to_string())
                        )
                    })
                    .collect();
                return Err(format!(
                    "step {n}: after {} ms still no {}; records seen: {seen:#?}{}",
                    e.timeout_ms,
                    missing.join(", "),
                    self.worker_log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.check_records(n, e)?;
        for d in &e.dead {
            self.check_dead(n, d).await?;
        }
        for (kind, want) in [("processed", &e.processed), ("failed", &e.failed)] {
            for (q, want) in want {
                let got = self.counter(q, kind).await?;
                if got != *want {
                    return Err(format!(
                        "step {n}: {q}:stats:{kind} is {got}, {want} expected"
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_records(&self, n: usize, e: &Expect) -> Result<(), String> {
        let wanted: HashMap<&str, u64> = e
            .records
            .iter()
            .map(|r| (r.job.as_str(), r.attempt))
            .collect();
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (pos, seen) in self.seen.iter().enumerate() {
            let r = &seen.record;
            let fail = |what: String| {
                Err(format!(
                    "step {n}: the handler's record {}: {what}",
                    short(&r.to_string())
                ))
            };
            let Some(id) = r["id"].as_str() else {
                return fail("no \"id\" string".into());
            };
            let Some(label) = self.label_of(id) else {
                return fail(format!("the id {id:?} is no accepted job's"));
            };
            let job = &self.jobs[label];
            let Some(attempt) = wanted.get(label) else {
                return fail(format!("job {label:?} must not have run (yet)"));
            };
            if first.insert(label, pos).is_some() {
                return fail(format!("job {label:?} was recorded twice"));
            }
            if r["attempt"].as_u64() != Some(*attempt) {
                return fail(format!("job {label:?}: \"attempt\" must be {attempt}"));
            }
            if r["task"].as_str() != Some(job.task.as_str()) {
                return fail(format!("job {label:?}: \"task\" must be {:?}", job.task));
            }
            let data = r.get("data").cloned().unwrap_or(Value::Null);
            if let Some(diff) = difference(&job.data, &data, "data") {
                return fail(format!(
                    "job {label:?}: the data differs from what was enqueued: {diff}"
                ));
            }
            if let Some(at) = job.not_before
                && seen.at_ms < at
            {
                return fail(format!(
                    "job {label:?} ran before its time: recorded by {} unix ms, {} ms before {at}",
                    seen.at_ms,
                    at - seen.at_ms
                ));
            }
        }
        for pair in e.order.windows(2) {
            for a in &pair[0] {
                for b in &pair[1] {
                    if first[a.as_str()] > first[b.as_str()] {
                        return Err(format!(
                            "step {n}: job {a:?} must run before job {b:?}, it ran after; the records in order: {:?}",
                            self.seen
                                .iter()
                                .map(|s| self
                                    .label_of(s.record["id"].as_str().unwrap_or_default())
                                    .unwrap_or("?"))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn check_dead(&mut self, n: usize, d: &DeadExpect) -> Result<(), String> {
        let job = self.jobs[&d.job].clone();
        let entries = self.dead_entries(&d.queue).await?;
        let entry = entries
            .iter()
            .find(|x| x["job"]["id"] == *job.id)
            .expect("waited for");
        let fail = |what: String| {
            Err(format!(
                "step {n}: the dead letter of {:?}: {what}; it is {}",
                d.job,
                short(&entry.to_string())
            ))
        };
        if entry["reason"] != *d.reason {
            return fail(format!("\"reason\" must be {:?}", d.reason));
        }
        if entry["attempts"].as_u64() != Some(d.attempts) {
            return fail(format!("\"attempts\" must be {}", d.attempts));
        }
        if !entry["error"]
            .as_str()
            .is_some_and(|e| e.contains(&d.error_contains))
        {
            return fail(format!("\"error\" must contain {:?}", d.error_contains));
        }
        if !entry["died_at"].is_u64() || !entry["worker"].is_string() {
            return fail("\"died_at\" (unix ms) and \"worker\" must be set".into());
        }
        if entry["job"]["task"] != *job.task {
            return fail(format!("the job's task must be {:?}", job.task));
        }
        let data = entry["job"].get("data").cloned().unwrap_or(Value::Null);
        if let Some(diff) = difference(&job.data, &data, "data") {
            return fail(format!("the job's data differs: {diff}"));
        }
        Ok(())
    }

    /// The id a status, wait or cancel step names, and how a failure names
    /// the job.
    fn named(&self, job: &Option<String>, id: &Option<String>) -> (String, String) {
        match (job, id) {
            (Some(label), _) => (self.jobs[label].id.clone(), format!("job {label:?}")),
            (None, Some(id)) => (id.clone(), format!("the id {id:?}")),
            (None, None) => unreachable!("checked at load"),
        }
    }

    /// Sends a `status`, `wait` or `cancel` request through the producer
    /// under test; its answer (an `error` answer is a failure).
    async fn ask(
        &mut self,
        op: &str,
        queue: &str,
        id: &str,
        timeout_ms: Option<u64>,
    ) -> Result<Value, String> {
        let mut request = json!({
            "op": op,
            "url": self.server.url(),
            "tls": self.server.tls(),
            "cluster": matches!(self.server, Server::Cluster(_)),
            "queue": queue,
            "id": id,
        });
        if let Some(ms) = timeout_ms {
            request["timeout_ms"] = ms.into();
        }
        let (answer, said) = match self.producer.clone() {
            Producer::Cli => (
                cli_op(&self.bins, &self.server.flags(), &request)?,
                String::new(),
            ),
            Producer::Adapter(program) => {
                if self.adapter.is_none() {
                    self.adapter = Some(AdapterProcess::start(&program)?);
                }
                let a = self.adapter.as_mut().expect("started");
                a.send(&request).await?;
                (a.answer().await?, a.said())
            }
        };
        if let Some(e) = answer.get("error") {
            return Err(format!("the producer raised: {e}{said}"));
        }
        Ok(answer)
    }

    /// Where the outcome `got` (null: none kept) fails `expect` (null: none
    /// must be kept), or None.
    fn outcome_mismatch(expect: &Value, got: &Value, id: &str) -> Option<String> {
        match (expect, got) {
            (Value::Null, Value::Null) => None,
            (Value::Null, _) => Some("must be null (no outcome kept)".into()),
            (_, Value::Null) => Some("is null (no outcome kept)".into()),
            (_, Value::Object(fields)) => {
                if let Some(other) = fields.get("id").and_then(Value::as_str)
                    && other != id
                {
                    return Some(format!("names the job {other:?}"));
                }
                expect.as_object()?.iter().find_map(|(field, want)| {
                    mismatch(want, fields.get(field).unwrap_or(&Value::Null), field)
                })
            }
            _ => Some("is not a JSON object or null".into()),
        }
    }

    async fn status_step(&mut self, n: usize, st: &StatusStep) -> Result<(), String> {
        let (id, name) = self.named(&st.job, &st.id);
        let deadline = Instant::now() + Duration::from_millis(st.within_ms);
        loop {
            let answer = self
                .ask("status", &st.queue, &id, None)
                .await
                .map_err(|e| format!("step {n}: the status of {name}: {e}"))?;
            let Some(got) = answer.get("status") else {
                return Err(format!(
                    "step {n}: the status of {name}: the answer {answer} has no \"status\""
                ));
            };
            let Some(why) = Self::outcome_mismatch(&st.expect, got, &id) else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                let within = if st.within_ms > 0 {
                    format!(" (for {} ms)", st.within_ms)
                } else {
                    String::new()
                };
                return Err(format!(
                    "step {n}: the status of {name}{within}: {why}; it is {}{}",
                    short(&got.to_string()),
                    self.worker_log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_step(&mut self, n: usize, w: &WaitStep) -> Result<(), String> {
        let (id, name) = self.named(&w.job, &w.id);
        let answer = self
            .ask("wait", &w.queue, &id, Some(w.timeout_ms))
            .await
            .map_err(|e| format!("step {n}: the wait for {name}: {e}"))?;
        let (timed_out, got) = match (answer.get("status"), answer.get("timeout")) {
            (Some(got), None) => (false, got),
            (None, Some(got)) => (true, got),
            _ => {
                return Err(format!(
                    "step {n}: the wait for {name}: the answer {answer} has neither \"status\" nor \"timeout\" (one of them)"
                ));
            }
        };
        if timed_out != w.times_out {
            return Err(format!(
                "step {n}: the wait for {name} {} within {} ms; {}{}",
                if timed_out {
                    "did not end"
                } else {
                    "must time out, it ended"
                },
                w.timeout_ms,
                short(&got.to_string()),
                self.worker_log()
            ));
        }
        if let Some(why) = Self::outcome_mismatch(&w.expect, got, &id) {
            return Err(format!(
                "step {n}: the {} of the wait for {name}: {why}; it is {}{}",
                if timed_out {
                    "last outcome"
                } else {
                    "final outcome"
                },
                short(&got.to_string()),
                self.worker_log()
            ));
        }
        Ok(())
    }

    async fn cancel_step(&mut self, n: usize, c: &CancelStep) -> Result<(), String> {
        let (id, name) = self.named(&c.job, &c.id);
        let answer = self
            .ask("cancel", &c.queue, &id, None)
            .await
            .map_err(|e| format!("step {n}: the cancel of {name}: {e}"))?;
        let Some(got) = answer.get("cancel").filter(|g| g.is_object()) else {
            return Err(format!(
                "step {n}: the cancel of {name}: the answer {answer} has no \"cancel\" object"
            ));
        };
        let expect = c.expect.as_object().expect("checked at load");
        if let Some(why) = expect
            .iter()
            .find_map(|(field, want)| mismatch(want, got.get(field).unwrap_or(&Value::Null), field))
        {
            return Err(format!(
                "step {n}: the cancel of {name}: {why}; it answered {got}{}",
                self.worker_log()
            ));
        }
        if got["did"] == "removed"
            && let Some(held) = self.held.get_mut(&c.queue)
        {
            // No longer on the queue: the payload checks count it out.
            *held = held.saturating_sub(1);
        }
        Ok(())
    }

    async fn steps(&mut self) -> Result<(), String> {
        let steps = self.case.steps.clone();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Produce(p) => self.produce_step(i + 1, p).await?,
                Step::Worker(w) => self.start_worker(w)?,
                Step::Expect(e) => self.expect_step(i + 1, e).await?,
                Step::Status(st) => self.status_step(i + 1, st).await?,
                Step::Wait(w) => self.wait_step(i + 1, w).await?,
                Step::Cancel(c) => self.cancel_step(i + 1, c).await?,
            }
        }
        Ok(())
    }
}

fn is_fresh_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Runs one case with one producer and one handler; the error says what
/// differed.
pub(crate) fn run_case(case: &Case, producer: &Producer, handler: &Program) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let server = Server::start(case.redis);
        let conn = server.conn().await;
        let mut run = Run {
            case,
            producer,
            handler,
            bins: bins(),
            server,
            conn,
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            adapter: None,
            worker: None,
            jobs: HashMap::new(),
            held: BTreeMap::new(),
            seen: Vec::new(),
        };
        let result = run.steps().await;
        if let Some(mut w) = run.worker.take() {
            let _ = w.kill().await;
        }
        result
    })
}
