//! The pages, as pure functions from data to HTML. Every value that comes
//! from outside (queue names, job payloads, errors, worker names, pool
//! reasons) goes through [`escape`]; nothing else writes one into a page.
//! The pages carry no inline script: the Content-Security-Policy forbids
//! it, and `dashboard.js` (served by the crate) does the live parts.

use std::fmt::Write;

use workerpool_queue::admin::WorkerInfo;
use workerpool_queue::text::{self, CELL_CHARS};

use crate::model::{
    DeadRow, JobRow, JobView, ListKind, ListPage, MAX_JOB_ID_BYTES, Overview,
    PAYLOAD_PREVIEW_CHARS, PoolRow, QueueDetail, Rows, job_id_problem, json_preview,
};

/// What every page needs besides its data.
#[derive(Debug, Clone)]
pub struct Ctx<'a> {
    /// The Redis URL, password hidden.
    pub redis: &'a str,
    /// Whether the actions are off.
    pub read_only: bool,
    /// The value the action forms must send back (see `server`).
    pub csrf: &'a str,
    /// Why Redis may delete jobs, shown on top of every page.
    pub warning: Option<String>,
}

/// `s` safe to place in HTML text and in quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text from a job or a worker for a table cell, escaped for HTML: control
/// and bidi characters shown escaped, cut at `max` characters with a note
/// of how many were left out, so that one long value cannot push the
/// columns and buttons off the page. The JSON API has the whole value.
pub fn cell(s: &str, max: usize) -> String {
    escape(&text::safe_line(s, max))
}

/// `s` as one path segment of a URL: queue names hold `{`, `}` and `:`.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The page of `queue`.
pub fn queue_href(queue: &str) -> String {
    format!("/queues/{}", path_segment(queue))
}

/// The page of one list of `queue`.
pub fn list_href(queue: &str, kind: ListKind, page: u64) -> String {
    let base = format!("{}/{}", queue_href(queue), kind.as_str());
    if page > 1 {
        format!("{base}?page={page}")
    } else {
        base
    }
}

/// Where the find-a-job form of `queue` sends its `id` (a redirect to
/// [`job_href`]).
pub fn jobs_href(queue: &str) -> String {
    format!("{}/jobs", queue_href(queue))
}

/// The page of job `id` of `queue`, its kept outcome.
pub fn job_href(queue: &str, id: &str) -> String {
    format!("{}/{}", jobs_href(queue), path_segment(id))
}

/// The JSON of job `id` of `queue`.
pub fn job_api_href(queue: &str, id: &str) -> String {
    format!(
        "/api/queues/{}/jobs/{}",
        path_segment(queue),
        path_segment(id)
    )
}

/// The whole document around `body`.
pub fn layout(ctx: &Ctx<'_>, title: &str, crumbs: &[(String, String)], body: &str) -> String {
    let mut nav = String::from(r#"<a class="brand" href="/">workerpool</a>"#);
    for (href, label) in crumbs {
        let _ = write!(
            nav,
            r#" <span class="sep">›</span> <a href="{}">{}</a>"#,
            escape(href),
            escape(label)
        );
    }
    let mode = if ctx.read_only {
        r#"<span class="badge" id="read-only">read-only</span>"#
    } else {
        ""
    };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · workerpool</title>
<link rel="stylesheet" href="/assets/dashboard.css">
<script src="/assets/dashboard.js" defer></script>
</head>
<body>
<header><nav>{nav}</nav><span class="redis" title="Redis">{redis}</span>{mode}<span id="live" class="live">not live</span></header>
<main>
{warning}{body}
</main>
</body>
</html>
"#,
        title = escape(title),
        redis = escape(ctx.redis),
        warning = ctx.warning.as_deref().map_or(String::new(), |w| format!(
            r#"<p class="notice warning" id="redis-warning" role="alert">{}</p>"#,
            escape(w)
        )),
    )
}

