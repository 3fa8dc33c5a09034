//! The dashboard against a real Redis: its JSON, its pages, its actions,
//! its token and read-only mode, a million waiting jobs, and the pages in
//! a real browser (headless Chromium from Debian, `apt-get install -y
//! chromium`) reading the rendered DOM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use tower::ServiceExt;
use workerpool_dashboard::{Dashboard, Options};
use workerpool_queue::connection::{Connection, Endpoint, Tls, redact};
use workerpool_queue::keys::QueueKeys;
use workerpool_tests::{TestRedis, bin_dir, eventually, free_port};

const EVIL: &str = "<script>document.documentElement.setAttribute('data-pwned','1')</script>";
const DEAD_ERROR: &str = "smtp said 550: mailbox unavailable";

async fn connect(url: &str) -> Connection {
    Endpoint::new(url, Tls::default())
        .expect("valid url")
        .connect(Duration::from_secs(3), Duration::from_secs(10))
        .await
        .expect("connect to test redis")
}

async fn dashboard(redis: &TestRedis, queues: &[&str], options: Options) -> axum::Router {
    let conn = connect(&redis.url()).await;
    let queues = queues.iter().map(|q| QueueKeys::new(*q)).collect();
    Dashboard::new(conn, queues, options).router()
}

fn writable() -> Options {
    Options {
        redis_label: "redis://127.0.0.1/0".into(),
        ..Options::default()
    }
}

/// A response's status, headers and body as text.
struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &axum::Router, req: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(req).await.expect("router answers");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

async fn get(app: &axum::Router, uri: &str) -> Reply {
    send(app, Request::get(uri).body(Body::empty()).expect("request")).await
}

async fn post_form(app: &axum::Router, uri: &str, form: &str) -> Reply {
    send(
        app,
        Request::post(uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form.to_string()))
            .expect("request"),
    )
    .await
}

fn json(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    serde_json::from_str(&reply.body).expect("JSON body")
}

/// The value of the action forms' hidden `csrf` field in a page.
fn csrf(page: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let at = page.find(marker).expect("a form with a csrf field") + marker.len();
    page[at..].split('"').next().unwrap_or_default().to_string()
}

fn dead_letter(id: &str, error: &str) -> String {
    serde_json::json!({
        "reason": "exhausted", "error": error, "attempts": 5,
        "died_at": 1_700_000_000_000u64, "worker": "mailer-1~00c0ffee",
        "job": {"id": id, "task": "send_email", "data": {"to": "a@example.com"}, "attempt": 5},
    })
    .to_string()
}