/// The overview: the pools (from the operator), every queue, the charts.
pub fn overview(ctx: &Ctx<'_>, o: &Overview) -> String {
    let mut b = String::new();
    if !o.pools.is_empty() {
        b.push_str(&pools(&o.pools));
    }
    b.push_str(
        r#"<section><h2>Queues</h2><table class="queues"><thead><tr><th>queue</th><th class="num">waiting</th><th class="num">in flight</th><th class="num">retries due</th><th class="num">retries later</th><th class="num">scheduled</th><th class="num">dead</th><th class="num">processed/s</th><th class="num">failed/s</th><th class="num">oldest job</th><th class="num">workers</th></tr></thead><tbody>"#,
    );
    for q in &o.queues {
        let _ = write!(
            b,
            r#"<tr data-queue="{name}"><td><a href="{href}">{name}</a>{limit}</td>{cells}</tr>"#,
            name = escape(&q.name),
            href = escape(&queue_href(&q.name)),
            limit = q.counts.rate_limit.as_deref().map_or(String::new(), |l| format!(
                r#" <span class="rate-limit" title="at most this many jobs start">rate limit {}</span>"#,
                escape(l)
            )),
            cells = [
                ("waiting", num(q.counts.waiting)),
                ("in_flight", num(q.counts.in_flight)),
                ("retries_due", num(q.counts.retries_due)),
                ("retries_scheduled", num(q.counts.retries_scheduled)),
                ("scheduled", num(q.counts.scheduled)),
                ("dead", num(q.counts.dead)),
                ("processed_per_second", rate(q.processed_per_second)),
                ("failed_per_second", rate(q.failed_per_second)),
                ("oldest_job_age_seconds", seconds(q.oldest_job_age_seconds)),
                ("workers", workers_count(q.counts.workers_live, q.counts.workers_lost)),
            ]
            .iter()
            .map(|(f, v)| format!(r#"<td class="num" data-field="{f}">{}</td>"#, escape(v)))
            .collect::<String>(),
        );
    }
    if o.queues.is_empty() {
        b.push_str(r#"<tr><td colspan="11" class="empty">no queues</td></tr>"#);
    }
    b.push_str("</tbody></table></section>");
    b.push_str(
        r#"<section class="charts"><figure><figcaption>Waiting jobs, last hour</figcaption><div class="chart" data-chart="waiting"><p class="empty">collecting samples…</p></div></figure><figure><figcaption>Processed per second, last hour</figcaption><div class="chart" data-chart="processed"><p class="empty">collecting samples…</p></div></figure></section>"#,
    );
    layout(ctx, "Overview", &[], &b)
}

fn pools(pools: &[PoolRow]) -> String {
    let mut b = String::from(
        r#"<section><h2>Pools</h2><table class="pools"><thead><tr><th>pool</th><th>queues</th><th class="num">replicas</th><th class="num">desired</th><th class="num">ready</th><th>last decision</th></tr></thead><tbody>"#,
    );
    for p in pools {
        let name = if p.namespace.is_empty() {
            p.name.clone()
        } else {
            format!("{}/{}", p.namespace, p.name)
        };
        let queues = p
            .queues
            .iter()
            .map(|q| format!(r#"<a href="{}">{}</a>"#, escape(&queue_href(q)), escape(q)))
            .collect::<Vec<_>>()
            .join(", ");
        let replicas = match (p.fixed_replicas, p.min_replicas, p.max_replicas) {
            (Some(n), _, _) => format!("{n} (fixed)"),
            (None, min, Some(max)) => format!("{}–{max}", min.unwrap_or(0)),
            _ => "–".into(),
        };
        let opt = |v: Option<i32>| v.map_or("–".into(), |v| v.to_string());
        let _ = write!(
            b,
            r#"<tr data-pool="{name}"><td>{name}</td><td>{queues}</td><td class="num">{replicas}</td><td class="num">{desired}</td><td class="num">{ready}</td><td>{reason}</td></tr>"#,
            name = escape(&name),
            replicas = escape(&replicas),
            desired = escape(&opt(p.desired)),
            ready = escape(&opt(p.ready)),
            reason = escape(p.reason.as_deref().unwrap_or("–")),
        );
    }
    b.push_str("</tbody></table></section>");
    b
}

/// A queue's page: its counts, chart, workers and the head of each list.
pub fn queue(ctx: &Ctx<'_>, d: &QueueDetail, notice: Option<&str>) -> String {
    let s = &d.summary;
    let name = escape(&s.name);
    let mut b = format!("<h1>{name}</h1>");
    if let Some(n) = notice {
        let _ = write!(b, r#"<p class="notice">{}</p>"#, escape(n));
    }
    let _ = write!(b, r#"<dl class="counts" data-queue="{name}">"#);
    for (field, label, value) in [
        ("waiting", "waiting", num(s.counts.waiting)),
        ("in_flight", "in flight", num(s.counts.in_flight)),
        (
            "held_by_lost_workers",
            "held by lost workers",
            num(s.counts.held_by_lost_workers),
        ),
        ("retries_due", "retries due", num(s.counts.retries_due)),
        (
            "retries_scheduled",
            "retries later",
            num(s.counts.retries_scheduled),
        ),
        ("scheduled", "scheduled", num(s.counts.scheduled)),
        ("dead", "dead", num(s.counts.dead)),
        (
            "processed_per_second",
            "processed/s",
            rate(s.processed_per_second),
        ),
        ("failed_per_second", "failed/s", rate(s.failed_per_second)),
        (
            "oldest_job_age_seconds",
            "oldest job",
            seconds(s.oldest_job_age_seconds),
        ),
        (
            "processed_total",
            "processed total",
            num(s.counts.processed_total),
        ),
        ("failed_total", "failed total", num(s.counts.failed_total)),
    ] {
        let _ = write!(
            b,
            r#"<div><dt>{label}</dt><dd data-field="{field}">{}</dd></div>"#,
            escape(&value)
        );
    }
    b.push_str("</dl>");
    b.push_str(&find_job(&s.name, ""));
    let _ = write!(
        b,
        r#"<section class="charts"><figure><figcaption>Waiting and in flight, last hour</figcaption><div class="chart" data-chart="waiting" data-chart-queue="{name}"><p class="empty">collecting samples…</p></div></figure></section>"#
    );
    b.push_str(&workers(&d.workers));
    for list in &d.lists {
        let _ = write!(
            b,
            r#"<section id="{kind}"><h2><a href="{href}">{title}</a> <span class="count">{total}</span></h2>"#,
            kind = list.kind.as_str(),
            href = escape(&list_href(&s.name, list.kind, 1)),
            title = list.kind.title(),
            total = num(list.total),
        );
        if list.kind == ListKind::Dead {
            b.push_str(&dead_actions(ctx, &s.name, list.total));
        }
        b.push_str(&rows(ctx, list, d.server_time_ms));
        if list.total > list.items.len() as u64 {
            let _ = write!(
                b,
                r#"<p class="more"><a href="{}">all {} →</a></p>"#,
                escape(&list_href(&s.name, list.kind, 1)),
                num(list.total)
            );
        }
        b.push_str("</section>");
    }
    layout(ctx, &s.name, &[(queue_href(&s.name), s.name.clone())], &b)
}

fn workers(workers: &[WorkerInfo]) -> String {
    let mut b = String::from(
        r#"<section id="workers"><h2>Workers</h2><table class="workers"><thead><tr><th>instance</th><th>status</th><th class="num">last beat</th><th class="num">jobs held</th><th class="num">concurrency</th><th class="num">pid</th><th>version</th><th>jobs</th></tr></thead><tbody>"#,
    );
    for w in workers {
        let status = if w.alive { "alive" } else { "lost" };
        let mut jobs = w
            .jobs
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if w.jobs.len() > 5 {
            jobs.push_str(", …");
        }
        let opt = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
        let _ = write!(
            b,
            r#"<tr class="worker {status}" data-instance="{instance}"><td class="instance">{instance}</td><td><span class="status {status}">{status}</span></td><td class="num">{beat} ago</td><td class="num">{held}</td><td class="num">{concurrency}</td><td class="num">{pid}</td><td>{version}</td><td class="ids">{jobs}</td></tr>"#,
            instance = cell(&w.instance, CELL_CHARS),
            beat = escape(&age(w.last_beat_age_ms)),
            held = w.jobs.len(),
            concurrency = escape(&opt(w.concurrency)),
            pid = escape(&opt(w.pid)),
            version = cell(w.version.as_deref().unwrap_or("?"), CELL_CHARS),
            jobs = cell(&jobs, CELL_CHARS),
        );
    }
    if workers.is_empty() {
        b.push_str(r#"<tr><td colspan="8" class="empty">no workers registered</td></tr>"#);
    }
    b.push_str("</tbody></table></section>");
    b
}

/// One list of a queue, paged.
pub fn list(ctx: &Ctx<'_>, page: &ListPage, now_ms: u64, notice: Option<&str>) -> String {
    let mut b = format!(
        r#"<h1>{} <span class="count">{}</span></h1>"#,
        page.kind.title(),
        num(page.total)
    );
    if let Some(n) = notice {
        let _ = write!(b, r#"<p class="notice">{}</p>"#, escape(n));
    }
    if page.kind == ListKind::Dead {
        b.push_str(&dead_actions(ctx, &page.queue, page.total));
    }
    let pager = pager(page);
    b.push_str(&pager);
    b.push_str(&rows(ctx, page, now_ms));
    b.push_str(&pager);
    layout(
        ctx,
        &format!("{} · {}", page.kind.title(), page.queue),
        &[
            (queue_href(&page.queue), page.queue.clone()),
            (
                list_href(&page.queue, page.kind, 1),
                page.kind.title().into(),
            ),
        ],
        &b,
    )
}

fn pager(page: &ListPage) -> String {
    let pages = page.pages();
    let link = |p: u64, label: &str, rel: &str| {
        format!(
            r#"<a rel="{rel}" href="{}">{label}</a>"#,
            escape(&list_href(&page.queue, page.kind, p))
        )
    };
    let prev = if page.page > 1 {
        link(page.page - 1, "← newer", "prev")
    } else {
        r#"<span class="off">← newer</span>"#.into()
    };
    let next = if page.page < pages {
        link(page.page + 1, "older →", "next")
    } else {
        r#"<span class="off">older →</span>"#.into()
    };
    let (prev, next) = match page.kind {
        // Waiting and due lists read "next to run" first.
        ListKind::Dead => (prev, next),
        _ => (
            prev.replace("← newer", "← sooner"),
            next.replace("older →", "later →"),
        ),
    };
    format!(
        r#"<nav class="pager">{prev} <span>page {} of {}</span> {next}</nav>"#,
        num(page.page),
        num(pages)
    )
}

fn rows(ctx: &Ctx<'_>, page: &ListPage, now_ms: u64) -> String {
    match &page.items {
        Rows::Jobs(jobs) => job_rows(page.kind, jobs, now_ms),
        Rows::Dead(dead) => dead_rows(ctx, &page.queue, dead, now_ms),
    }
}

fn job_rows(kind: ListKind, jobs: &[JobRow], now_ms: u64) -> String {
    let due = matches!(kind, ListKind::Scheduled | ListKind::Retries);
    let mut b = format!(
        r#"<table class="jobs {}"><thead><tr><th>id</th><th>task</th><th class="num">attempt</th><th class="num">enqueued</th>{}{}<th>payload</th></tr></thead><tbody>"#,
        kind.as_str(),
        if due {
            r#"<th class="num">next attempt</th>"#
        } else {
            ""
        },
        if kind == ListKind::Retries {
            "<th>last error</th>"
        } else {
            ""
        },
    );
    for j in jobs {
        let _ = write!(
            b,
            r#"<tr><td class="id">{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>"#,
            cell(j.id.as_deref().unwrap_or("–"), CELL_CHARS),
            cell(j.task.as_deref().unwrap_or("–"), CELL_CHARS),
            j.attempt.map_or("–".into(), |a| a.to_string()),
            escape(&j.enqueued_at_ms.map_or("–".into(), |t| when(now_ms, t))),
        );
        if due {
            let _ = write!(
                b,
                r#"<td class="num" title="{}">{}</td>"#,
                escape(&j.due_at_ms.map(utc).unwrap_or_default()),
                escape(&j.due_at_ms.map_or("–".into(), |t| when(now_ms, t))),
            );
        }
        if kind == ListKind::Retries {
            let _ = write!(
                b,
                r#"<td class="error">{}</td>"#,
                cell(j.error.as_deref().unwrap_or("–"), PAYLOAD_PREVIEW_CHARS)
            );
        }
        let _ = write!(
            b,
            r#"<td><code class="payload{}">{}</code></td></tr>"#,
            if j.malformed { " malformed" } else { "" },
            escape(&j.payload)
        );
    }
    if jobs.is_empty() {
        b.push_str(r#"<tr><td colspan="7" class="empty">none</td></tr>"#);
    }
    b.push_str("</tbody></table>");
    b
}

fn dead_rows(ctx: &Ctx<'_>, queue: &str, dead: &[DeadRow], now_ms: u64) -> String {
    let mut b = String::from(
        r#"<table class="jobs dead"><thead><tr><th>id</th><th>task</th><th>reason</th><th class="num">attempts</th><th class="num">died</th><th>error</th><th>payload</th>"#,
    );
    if !ctx.read_only {
        b.push_str("<th></th>");
    }
    b.push_str("</tr></thead><tbody>");
    for d in dead {
        let _ = write!(
            b,
            r#"<tr class="dead-letter"><td class="id">{}</td><td>{}</td><td><span class="reason {reason}">{reason}</span></td><td class="num">{}</td><td class="num" title="{}">{}</td><td class="error">{}</td><td><code class="payload">{}</code>{}</td>"#,
            cell(d.id.as_deref().unwrap_or("–"), CELL_CHARS),
            cell(d.task.as_deref().unwrap_or("–"), CELL_CHARS),
            d.attempts.map_or("–".into(), |a| a.to_string()),
            escape(&d.died_at_ms.map(utc).unwrap_or_default()),
            escape(&d.died_at_ms.map_or("–".into(), |t| when(now_ms, t))),
            cell(&d.error, PAYLOAD_PREVIEW_CHARS),
            escape(&d.payload),
            // Long entries are read only in part: say how large they are.
            if d.bytes > workerpool_queue::admin::DEAD_WHOLE_BYTES as u64 {
                format!(r#" <span class="bytes">{} bytes</span>"#, d.bytes)
            } else {
                String::new()
            },
            reason = escape(&d.reason),
        );
        if !ctx.read_only {
            b.push_str(r#"<td class="actions">"#);
            match &d.id {
                Some(id) => {
                    // The form sends the whole id; the question shows it cut.
                    let shown = text::safe_line(id, CELL_CHARS);
                    b.push_str(&action_form(
                        ctx,
                        queue,
                        "retry",
                        Some(id),
                        "retry",
                        &format!("Put job {shown} back on {queue}?"),
                    ));
                    b.push_str(&action_form(
                        ctx,
                        queue,
                        "delete",
                        Some(id),
                        "delete",
                        &format!("Delete the dead letter of job {shown}?"),
                    ));
                }
                None => b.push_str(
                    r#"<span class="off" title="no job id: only purge removes it">no id</span>"#,
                ),
            }
            b.push_str("</td>");
        }
        b.push_str("</tr>");
    }
    if dead.is_empty() {
        b.push_str(r#"<tr><td colspan="8" class="empty">no dead letters</td></tr>"#);
    }
    b.push_str("</tbody></table>");
    b
}

fn dead_actions(ctx: &Ctx<'_>, queue: &str, total: u64) -> String {
    if ctx.read_only || total == 0 {
        return String::new();
    }
    format!(
        r#"<div class="bulk">{}{}</div>"#,
        action_form(
            ctx,
            queue,
            "retry",
            None,
            "retry all",
            &format!("Put every dead job of {queue} back on the queue?"),
        ),
        action_form(
            ctx,
            queue,
            "purge",
            None,
            "purge all",
            &format!("Delete every dead letter of {queue}? This cannot be undone."),
        )
    )
}

/// A POST form to `/queues/<q>/dead/<action>`; `dashboard.js` asks
/// `confirm` before it is sent.
fn action_form(
    ctx: &Ctx<'_>,
    queue: &str,
    action: &str,
    id: Option<&str>,
    label: &str,
    confirm: &str,
) -> String {
    let id = id.map_or(String::new(), |id| {
        format!(r#"<input type="hidden" name="id" value="{}">"#, escape(id))
    });
    format!(
        r#"<form method="post" class="action {action}" action="{href}/dead/{action}" data-confirm="{confirm}"><input type="hidden" name="csrf" value="{csrf}">{id}<button type="submit">{label}</button></form>"#,
        href = escape(&queue_href(queue)),
        confirm = escape(confirm),
        csrf = escape(ctx.csrf),
        label = escape(label),
    )
}

/// The form that finds a job of `queue` by id: a GET, so it works
/// without the script.
fn find_job(queue: &str, value: &str) -> String {
    format!(
        r#"<form method="get" class="find-job" action="{action}"><label>find a job by id <input type="search" name="id" value="{value}" required maxlength="{MAX_JOB_ID_BYTES}" autocomplete="off"></label> <button type="submit">show</button></form>"#,
        action = escape(&jobs_href(queue)),
        value = escape(value),
    )
}

fn job_crumbs(queue: &str, id: &str) -> Vec<(String, String)> {
    vec![
        (queue_href(queue), queue.to_string()),
        (
            job_href(queue, id),
            format!("job {}", text::safe_line(id, CELL_CHARS)),
        ),
    ]
}

/// A field's name as a label: `next_at_ms` reads `next at`.
fn label(key: &str) -> String {
    key.strip_suffix("_ms").unwrap_or(key).replace('_', " ")
}

/// One field of an outcome for a cell, whatever it holds: a time
/// (`*_at_ms`) as a UTC date and how long ago, text cut as the dead
/// letters' errors are, JSON (`result`, `progress`, any object) pretty
/// and cut as their payloads are.
fn outcome_value(view: &JobView, key: &str, value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Number(n) if key.ends_with("_at_ms") => match n.as_u64() {
            Some(ms) => format!(
                r#"<time title="{ms} (unix ms)">{}</time> <span class="ago">({})</span>"#,
                escape(&utc(ms)),
                escape(&when(view.server_time_ms, ms)),
            ),
            None => escape(&n.to_string()),
        },
        Value::String(s) => {
            let max = if matches!(key, "id" | "worker") {
                CELL_CHARS
            } else {
                PAYLOAD_PREVIEW_CHARS
            };
            cell(s, max)
        }
        Value::Null => "–".into(),
        Value::Bool(_) | Value::Number(_) => escape(&value.to_string()),
        Value::Array(_) | Value::Object(_) => {
            let (shown, cut) = json_preview(value);
            let whole = if cut {
                format!(
                    r#" <a class="whole" href="{}">whole in the JSON</a>"#,
                    escape(&job_api_href(&view.queue, &view.id))
                )
            } else {
                String::new()
            };
            format!(
                r#"<code class="payload json">{}</code>{whole}"#,
                escape(&shown)
            )
        }
    }
}

/// A job's kept outcome: its state on top, then every field it has, in
/// the order of its JSON, so that fields the outcome gains show too.
pub fn job(ctx: &Ctx<'_>, view: &JobView) -> String {
    let id = cell(&view.id, CELL_CHARS);
    let state = view
        .outcome
        .get("state")
        .and_then(serde_json::Value::as_str);
    let mut b = format!(r#"<h1>job <span class="id">{id}</span>"#);
    if let Some(state) = state {
        // The word is a class only when it is a plain word.
        let class = if state.bytes().all(|c| c.is_ascii_lowercase() || c == b'_') {
            state
        } else {
            ""
        };
        let _ = write!(
            b,
            r#" <span class="state {class}" id="job-state">{}</span>"#,
            cell(state, CELL_CHARS)
        );
    }
    b.push_str("</h1>");
    b.push_str(r#"<table class="outcome"><tbody>"#);
    if let Some(fields) = view.outcome.as_object() {
        for (key, value) in fields {
            let _ = write!(
                b,
                r#"<tr data-key="{k}"><th title="{k}">{label}</th><td>{value}</td></tr>"#,
                k = escape(key),
                label = escape(&label(key)),
                value = outcome_value(view, key, value),
            );
        }
    }
    b.push_str("</tbody></table>");
    let _ = write!(
        b,
        r#"<p class="more"><a href="{}">as JSON</a></p>"#,
        escape(&job_api_href(&view.queue, &view.id))
    );
    b.push_str(&find_job(&view.queue, ""));
    layout(
        ctx,
        &format!(
            "job {} · {}",
            text::safe_line(&view.id, CELL_CHARS),
            view.queue
        ),
        &job_crumbs(&view.queue, &view.id),
        &b,
    )
}

/// Why job `id` of `queue` shows nothing, with the form to look again: a
/// job with no outcome kept, or an id that cannot be one (empty, too
/// long), which the page shows only cut and never links.
pub fn job_missing(ctx: &Ctx<'_>, queue: &str, id: &str, why: &str) -> String {
    let valid = job_id_problem(id).is_none();
    let b = format!(
        r#"<h1>job <span class="id">{}</span></h1><p class="message" id="job-missing">{}</p>{}"#,
        cell(id, CELL_CHARS),
        escape(why),
        find_job(queue, if valid { id } else { "" }),
    );
    let crumbs = if valid {
        job_crumbs(queue, id)
    } else {
        vec![(queue_href(queue), queue.to_string())]
    };
    layout(
        ctx,
        &format!("job {} · {queue}", text::safe_line(id, CELL_CHARS)),
        &crumbs,
        &b,
    )
}

/// A small page for errors and refusals.
pub fn message(ctx: &Ctx<'_>, title: &str, text: &str) -> String {
    layout(
        ctx,
        title,
        &[],
        &format!(
            r#"<h1>{}</h1><p class="message">{}</p>"#,
            escape(title),
            escape(text)
        ),
    )
}

/// `n` with thousands separators: 1,000,000.
pub fn num(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn rate(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.1}"))
}

fn seconds(s: Option<f64>) -> String {
    s.map_or("–".into(), |s| age((s * 1000.0) as u64))
}

fn workers_count(live: u64, lost: u64) -> String {
    if lost == 0 {
        live.to_string()
    } else {
        format!("{live} (+{lost} lost)")
    }
}

/// A duration for people: `850ms`, `42s`, `3m 10s`, `2h 5m`, `3d 4h`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// `t` relative to `now` (unix ms): `5s ago`, `in 3m 0s`.
pub fn when(now: u64, t: u64) -> String {
    if t <= now {
        format!("{} ago", age(now - t))
    } else {
        format!("in {}", age(t - now))
    }
}

/// Unix ms as `2024-05-01 12:00:00 UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86400, secs % 86400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{QueueSummary, Series};
    use workerpool_queue::snapshot::Counts;

    const CTX: Ctx<'static> = Ctx {
        redis: "redis://:***@host:6379/0",
        read_only: false,
        warning: None,
        csrf: "c5",
    };

    #[test]
    fn escape_neutralises_markup_quotes_and_ampersands() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(escape("plain ✓"), "plain ✓");
    }

    #[test]
    fn queue_names_are_escaped_in_text_and_encoded_in_links() {
        assert_eq!(path_segment("{mail}:high"), "%7Bmail%7D%3Ahigh");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
        let page = overview(
            &CTX,
            &Overview {
                queues: vec![QueueSummary::new(
                    "<b>q\"",
                    Counts {
                        waiting: 1_234_567,
                        ..Counts::default()
                    },
                )],
                ..Overview::default()
            },
        );
        assert!(page.contains("&lt;b&gt;q&quot;"), "{page}");
        assert!(!page.contains("<b>q"), "{page}");
        assert!(page.contains(r#"href="/queues/%3Cb%3Eq%22""#), "{page}");
        assert!(page.contains(">1,234,567<"), "{page}");
    }

    #[test]
    fn a_rate_limited_queue_shows_its_limit_beside_its_name() {
        let page = |rate_limit: Option<&str>| {
            overview(
                &CTX,
                &Overview {
                    queues: vec![QueueSummary::new(
                        "calls",
                        Counts {
                            rate_limit: rate_limit.map(str::to_string),
                            ..Counts::default()
                        },
                    )],
                    ..Overview::default()
                },
            )
        };
        assert!(page(Some("20/s")).contains("rate limit 20/s</span>"));
        assert!(!page(None).contains("rate limit"));
    }

    #[test]
    fn a_payload_with_a_script_is_shown_as_text() {
        let evil = r#"{"data":"<script>document.documentElement.setAttribute('data-pwned','1')</script>"}"#;
        let page = ListPage {
            queue: "q".into(),
            kind: ListKind::Waiting,
            total: 1,
            page: 1,
            per_page: 50,
            items: Rows::Jobs(vec![JobRow::from_raw(evil.as_bytes(), None)]),
        };
        let html = list(&CTX, &page, 0, None);
        assert!(!html.contains("<script>document"), "{html}");
        assert!(html.contains("&lt;script&gt;document"), "{html}");
        assert_eq!(html.matches("<script").count(), 1, "only dashboard.js");
    }

    #[test]
    fn read_only_pages_have_no_forms() {
        let dead = ListPage {
            queue: "q".into(),
            kind: ListKind::Dead,
            total: 1,
            page: 1,
            per_page: 50,
            items: Rows::Dead(vec![DeadRow {
                id: Some("j1".into()),
                reason: "exhausted".into(),
                error: "boom & <bust>".into(),
                ..DeadRow::default()
            }]),
        };
        let writable = list(&CTX, &dead, 0, None);
        assert!(writable.contains(r#"action="/queues/q/dead/retry""#));
        assert!(writable.contains(r#"name="csrf" value="c5""#));
        assert!(writable.contains("boom &amp; &lt;bust&gt;"));
        let read_only = list(
            &Ctx {
                read_only: true,
                ..CTX
            },
            &dead,
            0,
            None,
        );
        assert!(!read_only.contains("<form"), "{read_only}");
        assert!(read_only.contains(r#"id="read-only""#));
    }

    #[test]
    fn the_queue_page_shows_workers_and_every_list() {
        let detail = QueueDetail {
            summary: QueueSummary {
                name: "emails".into(),
                ..QueueSummary::default()
            },
            server_time_ms: 10_000,
            workers: vec![WorkerInfo {
                instance: "w-1~ab".into(),
                alive: true,
                last_beat_age_ms: 1_500,
                dead_after_ms: 30_000,
                pid: Some(42),
                concurrency: Some(4),
                version: Some("0.1.0".into()),
                jobs: vec!["j1".into()],
            }],
            lists: ListKind::ALL
                .into_iter()
                .map(|kind| ListPage {
                    queue: "emails".into(),
                    kind,
                    total: 0,
                    page: 1,
                    per_page: 10,
                    items: if kind == ListKind::Dead {
                        Rows::Dead(Vec::new())
                    } else {
                        Rows::Jobs(Vec::new())
                    },
                })
                .collect(),
            history: Series::default(),
        };
        let html = queue(&CTX, &detail, Some("Retried 1 dead job."));
        assert!(html.contains(r#"data-instance="w-1~ab""#));
        assert!(html.contains(r#"<span class="status alive">alive</span>"#));
        for id in ["waiting", "scheduled", "retries", "dead"] {
            assert!(html.contains(&format!(r#"<section id="{id}">"#)), "{id}");
        }
        assert!(html.contains("Retried 1 dead job."));
        assert!(
            html.contains(r#"<form method="get" class="find-job" action="/queues/emails/jobs">"#),
            "{html}"
        );
    }

    fn job_view(outcome: serde_json::Value) -> JobView {
        JobView {
            queue: "{mail}".into(),
            id: "j/1".into(),
            outcome,
            server_time_ms: 1_700_000_005_000,
        }
    }

    #[test]
    fn a_job_page_shows_every_field_escaped_with_its_state_on_top() {
        let html = job(
            &CTX,
            &job_view(serde_json::json!({
                "id": "j/1",
                "state": "done",
                "attempt": 2,
                "worker": "w<1>~ab",
                "result": {"html": "<script>alert(1)</script>"},
                "updated_at_ms": 1_700_000_000_000u64,
                // A field this page has never heard of.
                "cancel_requested": true,
            })),
        );
        assert!(
            html.contains(r#"<span class="state done" id="job-state">done</span>"#),
            "{html}"
        );
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert_eq!(html.matches("<script").count(), 1, "only dashboard.js");
        assert!(html.contains("w&lt;1&gt;~ab"), "{html}");
        // Pretty JSON: the layout's line breaks are kept.
        assert!(html.contains("{\n  &quot;html&quot;"), "{html}");
        assert!(html.contains("2023-11-14 22:13:20 UTC"), "{html}");
        assert!(html.contains("(5s ago)"), "{html}");
        assert!(
            html.contains(r#"<tr data-key="cancel_requested"><th title="cancel_requested">cancel requested</th><td>true</td></tr>"#),
            "{html}"
        );
        assert!(
            html.contains(r#"href="/api/queues/%7Bmail%7D/jobs/j%2F1""#),
            "{html}"
        );
        assert!(
            html.contains(r#"action="/queues/%7Bmail%7D/jobs""#),
            "{html}"
        );
    }

    #[test]
    fn a_long_result_is_cut_as_a_dead_letter_payload_is() {
        let long = "x".repeat(5_000);
        let html = job(
            &CTX,
            &job_view(serde_json::json!({"id": "j/1", "state": "done", "result": [long]})),
        );
        let code = html
            .split(r#"<code class="payload json">"#)
            .nth(1)
            .and_then(|rest| rest.split("</code>").next())
            .expect("the result's cell");
        assert!(code.ends_with('…'), "{code}");
        // 300 characters of `[\n  "xxx…`: the 5 before the first x.
        assert_eq!(
            code.matches('x').count(),
            PAYLOAD_PREVIEW_CHARS - 5,
            "{code}"
        );
        assert!(html.contains("whole in the JSON"), "{html}");
        let error = "e".repeat(5_000);
        let html = job(
            &CTX,
            &job_view(serde_json::json!({"id": "j/1", "state": "dead", "error": error})),
        );
        assert!(
            html.contains(&cell(&error, PAYLOAD_PREVIEW_CHARS)),
            "{html}"
        );
        assert!(html.contains("more chars]"), "{html}");
    }

    #[test]
    fn a_missing_job_page_says_why_and_offers_the_form_again() {
        let html = job_missing(&CTX, "q", "<b>", "no outcome kept for job \"<b>\"");
        assert!(
            html.contains("no outcome kept for job &quot;&lt;b&gt;&quot;"),
            "{html}"
        );
        assert!(!html.contains("<b>"), "{html}");
        assert!(html.contains(r#"name="id" value="&lt;b&gt;""#), "{html}");
        let long = "a".repeat(MAX_JOB_ID_BYTES + 1);
        let html = job_missing(&CTX, "q", &long, "too long");
        assert!(html.contains(r#"name="id" value="""#), "{html}");
        assert!(!html.contains(&long), "shown only cut: {html}");
    }

    #[test]
    fn numbers_and_times_read_well() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(1000), "1,000");
        assert_eq!(num(1_000_000), "1,000,000");
        assert_eq!(age(850), "850ms");
        assert_eq!(age(190_000), "3m 10s");
        assert_eq!(when(10_000, 5_000), "5s ago");
        assert_eq!(when(5_000, 10_000), "in 5s");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_709_251_199_000), "2024-02-29 23:59:59 UTC");
    }
}