/// Waiting jobs (one carrying a script), a delayed job, a retry and two
/// dead letters on `q`.
async fn populate(redis: &TestRedis, q: &QueueKeys) {
    let mut c = redis.conn().await;
    let now: u64 = {
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
        s * 1000 + us / 1000
    };
    let _: () = c
        .lpush(
            q.waiting(),
            &[
                format!(r#"{{"id":"w1","task":"send_email","enqueued_at":{now}}}"#),
                serde_json::json!({"id": "evil", "task": "render", "data": {"html": EVIL}})
                    .to_string(),
                "not json at all \u{7}".to_string(),
            ],
        )
        .await
        .expect("push");
    let _: () = c
        .lpush(q.waiting(), b"\xff\xfe bytes".as_slice())
        .await
        .expect("push bytes");
    let _: () = c
        .zadd(
            q.scheduled(),
            r#"{"id":"later1","task":"reminder","run_at":1}"#,
            now + 600_000,
        )
        .await
        .expect("schedule");
    let _: () = c
        .zadd(
            q.retry(),
            r#"{"id":"r1","task":"send_email","attempt":2,"error":"connection reset by peer"}"#,
            now + 30_000,
        )
        .await
        .expect("retry");
    let _: () = c
        .lpush(
            q.dead(),
            &[
                dead_letter("d1", DEAD_ERROR),
                dead_letter("d2", "permanent: bad address"),
            ],
        )
        .await
        .expect("dead");
}

/// A worker's heartbeat as the worker runtime writes it.
async fn register_worker(redis: &TestRedis, q: &QueueKeys, instance: &str) {
    let mut c = redis.conn().await;
    workerpool_queue::ops::heartbeat(
        &mut c,
        q,
        instance,
        Duration::from_secs(60),
        &[
            (
                "id",
                instance.split('~').next().unwrap_or(instance).to_string(),
            ),
            ("pid", "4242".into()),
            ("concurrency", "8".into()),
            ("in_flight", "0".into()),
            ("queues", q.name().to_string()),
            ("dead_after_ms", "30000".into()),
            ("version", "0.1.0".into()),
        ],
    )
    .await
    .expect("heartbeat");
}

#[tokio::test]
async fn the_json_api_counts_every_list_and_shows_the_workers() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    register_worker(&redis, &q, "mailer-7~1a2b3c4d").await;
    let app = dashboard(&redis, &["emails", "{reports}"], writable()).await;

    let o = json(&get(&app, "/api/overview").await);
    let emails = &o["queues"][0];
    assert_eq!(emails["name"], "emails");
    assert_eq!(emails["waiting"], 4);
    assert_eq!(emails["scheduled"], 1);
    assert_eq!(emails["retries_scheduled"], 1);
    assert_eq!(emails["dead"], 2);
    assert_eq!(emails["workers_live"], 1);
    assert_eq!(o["queues"][1]["name"], "{reports}");
    assert_eq!(o["queues"][1]["waiting"], 0);

    let d = json(&get(&app, "/api/queues/emails").await);
    assert_eq!(d["workers"][0]["instance"], "mailer-7~1a2b3c4d");
    assert_eq!(d["workers"][0]["alive"], true);

    let dead = json(&get(&app, "/api/queues/emails/dead").await);
    assert_eq!(dead["total"], 2);
    // Newest first: d2 was pushed last.
    assert_eq!(dead["items"][0]["id"], "d2");
    assert_eq!(dead["items"][1]["error"], DEAD_ERROR);
    let retries = json(&get(&app, "/api/queues/emails/retries").await);
    assert_eq!(retries["items"][0]["error"], "connection reset by peer");
    let waiting = json(&get(&app, "/api/queues/emails/waiting?per_page=2").await);
    // Next to run first: the first pushed.
    assert_eq!(waiting["items"][0]["id"], "w1");
    assert_eq!(waiting["items"].as_array().map(Vec::len), Some(2));
    let last = json(&get(&app, "/api/queues/emails/waiting?per_page=2&page=2").await);
    assert_eq!(last["items"][1]["payload"], "\\xff\\xfe bytes");
    assert_eq!(last["items"][1]["malformed"], true);

    // A queue's name with braces in the URL, and queues not on the dashboard.
    assert_eq!(
        get(&app, "/queues/%7Breports%7D").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&app, "/queues/other").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/api/queues/other/dead").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_table_and_the_end_of_the_chart_show_the_same_read() {
    let redis = TestRedis::start();
    let conn = connect(&redis.url()).await;
    let dash = Dashboard::new(conn, vec![QueueKeys::new("emails")], writable());
    let app = dash.router();
    // The background sample, then jobs arrive and some are processed
    // before the page reads the queue.
    dash.sample().await.expect("a sample");
    let mut c = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: () = c.lpush("emails", vec!["{}"; 7]).await.expect("push");
    let _: () = c.set("emails:stats:processed", 40).await.expect("set");
    tokio::time::sleep(Duration::from_millis(20)).await;

    let o = json(&get(&app, "/api/overview").await);
    let table = &o["queues"][0];
    let last = o["history"][0]["points"]
        .as_array()
        .and_then(|p| p.last())
        .cloned()
        .expect("the chart has points");
    assert_eq!(table["waiting"], 7, "{o}");
    assert_eq!(
        last[0], o["server_time_ms"],
        "the chart ends at the page's read: {o}"
    );
    assert_eq!(
        last[1], table["waiting"],
        "the chart's last waiting is the table's: {o}"
    );
    assert_eq!(last[2], table["in_flight"], "{o}");
    assert_eq!(
        last[3], table["processed_per_second"],
        "the legend's rate is the table's: {o}"
    );
    assert!(
        table["processed_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{o}"
    );

    // A queue's page too.
    let _: () = c.lpush("emails", vec!["{}"; 2]).await.expect("push");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let d = json(&get(&app, "/api/queues/emails").await);
    let last = d["history"]["points"]
        .as_array()
        .and_then(|p| p.last())
        .cloned()
        .expect("the chart has points");
    assert_eq!(d["summary"]["waiting"], 9, "{d}");
    assert_eq!(last[1], d["summary"]["waiting"], "{d}");
    assert_eq!(last[3], d["summary"]["processed_per_second"], "{d}");
}

#[tokio::test]
async fn pages_escape_payloads_and_forbid_inline_scripts() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let app = dashboard(&redis, &["emails"], writable()).await;
    for uri in ["/", "/queues/emails", "/queues/emails/waiting"] {
        let page = get(&app, uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}");
        let csp = page.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("ascii");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(
            page.body.matches("<script").count(),
            1,
            "{uri}: only dashboard.js"
        );
    }
    let page = get(&app, "/queues/emails/waiting").await.body;
    assert!(
        page.contains("&lt;script&gt;document.documentElement"),
        "{page}"
    );
    assert!(page.contains("\\xff\\xfe bytes"), "{page}");
    let js = get(&app, "/assets/dashboard.js").await;
    assert_eq!(
        js.headers[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
}

const RESULT: &str = r#"{"html":"<script>alert(1)</script>"}"#;

/// Job `id` of `q` kept as done with [`RESULT`], in the hash's fields as
/// docs/queue-contract.md ("Outcomes") lists them: as the attempt starts
/// (`running`), then as the settlement ends it.
async fn keep_done(redis: &TestRedis, q: &QueueKeys, id: &str, at: u64) {
    let mut c = redis.conn().await;
    let _: () = c
        .hset_multiple(
            q.outcome(id),
            &[
                ("state", "running".to_string()),
                ("attempt", "2".to_string()),
                ("worker", "mailer-1~<b>".to_string()),
                ("updated_at", at.to_string()),
            ],
        )
        .await
        .expect("running");
    let _: () = c
        .hset_multiple(
            q.outcome(id),
            &[
                ("state", "done".to_string()),
                ("result", RESULT.to_string()),
                ("ended_at", (at + 1_000).to_string()),
            ],
        )
        .await
        .expect("done");
}

#[tokio::test]
async fn a_kept_outcome_is_found_by_id_in_the_json_and_on_its_page_escaped() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    keep_done(&redis, &q, "j/1 é", 1_700_000_000_000).await;
    let app = dashboard(&redis, &["emails"], writable()).await;

    let reply = get(&app, "/api/queues/emails/jobs/j%2F1%20%C3%A9").await;
    assert_eq!(
        reply.headers[header::CONTENT_TYPE],
        "application/json",
        "{}",
        reply.body
    );
    let o = json(&reply);
    assert_eq!(o["id"], "j/1 é", "{o}");
    assert_eq!(o["state"], "done", "{o}");
    assert_eq!(o["attempt"], 2, "{o}");
    assert_eq!(o["worker"], "mailer-1~<b>", "{o}");
    assert_eq!(o["result"]["html"], "<script>alert(1)</script>", "{o}");
    assert_eq!(o["updated_at_ms"], 1_700_000_000_000u64, "{o}");
    assert_eq!(o["ended_at_ms"], 1_700_000_001_000u64, "{o}");

    let page = get(&app, "/queues/emails/jobs/j%2F1%20%C3%A9").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    assert!(
        body.contains(r#"<span class="state done" id="job-state">done</span>"#),
        "{body}"
    );
    assert!(!body.contains("<script>alert"), "{body}");
    assert!(
        body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{body}"
    );
    assert_eq!(body.matches("<script").count(), 1, "only dashboard.js");
    assert!(body.contains("mailer-1~&lt;b&gt;"), "{body}");
    assert!(!body.contains("mailer-1~<b>"), "{body}");
    assert!(body.contains("j/1 é"), "{body}");
    // The times as UTC dates.
    assert!(body.contains("2023-11-14 22:13:20 UTC"), "updated: {body}");
    assert!(body.contains("2023-11-14 22:13:21 UTC"), "ended: {body}");
    let csp = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .expect("ascii");
    assert!(csp.contains("script-src 'self'"), "{csp}");
}

#[tokio::test]
async fn an_unknown_job_is_404_with_why_and_an_empty_or_overlong_id_is_400() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    keep_done(&redis, &q, "kept", 1_700_000_000_000).await;
    let app = dashboard(&redis, &["emails"], writable()).await;

    let why = |reply: &Reply| -> String {
        let v: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON error");
        v["error"].as_str().expect("an error").to_string()
    };
    let reply = get(&app, "/api/queues/emails/jobs/never").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    let error = why(&reply);
    assert!(
        error.starts_with(r#"no outcome kept for job "never" (never kept, or expired)"#),
        "{error}"
    );
    assert!(error.contains("--keep-outcomes"), "{error}");
    let page = get(&app, "/queues/emails/jobs/never").await;
    assert_eq!(page.status, StatusCode::NOT_FOUND, "{}", page.body);
    assert!(
        page.body
            .contains("no outcome kept for job &quot;never&quot; (never kept, or expired)"),
        "{}",
        page.body
    );

    // An outcome naming no state this reads is no outcome.
    let mut c = redis.conn().await;
    let _: () = c
        .hset(q.outcome("odd"), "state", "<weird>")
        .await
        .expect("hset");
    assert_eq!(
        get(&app, "/api/queues/emails/jobs/odd").await.status,
        StatusCode::NOT_FOUND
    );

    // 200 bytes is an id; 201 is not, nor is none.
    let longest = "x".repeat(200);
    let reply = get(&app, &format!("/api/queues/emails/jobs/{longest}")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    let over = "x".repeat(201);
    for uri in [
        format!("/api/queues/emails/jobs/{over}"),
        "/api/queues/emails/jobs/".to_string(),
    ] {
        let reply = get(&app, &uri).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{uri}: {}",
            reply.body
        );
        assert!(
            why(&reply).starts_with("a job id is 1 to 200 bytes"),
            "{uri}"
        );
    }
    for uri in [
        format!("/queues/emails/jobs/{over}"),
        "/queues/emails/jobs/".to_string(),
        "/queues/emails/jobs?id=".to_string(),
        format!("/queues/emails/jobs?id={over}"),
    ] {
        let page = get(&app, &uri).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains("a job id is 1 to 200 bytes"), "{uri}");
        assert!(!page.body.contains(&over), "{uri}: the id is not echoed");
    }

    // A queue this dashboard does not serve, as for its other routes.
    let reply = get(&app, "/api/queues/other/jobs/kept").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(why(&reply), r#"no queue "other" on this dashboard"#);
    let page = get(&app, "/queues/other/jobs/kept").await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(
        page.body.contains("no queue &quot;other&quot;"),
        "{}",
        page.body
    );
    assert_eq!(
        get(&app, "/queues/other/jobs?id=kept").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_queue_page_finds_a_job_by_id_without_javascript() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("{mail}");
    keep_done(&redis, &q, "order/42 x", 1_700_000_000_000).await;
    let app = dashboard(&redis, &["{mail}"], writable()).await;

    let page = get(&app, "/queues/%7Bmail%7D").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let form = page
        .body
        .split(r#"<form method="get" class="find-job" action="/queues/%7Bmail%7D/jobs">"#)
        .nth(1)
        .and_then(|rest| rest.split("</form>").next())
        .unwrap_or_else(|| panic!("a find-a-job form: {}", page.body));
    assert!(form.contains(r#"name="id""#), "{form}");
    assert!(form.contains(r#"type="submit""#), "{form}");

    // What the browser sends: the id typed (spaces around it trimmed).
    let reply = get(&app, "/queues/%7Bmail%7D/jobs?id=+order%2F42+x+").await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let location = reply.headers[header::LOCATION].to_str().expect("ascii");
    assert_eq!(location, "/queues/%7Bmail%7D/jobs/order%2F42%20x");
    let job = get(&app, location).await;
    assert_eq!(job.status, StatusCode::OK, "{}", job.body);
    assert!(job.body.contains(r#"id="job-state">done<"#), "{}", job.body);
    assert!(job.body.contains("order/42 x"), "{}", job.body);
    // The job's page links its JSON, which has the same outcome.
    assert!(
        job.body
            .contains(r#"href="/api/queues/%7Bmail%7D/jobs/order%2F42%20x""#),
        "{}",
        job.body
    );
    let o = json(&get(&app, "/api/queues/%7Bmail%7D/jobs/order%2F42%20x").await);
    assert_eq!(o["state"], "done", "{o}");
}

/// The text of each `<td class="{class}">` cell of `page`.
fn cells<'a>(page: &'a str, class: &str) -> Vec<&'a str> {
    let open = format!(r#"<td class="{class}">"#);
    page.split(open.as_str())
        .skip(1)
        .map(|rest| rest.split("</td>").next().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn fields_of_5000_characters_are_cut_in_the_cells_and_whole_in_the_json() {
    // Ids, tasks and worker names are cut at 200 characters, errors at 300
    // (as payloads).
    const CELL: usize = 200;
    const ERROR: usize = 300;
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    let mut c = redis.conn().await;
    let (id, task, error) = ("i".repeat(5_000), "k".repeat(5_000), "e".repeat(5_000));
    let letter = serde_json::json!({
        "reason": "exhausted", "error": error, "attempts": 5,
        "died_at": 1_700_000_000_000u64, "worker": "w~1",
        "job": {"id": id, "task": task},
    });
    let _: () = c.lpush(q.dead(), letter.to_string()).await.expect("dead");
    let job = serde_json::json!({"id": id, "task": task, "attempt": 1, "error": error});
    let _: () = c.zadd(q.retry(), job.to_string(), 1).await.expect("retry");
    let instance = format!("{}~1", "n".repeat(5_000));
    register_worker(&redis, &q, &instance).await;
    let _: () = c
        .lpush(
            q.processing(&instance),
            serde_json::json!({"id": id}).to_string(),
        )
        .await
        .expect("held");
    let app = dashboard(&redis, &["emails"], writable()).await;

    for uri in [
        "/queues/emails",
        "/queues/emails/dead",
        "/queues/emails/retries",
    ] {
        let page = get(&app, uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}");
        let shown: Vec<&str> = ["id", "error", "instance", "ids"]
            .into_iter()
            .flat_map(|class| cells(&page.body, class))
            .collect();
        assert!(!shown.is_empty(), "{uri}");
        for cell in shown {
            assert!(cell.chars().count() <= ERROR, "{uri}: {} chars", cell.len());
        }
        // The task and the error are nowhere whole; the id only in the
        // forms that act on it.
        let long = |c: char, max: usize| c.to_string().repeat(max + 1);
        assert!(!page.body.contains(&long('k', CELL)), "{uri}: the task");
        assert!(!page.body.contains(&long('n', CELL)), "{uri}: the worker");
        assert!(!page.body.contains(&long('e', ERROR)), "{uri}: the error");
        for piece in page.body.split(&id).skip(1) {
            assert!(piece.starts_with('"'), "{uri}: the id outside a form");
        }
    }
    let dead = get(&app, "/queues/emails/dead").await.body;
    assert!(
        dead.contains(r#"<input type="hidden" name="id" value=""#),
        "{dead}"
    );
    assert!(
        dead.contains(&format!(r#"name="id" value="{id}""#)),
        "retry needs the whole id"
    );
    let css = get(&app, "/assets/dashboard.css").await.body;
    assert!(css.contains("overflow-wrap: anywhere"), "{css}");

    // The JSON API has every value whole.
    let listed = json(&get(&app, "/api/queues/emails/dead").await);
    assert_eq!(listed["items"][0]["id"], serde_json::json!(id));
    assert_eq!(listed["items"][0]["task"], serde_json::json!(task));
    assert_eq!(listed["items"][0]["error"], serde_json::json!(error));
}

#[tokio::test]
async fn retrying_one_dead_letter_puts_that_job_back_on_the_queue() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let app = dashboard(&redis, &["emails"], writable()).await;
    let token = csrf(&get(&app, "/queues/emails/dead").await.body);

    let reply = post_form(
        &app,
        "/queues/emails/dead/retry",
        &format!("csrf={token}&id=d1"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let location = reply.headers[header::LOCATION].to_str().expect("ascii");
    assert_eq!(location, "/queues/emails/dead?done=retried&n=1&skipped=0");
    let mut c = redis.conn().await;
    let dead: Vec<String> = c.lrange(q.dead(), 0, -1).await.expect("dead");
    assert_eq!(dead.len(), 1);
    assert!(dead[0].contains("\"d2\""), "{dead:?}");
    let head: Vec<String> = c.lrange(q.waiting(), 0, 0).await.expect("waiting");
    let job: serde_json::Value = serde_json::from_str(&head[0]).expect("a job");
    assert_eq!(job["id"], "d1");
    assert_eq!(job.get("attempt"), None, "a fresh start");

    let notice = get(&app, location).await.body;
    assert!(
        notice.contains("Retried 1 dead job onto emails."),
        "{notice}"
    );

    // Deleting one, then the same through GET: not an action.
    let reply = post_form(
        &app,
        "/queues/emails/dead/delete",
        &format!("csrf={token}&id=d2"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 0);
    assert_eq!(
        get(&app, "/queues/emails/dead/purge").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn purge_empties_the_dead_list_and_a_form_without_its_csrf_value_is_refused() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let app = dashboard(&redis, &["emails"], writable()).await;
    let mut c = redis.conn().await;

    let forged = post_form(&app, "/queues/emails/dead/purge", "csrf=guess").await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let missing = post_form(&app, "/queues/emails/dead/purge", "").await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 2);

    let token = csrf(&get(&app, "/queues/emails").await.body);
    let reply = post_form(&app, "/queues/emails/dead/purge", &format!("csrf={token}")).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(
        reply.headers[header::LOCATION],
        "/queues/emails/dead?done=purged&n=2&skipped=0"
    );
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 0);
    assert_eq!(c.llen::<_, u64>(q.waiting()).await.expect("llen"), 4);
}

#[tokio::test]
async fn read_only_shows_no_actions_and_refuses_them() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let app = dashboard(
        &redis,
        &["emails"],
        Options {
            read_only: true,
            ..writable()
        },
    )
    .await;
    let page = get(&app, "/queues/emails/dead").await.body;
    assert!(!page.contains("<form"), "{page}");
    assert!(page.contains(DEAD_ERROR));
    for action in ["retry", "delete", "purge"] {
        let reply = post_form(
            &app,
            &format!("/queues/emails/dead/{action}"),
            "id=d1&csrf=x",
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{action}");
    }
    let mut c = redis.conn().await;
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 2);
    assert_eq!(json(&get(&app, "/api/overview").await)["read_only"], true);
}

#[tokio::test]
async fn with_a_token_every_request_needs_it() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let app = dashboard(
        &redis,
        &["emails"],
        Options {
            token: Some("s3cret-token".into()),
            ..writable()
        },
    )
    .await;
    for uri in [
        "/",
        "/api/overview",
        "/queues/emails",
        "/assets/dashboard.js",
    ] {
        let reply = get(&app, uri).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(!reply.body.contains("emails"), "{uri}: {}", reply.body);
    }
    let wrong = send(
        &app,
        Request::get("/api/overview")
            .header(header::AUTHORIZATION, "Bearer s3cret-tokeN")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        get(&app, "/?token=nope").await.status,
        StatusCode::UNAUTHORIZED
    );
    let right = send(
        &app,
        Request::get("/api/overview")
            .header(header::AUTHORIZATION, "Bearer s3cret-token")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(json(&right)["queues"][0]["dead"], 2);

    // A browser logs in once with ?token= and keeps a cookie.
    let login = get(&app, "/queues/emails/dead?token=s3cret-token&page=1").await;
    assert_eq!(login.status, StatusCode::SEE_OTHER);
    assert_eq!(
        login.headers[header::LOCATION],
        "/queues/emails/dead?page=1"
    );
    let cookie = login.headers[header::SET_COOKIE].to_str().expect("ascii");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("s3cret-token"),
        "the cookie is not the token"
    );
    let session = cookie.split(';').next().unwrap_or_default().to_string();
    let page = send(
        &app,
        Request::get("/queues/emails/dead")
            .header(header::COOKIE, &session)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(DEAD_ERROR));

    // An action with the bearer token needs no form value.
    let reply = send(
        &app,
        Request::post("/queues/emails/dead/purge")
            .header(header::AUTHORIZATION, "Bearer s3cret-token")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    let mut c = redis.conn().await;
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 0);
}

#[tokio::test]
async fn the_token_login_redirects_only_to_a_path_of_this_dashboard() {
    let redis = TestRedis::start();
    populate(&redis, &QueueKeys::new("emails")).await;
    let app = dashboard(
        &redis,
        &["emails"],
        Options {
            token: Some("s3cret-token".into()),
            ..writable()
        },
    )
    .await;
    let login = |target: &'static str| {
        let app = app.clone();
        async move {
            let uri = format!("{target}?token=s3cret-token");
            let reply = get(&app, &uri).await;
            assert_eq!(reply.status, StatusCode::SEE_OTHER, "{uri}");
            reply.headers[header::LOCATION]
                .to_str()
                .expect("ascii")
                .to_string()
        }
    };
    // What a browser would take for another site goes to the overview.
    for hostile in [
        "//evil.example/x",
        "//evil.example",
        "///evil.example",
        "/\\evil.example",
        "/\\/evil.example",
        "/x\\..\\..\\/evil.example",
        "/%2F%2Fevil.example",
        "/%2fevil.example",
        "/%5Cevil.example",
        "/%5C%5Cevil.example/x",
        "https://evil.example",
        "https://evil.example/x",
        "http://localhost//evil.example",
    ] {
        assert_eq!(login(hostile).await, "/", "{hostile}");
    }
    // A path of the dashboard keeps its place and the other parameters.
    assert_eq!(login("/queues/emails").await, "/queues/emails");
    assert_eq!(login("/").await, "/");
    assert_eq!(
        login("/queues/%7Bmail%7D%3Ahigh/dead").await,
        "/queues/%7Bmail%7D%3Ahigh/dead"
    );
}

#[tokio::test]
async fn a_redis_that_may_evict_jobs_is_a_banner_on_every_page_and_in_the_json() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("mail");
    populate(&redis, &q).await;
    let app = dashboard(&redis, &["mail"], writable()).await;
    let calm = get(&app, "/").await;
    assert!(!calm.body.contains("redis-warning"), "{}", calm.body);
    assert_eq!(
        json(&get(&app, "/api/overview").await)["redis_warning"],
        serde_json::Value::Null
    );
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut c)
        .await
        .expect("config set");
    let overview = json(&get(&app, "/api/overview").await);
    let warning = overview["redis_warning"].as_str().expect("a warning");
    assert!(
        warning.contains("allkeys-lru") && warning.contains("noeviction"),
        "{warning}"
    );
    // The overview read the policy: every page shows it from then on.
    for page in ["/", "/queues/mail", "/queues/mail/dead"] {
        let reply = get(&app, page).await;
        assert_eq!(reply.status, StatusCode::OK, "{page}");
        assert!(
            reply
                .body
                .contains(r#"<p class="notice warning" id="redis-warning" role="alert">"#)
                && reply.body.contains("allkeys-lru"),
            "{page}: {}",
            reply.body
        );
    }
}

#[tokio::test]
async fn the_redis_password_appears_on_no_page() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    let password = "hunter2-very-secret";
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(password)
        .query_async(&mut c)
        .await
        .expect("set a password");
    let url = format!("redis://:{password}@127.0.0.1:{}/0", redis.port());
    let conn = connect(&url).await;
    let app = Dashboard::new(
        conn,
        vec![q.clone()],
        Options {
            redis_label: redact(&url),
            ..Options::default()
        },
    )
    .router();
    for uri in [
        "/",
        "/api/overview",
        "/queues/emails",
        "/api/queues/emails",
        "/queues/emails/waiting",
        "/queues/emails/scheduled",
        "/queues/emails/retries",
        "/queues/emails/dead",
        "/api/queues/emails/dead",
        "/nowhere",
    ] {
        let reply = get(&app, uri).await;
        assert!(!reply.body.contains(password), "{uri} shows the password");
        assert!(!reply.body.contains("hunter2"), "{uri} shows the password");
    }
    let page = get(&app, "/").await.body;
    assert!(
        page.contains(&format!("redis://:***@127.0.0.1:{}/0", redis.port())),
        "{page}"
    );
}

#[tokio::test]
async fn a_million_waiting_jobs_cost_one_page_per_page() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("big");
    let mut c = redis.conn().await;
    // A million jobs, ten thousand per script: a few seconds, and no call
    // near the connection's reply timeout on a busy machine.
    for from in (1..=1_000_000u64).step_by(10_000) {
        let _: () = redis::cmd("EVAL")
            .arg(
                "for i = tonumber(ARGV[1]), tonumber(ARGV[1]) + 9999, 1000 do local batch = {} \
                 for j = i, i + 999 do batch[#batch + 1] = '{\"id\":\"job-' .. j .. '\",\"task\":\"t\",\"data\":{\"n\":' .. j .. '}}' end \
                 redis.call('LPUSH', KEYS[1], unpack(batch)) end",
            )
            .arg(1)
            .arg(q.waiting())
            .arg(from)
            .query_async(&mut c)
            .await
            .expect("push ten thousand jobs");
    }
    assert_eq!(
        c.llen::<_, u64>(q.waiting()).await.expect("llen"),
        1_000_000
    );
    let app = dashboard(&redis, &["big"], writable()).await;
    let sent_bytes = |info: String| {
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("total_net_output_bytes in INFO stats")
    };
    let info = || {
        let client = redis.client();
        async move {
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            redis::cmd("INFO")
                .arg("stats")
                .query_async::<String>(&mut c)
                .await
                .expect("INFO")
        }
    };

    for (uri, first) in [
        ("/queues/big/waiting", ">job-1<"),
        ("/queues/big/waiting?page=20000", ">job-999951<"),
        ("/queues/big", ">job-1<"),
        ("/", "1,000,000"),
    ] {
        let before = sent_bytes(info().await);
        let started = Instant::now();
        let reply = get(&app, uri).await;
        let took = started.elapsed();
        let sent = sent_bytes(info().await) - before;
        assert_eq!(reply.status, StatusCode::OK, "{uri}");
        assert!(reply.body.contains(first), "{uri}: {first} missing");
        assert!(took < Duration::from_secs(2), "{uri} took {took:?}");
        // A page of 50 jobs is a few kilobytes; the whole list would be 50 MB.
        assert!(sent < 64 * 1024, "{uri}: Redis sent {sent} bytes");
    }
    let page = get(&app, "/queues/big/waiting").await.body;
    assert_eq!(page.matches(r#"<td class="id">job-"#).count(), 50);
    assert!(page.contains("page 1 of 20,000"), "pager");
    let api = json(&get(&app, "/api/queues/big/waiting?page=3").await);
    assert_eq!(api["items"][0]["id"], "job-101");
    assert_eq!(api["total"], 1_000_000);
}

// ---- In a real browser ----

/// The directory holding `workerpool`, `workerpool-worker` and
/// `workerpool-operator`: the one this test was built into
/// (`<target>/<profile>/deps/..`), building them when missing.
/// The browser: `$CHROMIUM`, else `chromium` on PATH. Under `CI=true` a
/// missing browser fails the test; elsewhere it is skipped with a note.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("chromium"));
    let found = Command::new(&path)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(path);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{} not found: the dashboard's browser test needs it under CI (apt-get install -y chromium)",
        path.display()
    );
    eprintln!(
        "note: {} not found, the dashboard's browser test is skipped (apt-get install -y chromium)",
        path.display()
    );
    None
}

/// Runs headless Chromium on `url` with a fresh profile and `extra`
/// (`--dump-dom`, `--screenshot=…`); returns its stdout.
fn browse(chromium: &Path, url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {:?}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running `workerpool dashboard`, stopped when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(redis_url: &str, queues: &[&str]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(bin_dir().join("workerpool"));
        cmd.arg("dashboard")
            .args(["--redis-url", redis_url])
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        for q in queues {
            cmd.args(["--queue", q]);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("WORKERPOOL_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start workerpool dashboard");
        let served = Self {
            child,
            base: format!("http://localhost:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the dashboard did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    }

    /// A page fetched without a browser (over a plain socket).
    fn fetch(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let addr = self.base.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr.replace("localhost", "127.0.0.1"))
            .expect("connect to the dashboard");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("write request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read reply");
        out
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The DOM element of `dom` that opens with `start` (up to its `>`).
fn open_tag<'a>(dom: &'a str, start: &str) -> &'a str {
    let at = dom
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in the DOM"));
    let end = dom[at..].find('>').map_or(dom.len(), |e| at + e + 1);
    &dom[at..end]
}

/// The text of the element `<tag …data-field="field"…>` inside the element
/// that opens with `scope`.
fn field(dom: &str, scope: &str, field: &str) -> String {
    let at = dom
        .find(scope)
        .unwrap_or_else(|| panic!("{scope} not in the DOM"));
    let marker = format!(r#"data-field="{field}">"#);
    let start = dom[at..].find(&marker).expect("field in scope") + at + marker.len();
    dom[start..]
        .split('<')
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_shows_the_queues_a_dead_letter_a_live_worker_and_never_runs_a_payload() {
    let Some(chromium) = chromium() else { return };
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    populate(&redis, &q).await;
    register_worker(&redis, &q, "mailer-7~1a2b3c4d").await;
    let served = Served::start(&redis.url(), &["emails", "{reports}"]);
    // Two samples (5 s apart) so that the chart has a line to draw.
    eventually(Duration::from_secs(20), "two samples for the chart", || {
        let body = served.fetch("/api/overview");
        async move {
            let json = body.split("\r\n\r\n").nth(1)?.to_string();
            let v: serde_json::Value = serde_json::from_str(&json).ok()?;
            (v["history"][0]["points"].as_array()?.len() >= 2).then_some(())
        }
    })
    .await;
    // The worker beats again so that it is alive when the browser looks.
    register_worker(&redis, &q, "mailer-7~1a2b3c4d").await;

    let overview = browse(&chromium, &format!("{}/", served.base), &["--dump-dom"]);
    assert!(
        overview.contains(r#"<tr data-queue="emails">"#),
        "{overview}"
    );
    assert!(
        overview.contains(r#"<tr data-queue="{reports}">"#),
        "{overview}"
    );
    assert_eq!(field(&overview, r#"data-queue="emails""#, "waiting"), "4");
    assert_eq!(field(&overview, r#"data-queue="emails""#, "dead"), "2");
    assert_eq!(field(&overview, r#"data-queue="emails""#, "workers"), "1");
    // The script fetched /api/overview and drew the chart.
    let live = open_tag(&overview, r#"<span id="live""#);
    assert!(live.contains(r#"data-live="1""#), "{live}");
    assert!(overview.contains("live · updated"), "{overview}");
    assert!(overview.contains("<polyline"), "no chart line: {overview}");

    let page = browse(
        &chromium,
        &format!("{}/queues/emails", served.base),
        &["--dump-dom"],
    );
    assert!(
        !page.contains(r#"data-pwned="1""#),
        "the payload ran: {page}"
    );
    assert!(
        !open_tag(&page, "<html").contains("data-pwned"),
        "the payload ran"
    );
    assert!(
        page.contains("&lt;script&gt;document.documentElement.setAttribute"),
        "the payload is not shown as text: {page}"
    );
    assert!(page.contains(DEAD_ERROR), "{page}");
    let worker = open_tag(&page, r#"<tr class="worker"#);
    assert!(
        worker.contains("alive") && worker.contains("mailer-7~1a2b3c4d"),
        "{worker}"
    );
    assert!(
        page.contains(r#"<span class="status alive">alive</span>"#),
        "{page}"
    );
    assert_eq!(
        field(&page, r#"<dl class="counts""#, "retries_scheduled"),
        "1"
    );
    assert!(open_tag(&page, r#"<span id="live""#).contains(r#"data-live="1""#));

    let waiting = browse(
        &chromium,
        &format!("{}/queues/emails/waiting", served.base),
        &["--dump-dom"],
    );
    assert!(!waiting.contains(r#"data-pwned="1""#), "the payload ran");
    assert!(waiting.contains("\\xff\\xfe bytes"), "{waiting}");
}

#[tokio::test]
async fn local_mode_serves_the_dashboard_with_its_pool_on_top() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("pool.yaml");
    std::fs::write(
        &manifest,
        format!(
            r#"apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {{name: mailer}}
spec:
  queue: {{redis: {{url: "{}", key: mail}}}}
  template:
    spec:
      containers:
      - name: worker
        image: ghcr.io/workerpool-dev/workerpool-worker:0.1.0
        args: ["--handler", "noop"]
  replicas: 1
  shutdown: {{gracePeriodSeconds: 5}}
"#,
            redis.url()
        ),
    )
    .expect("write manifest");
    let port = free_port();
    let child = Command::new(bin_dir().join("workerpool-operator"))
        .arg("local")
        .arg("-f")
        .arg(&manifest)
        .args(["--plain", "--dashboard", &format!("127.0.0.1:{port}")])
        .arg("--worker-bin")
        .arg(bin_dir().join("workerpool-worker"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start local mode");
    let mut served = Served {
        child,
        base: format!("http://localhost:{port}"),
    };
    let pool = eventually(Duration::from_secs(30), "the pool's worker ready", || {
        let body = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| served.fetch("/api/overview"));
        async move {
            let json = body?.split("\r\n\r\n").nth(1)?.to_string();
            let v: serde_json::Value = serde_json::from_str(&json).ok()?;
            let pool = v["pools"][0].clone();
            (pool["ready"] == 1 && v["queues"][0]["workers_live"] == 1).then_some(pool)
        }
    })
    .await;
    assert_eq!(pool["name"], "mailer");
    assert_eq!(pool["queues"][0], "mail");
    assert_eq!(pool["fixed_replicas"], 1);
    assert_eq!(pool["desired"], 1);
    assert!(
        pool["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{pool}"
    );
    let page = served.fetch("/");
    assert!(page.contains(r#"<tr data-pool="mailer">"#), "{page}");
    // Stop it as Ctrl-C would, so that its worker stops too.
    let pid = rustix::process::Pid::from_raw(served.child.id() as i32).expect("a pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while served.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `docs/dashboard.png` from a dashboard with real workers, jobs
/// flowing for a couple of minutes, retries and dead letters.
/// `cargo test -p workerpool-tests --test dashboard -- --ignored screenshot`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/dashboard.png; run by hand"]
async fn screenshot_for_the_readme() {
    let Some(chromium) = chromium() else { return };
    let redis = TestRedis::start();
    let emails = QueueKeys::new("emails");
    let reports = QueueKeys::new("reports");
    populate(&redis, &emails).await;
    let mut c = redis.conn().await;
    let mut workers = Vec::new();
    for (i, q) in [&emails, &emails, &reports].iter().enumerate() {
        workers.push(
            Command::new(bin_dir().join("workerpool-worker"))
                .args(["--redis-url", &redis.url(), "--queue", q.name()])
                .args(["--handler", "sleep", "--concurrency", "8"])
                .args(["--listen", &format!("127.0.0.1:{}", free_port())])
                .args(["--worker-id", &format!("{}-{i}", q.name())])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a worker"),
        );
    }
    let served = Served::start(&redis.url(), &["emails", "reports"]);
    let minutes: u64 = std::env::var("SCREENSHOT_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(2);
    let end = Instant::now() + Duration::from_secs(60 * minutes);
    let mut tick = 0u64;
    while Instant::now() < end {
        // Waves: emails in bursts, reports steady.
        let burst = if (tick / 12).is_multiple_of(2) {
            160
        } else {
            10
        };
        let jobs: Vec<String> = (0..burst)
            .map(|n| format!(r#"{{"id":"e{tick}-{n}","task":"send_email","data":{{"ms":80}}}}"#))
            .collect();
        let _: () = c.lpush(emails.waiting(), &jobs).await.expect("push");
        let jobs: Vec<String> = (0..12)
            .map(|n| {
                format!(r#"{{"id":"r{tick}-{n}","task":"render_report","data":{{"ms":400}}}}"#)
            })
            .collect();
        let _: () = c.lpush(reports.waiting(), &jobs).await.expect("push");
        tick += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png");
    browse(
        &chromium,
        &format!("{}/", served.base),
        &[
            "--window-size=1280,900",
            "--hide-scrollbars",
            &format!("--screenshot={}", out.display()),
        ],
    );
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn through_redis_sentinel_the_dashboard_reads_the_new_primary_after_a_failover() {
    let setup = workerpool_tests::TestRedisSentinel::start(1);
    let mut c = setup.primary().await;
    let _: () = c.lpush("emails", &["{}", "{}"]).await.expect("lpush");
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut c)
        .await
        .expect("wait");
    let app = Dashboard::new(
        connect(&setup.url()).await,
        vec![QueueKeys::new("emails")],
        writable(),
    )
    .router();
    let o = json(&get(&app, "/api/overview").await);
    assert_eq!(o["queues"][0]["waiting"], 2, "{o}");

    let new = tokio::task::spawn_blocking(move || {
        let new = setup.fail_over();
        (setup, new)
    });
    let (setup, new) = new.await.expect("failover");
    let mut c = setup.primary().await;
    let _: () = c
        .lpush("emails", "{}")
        .await
        .expect("lpush on the new primary");
    assert_eq!(setup.primary_port(), new);
    eventually(
        Duration::from_secs(30),
        "the count of the new primary",
        || {
            let app = app.clone();
            async move {
                let reply = get(&app, "/api/overview").await;
                let o: serde_json::Value = serde_json::from_str(&reply.body).ok()?;
                (o["queues"][0]["waiting"] == 3).then_some(())
            }
        },
    )
    .await;
}
#[tokio::test]
async fn a_dead_letter_of_megabytes_shows_its_start_and_size_and_is_retried_whole() {
    let redis = TestRedis::start();
    let q = QueueKeys::new("emails");
    let mut c = redis.conn().await;
    // A too_large dead letter as the taking script writes it.
    let len = 5 * 1024 * 1024;
    let head = r#"{"task":"big","data":""#;
    let tail = r#"","id":"huge","enqueued_at":1767225600000}"#;
    let job = format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()));
    let entry = format!(
        r#"{{"reason":"too_large","error":"payload of {len} bytes is over the limit","attempts":0,"died_at":1700000000000,"worker":"w~1","size":{len},"encoding":"raw","job":{job}}}"#
    );
    let _: () = c.lpush(q.dead(), &entry).await.expect("dead");
    let app = dashboard(&redis, &["emails"], writable()).await;

    let listed = get(&app, "/api/queues/emails/dead").await;
    assert!(listed.body.len() < 64 * 1024, "{} bytes", listed.body.len());
    let listed = json(&listed);
    let item = &listed["items"][0];
    assert_eq!(item["id"], "huge");
    assert_eq!(item["reason"], "too_large");
    assert_eq!(item["bytes"], serde_json::json!(entry.len()));
    assert!(
        item["payload"]
            .as_str()
            .is_some_and(|p| p.starts_with(r#"{"task":"big","data":"xxx"#) && p.len() < 1_000),
        "{item}"
    );
    let page = get(&app, "/queues/emails/dead").await.body;
    assert!(
        page.contains(&format!("{} bytes", entry.len())),
        "the size is shown"
    );

    let form = get(&app, "/queues/emails/dead").await.body;
    let token = csrf(&form);
    let done = post_form(
        &app,
        "/queues/emails/dead/retry",
        &format!("id=huge&csrf={token}"),
    )
    .await;
    assert!(
        done.status.is_redirection() || done.status.is_success(),
        "{}",
        done.status
    );
    assert_eq!(c.llen::<_, u64>(q.dead()).await.expect("llen"), 0);
    let back: String = c.lindex(q.waiting(), 0).await.expect("lindex");
    assert!(back == job, "the job back on the queue, byte for byte");
}

#[tokio::test]
async fn workerpool_dashboard_stops_cleanly_on_each_signal_the_worker_stops_on() {
    let redis = TestRedis::start();
    for signal in [
        rustix::process::Signal::TERM,
        rustix::process::Signal::INT,
        rustix::process::Signal::HUP,
        rustix::process::Signal::QUIT,
    ] {
        let mut served = Served::start(&redis.url(), &["emails"]);
        let pid = rustix::process::Pid::from_raw(served.child.id() as i32).expect("a pid");
        rustix::process::kill_process(pid, signal).expect("signal the dashboard");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = served.child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "{signal:?} did not stop it");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            status.success(),
            "{signal:?} stops it with exit 0 (not killed by the signal): {status:?}"
        );
    }
}
