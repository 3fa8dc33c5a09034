//! The routes: pages, JSON, the actions on dead letters, the static files,
//! and the guard in front of all of them (Host, token, security headers).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State as Extract};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use subtle::ConstantTimeEq;
use workerpool_queue::{admin, text};

use crate::State;
use crate::html::{self, Ctx};
use crate::model::{ListKind, job_id_problem};

type Shared = Arc<State>;

const JS: &str = include_str!("../assets/dashboard.js");
const CSS: &str = include_str!("../assets/dashboard.css");
const SESSION_COOKIE: &str = "workerpool_dashboard";
/// No inline script or style, nothing from elsewhere, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/queues/{queue}", get(queue_page))
        .route("/queues/{queue}/{list}", get(list_page))
        .route("/queues/{queue}/jobs", get(find_job))
        .route("/queues/{queue}/jobs/", get(job_page_without_id))
        .route("/queues/{queue}/jobs/{id}", get(job_page))
        .route("/queues/{queue}/dead/{action}", post(dead_action))
        .route("/api/overview", get(overview_json))
        .route("/api/queues/{queue}", get(queue_json))
        .route("/api/queues/{queue}/{list}", get(list_json))
        .route("/api/queues/{queue}/jobs/", get(job_json_without_id))
        .route("/api/queues/{queue}/jobs/{id}", get(job_json))
        .route("/assets/dashboard.js", get(js))
        .route("/assets/dashboard.css", get(css))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

fn ctx(s: &State) -> Ctx<'_> {
    Ctx {
        redis: &s.options.redis_label,
        read_only: s.options.read_only,
        csrf: &s.csrf,
        warning: s.redis_warning(),
    }
}

fn page(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn message(s: &State, status: StatusCode, title: &str, text: &str) -> Response {
    page(status, html::message(&ctx(s), title, text))
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn json_error(status: StatusCode, error: &str) -> Response {
    json(status, &serde_json::json!({ "error": error }))
}

fn redis_failed(e: &redis::RedisError) -> String {
    // An ACL refusal names the command to grant, a full Redis says so.
    format!(
        "cannot read Redis: {}",
        workerpool_queue::connection::describe(e)
    )
}

/// The query string's pairs, decoded.
fn query(raw: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn page_number(q: &HashMap<String, String>, key: &str) -> Option<u64> {
    q.get(key).and_then(|v| v.parse().ok())
}

fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

async fn overview_page(Extract(s): Extract<Shared>) -> Response {
    match s.overview().await {
        Ok(o) => page(StatusCode::OK, html::overview(&ctx(&s), &o)),
        Err(e) => message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
    }
}

async fn overview_json(Extract(s): Extract<Shared>) -> Response {
    match s.overview().await {
        Ok(o) => json(StatusCode::OK, &o),
        Err(e) => json_error(StatusCode::BAD_GATEWAY, &redis_failed(&e)),
    }
}

fn unknown_queue(name: &str) -> String {
    format!("no queue {name:?} on this dashboard")
}

async fn queue_page(
    Extract(s): Extract<Shared>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let Some(q) = s.queue(&name) else {
        return message(
            &s,
            StatusCode::NOT_FOUND,
            "Not found",
            &unknown_queue(&name),
        );
    };
    match s.detail(q).await {
        Ok(d) => {
            let notice = notice(&query(raw.as_deref()), &name);
            page(StatusCode::OK, html::queue(&ctx(&s), &d, notice.as_deref()))
        }
        Err(e) => message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
    }
}

async fn queue_json(Extract(s): Extract<Shared>, Path(name): Path<String>) -> Response {
    let Some(q) = s.queue(&name) else {
        return json_error(StatusCode::NOT_FOUND, &unknown_queue(&name));
    };
    match s.detail(q).await {
        Ok(d) => json(StatusCode::OK, &d),
        Err(e) => json_error(StatusCode::BAD_GATEWAY, &redis_failed(&e)),
    }
}

async fn list_page(
    Extract(s): Extract<Shared>,
    Path((name, list)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (Some(q), Some(kind)) = (s.queue(&name), ListKind::parse(&list)) else {
        return message(
            &s,
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("no list {list:?} of queue {name:?} on this dashboard"),
        );
    };
    let params = query(raw.as_deref());
    let number = page_number(&params, "page").unwrap_or(1);
    match s.list(q, kind, number, crate::PER_PAGE).await {
        Ok((p, now)) => {
            let notice = notice(&params, &name);
            page(
                StatusCode::OK,
                html::list(&ctx(&s), &p, now, notice.as_deref()),
            )
        }
        Err(e) => message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
    }
}

async fn list_json(
    Extract(s): Extract<Shared>,
    Path((name, list)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (Some(q), Some(kind)) = (s.queue(&name), ListKind::parse(&list)) else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!("no list {list:?} of queue {name:?} on this dashboard"),
        );
    };
    let params = query(raw.as_deref());
    let number = page_number(&params, "page").unwrap_or(1);
    let per_page = page_number(&params, "per_page").unwrap_or(crate::PER_PAGE);
    match s.list(q, kind, number, per_page).await {
        Ok((p, _)) => json(StatusCode::OK, &p),
        Err(e) => json_error(StatusCode::BAD_GATEWAY, &redis_failed(&e)),
    }
}

fn no_outcome(id: &str) -> String {
    format!(
        "no outcome kept for job {id:?} (never kept, or expired); jobs keep outcomes when enqueued with keep or run by workers with --keep-outcomes"
    )
}

/// `GET /queues/{queue}/jobs?id=ID`, the find-a-job form: a redirect to
/// the job's page (the id trimmed, as typed or pasted).
async fn find_job(
    Extract(s): Extract<Shared>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if s.queue(&name).is_none() {
        return message(
            &s,
            StatusCode::NOT_FOUND,
            "Not found",
            &unknown_queue(&name),
        );
    }
    let params = query(raw.as_deref());
    let id = params.get("id").map_or("", |id| id.trim());
    if let Some(why) = job_id_problem(id) {
        return page(
            StatusCode::BAD_REQUEST,
            html::job_missing(&ctx(&s), &name, id, &why),
        );
    }
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, html::job_href(&name, id))],
    )
        .into_response()
}

async fn job_page_without_id(Extract(s): Extract<Shared>, Path(name): Path<String>) -> Response {
    job_page(Extract(s), Path((name, String::new()))).await
}

/// `GET /queues/{queue}/jobs/{id}`: the job's kept outcome.
async fn job_page(
    Extract(s): Extract<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let Some(q) = s.queue(&name) else {
        return message(
            &s,
            StatusCode::NOT_FOUND,
            "Not found",
            &unknown_queue(&name),
        );
    };
    if let Some(why) = job_id_problem(&id) {
        return page(
            StatusCode::BAD_REQUEST,
            html::job_missing(&ctx(&s), &name, &id, &why),
        );
    }
    match s.job(q, &id).await {
        Ok(Some(view)) => page(StatusCode::OK, html::job(&ctx(&s), &view)),
        Ok(None) => page(
            StatusCode::NOT_FOUND,
            html::job_missing(&ctx(&s), &name, &id, &no_outcome(&id)),
        ),
        Err(e) => message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
    }
}

async fn job_json_without_id(Extract(s): Extract<Shared>, Path(name): Path<String>) -> Response {
    job_json(Extract(s), Path((name, String::new()))).await
}

/// `GET /api/queues/{queue}/jobs/{id}`: the job's kept outcome as JSON.
async fn job_json(
    Extract(s): Extract<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let Some(q) = s.queue(&name) else {
        return json_error(StatusCode::NOT_FOUND, &unknown_queue(&name));
    };
    if let Some(why) = job_id_problem(&id) {
        return json_error(StatusCode::BAD_REQUEST, &why);
    }
    let mut conn = s.conn.clone();
    match workerpool_queue::outcome::read(&mut conn, q, &id).await {
        Ok(Some(outcome)) => json(StatusCode::OK, &outcome),
        Ok(None) => json_error(StatusCode::NOT_FOUND, &no_outcome(&id)),
        Err(e) => json_error(StatusCode::BAD_GATEWAY, &redis_failed(&e)),
    }
}

/// The sentence an action's redirect carries, rebuilt from numbers only so
/// that a link cannot put words of its own on the page.
fn notice(params: &HashMap<String, String>, queue: &str) -> Option<String> {
    let n = page_number(params, "n")?;
    let s = if n == 1 { "" } else { "s" };
    let mut text = match params.get("done")?.as_str() {
        "retried" => format!("Retried {n} dead job{s} onto {queue}."),
        "deleted" => format!("Deleted {n} dead letter{s}."),
        "purged" => format!("Purged {n} dead letter{s}."),
        _ => return None,
    };
    if let Some(k) = page_number(params, "skipped").filter(|k| *k > 0) {
        text.push_str(&format!(
            " Left {k} malformed payload{} in the dead list (they are not jobs).",
            if k == 1 { "" } else { "s" }
        ));
    }
    Some(text)
}

/// `POST /queues/{queue}/dead/{retry|delete|purge}` from the forms: the
/// same functions as `workerpool dead retry|purge`.
async fn dead_action(
    Extract(s): Extract<Shared>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if s.options.read_only {
        return message(
            &s,
            StatusCode::FORBIDDEN,
            "Read-only",
            "this dashboard is read-only: actions are off",
        );
    }
    let Some(q) = s.queue(&name) else {
        return message(
            &s,
            StatusCode::NOT_FOUND,
            "Not found",
            &unknown_queue(&name),
        );
    };
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    // A request with the bearer token is not a browser's cross-site form;
    // a form must carry the value only this dashboard's pages know.
    let csrf_ok = form.get("csrf").is_some_and(|c| same(c, &s.csrf)) || bearer_ok(&s, &headers);
    if !csrf_ok {
        return message(
            &s,
            StatusCode::FORBIDDEN,
            "Refused",
            "the form is stale or did not come from this dashboard: reload the page and try again",
        );
    }
    let id = form
        .get("id")
        .map(String::as_str)
        .filter(|id| !id.is_empty());
    let mut conn = s.conn.clone();
    let (done, n, skipped) = match action.as_str() {
        "retry" => match admin::retry_dead(&mut conn, q, id).await {
            Ok(r) => ("retried", r.retried, r.skipped_malformed),
            Err(e) => return message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
        },
        "delete" | "purge" => {
            let id = if action == "delete" {
                match id {
                    Some(id) => Some(id),
                    None => {
                        return message(
                            &s,
                            StatusCode::BAD_REQUEST,
                            "Bad request",
                            "delete needs the id of the job",
                        );
                    }
                }
            } else {
                None
            };
            match admin::purge_dead(&mut conn, q, id).await {
                Ok(n) => (if id.is_some() { "deleted" } else { "purged" }, n, 0),
                Err(e) => return message(&s, StatusCode::BAD_GATEWAY, "Redis", &redis_failed(&e)),
            }
        }
        other => {
            return message(
                &s,
                StatusCode::NOT_FOUND,
                "Not found",
                &format!("no action {other:?}: retry, delete or purge"),
            );
        }
    };
    let id = id.map(|id| text::safe_line(id, text::LINE_CHARS));
    tracing::info!(queue = %name, action = done, jobs = n, id = id.as_deref(), "dashboard: dead letters");
    let location = format!(
        "{}?done={done}&n={n}&skipped={skipped}",
        html::list_href(&name, ListKind::Dead, 1)
    );
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

async fn js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
        .into_response()
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn not_found(Extract(s): Extract<Shared>) -> Response {
    message(&s, StatusCode::NOT_FOUND, "Not found", "no such page")
}

fn bearer_ok(s: &State, headers: &HeaderMap) -> bool {
    let Some(token) = &s.options.token else {
        return false;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same(given.trim(), token))
}

fn session_ok(s: &State, headers: &HeaderMap) -> bool {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .any(|(k, v)| k == SESSION_COOKIE && same(v, &s.session))
}

/// Whether `host` (a Host header) names this machine's loopback.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// In front of every route: the Host check, the token, and the headers
/// that keep the pages from running anything but `dashboard.js`.
async fn guard(Extract(s): Extract<Shared>, req: Request, next: Next) -> Response {
    let mut response = admit(&s, req, next).await;
    let h = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        // The token can be in the URL at login: never pass it on.
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn admit(s: &State, req: Request, next: Next) -> Response {
    if s.loopback_hosts_only {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !loopback_host(host) {
            return message(
                s,
                StatusCode::MISDIRECTED_REQUEST,
                "Refused",
                "this dashboard listens on loopback and answers only for localhost",
            );
        }
    }
    let Some(token) = &s.options.token else {
        return next.run(req).await;
    };
    let params = query(req.uri().query());
    if let Some(given) = params.get("token") {
        if !same(given, token) {
            return unauthorized(s, "wrong token");
        }
        // Logged in: a cookie from now on, and the URL without the token,
        // if it is a page of this dashboard.
        let rest: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter().filter(|(k, _)| k.as_str() != "token"))
            .finish();
        let location = match local_path(req.uri()) {
            Some(path) if !rest.is_empty() => format!("{path}?{rest}"),
            Some(path) => path.to_string(),
            None => "/".to_string(),
        };
        let cookie = format!(
            "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
            s.session
        );
        let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    if bearer_ok(s, req.headers()) || session_ok(s, req.headers()) {
        return next.run(req).await;
    }
    unauthorized(s, "this dashboard needs its token")
}

/// The path of `uri` when a browser can only read it as a page of this
/// dashboard. Browsers take `//host/…` for another site, and `/\host` too
/// (a backslash counts as a slash); a request target with a scheme or a
/// host names one. The path must start with one `/`, not `//` or `/\`,
/// and hold no backslash and no control character; so must its
/// percent-decoded form (`/%2F%2Fhost`), in case something on the way
/// decodes it.
fn local_path(uri: &Uri) -> Option<&str> {
    let plain = |p: &str| {
        p.starts_with('/')
            && !p.starts_with("//")
            && !p.contains('\\')
            && !p.chars().any(char::is_control)
    };
    let path = uri.path();
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    (uri.scheme().is_none() && uri.authority().is_none() && plain(path) && plain(&decoded))
        .then_some(path)
}

fn unauthorized(s: &State, why: &str) -> Response {
    let mut r = page(
        StatusCode::UNAUTHORIZED,
        html::layout(
            &Ctx {
                redis: "",
                read_only: s.options.read_only,
                csrf: "",
                warning: None,
            },
            "Token required",
            &[],
            &format!(
                r#"<h1>Token required</h1><p class="message">{}: open this page once with <code>?token=TOKEN</code> (a cookie keeps it until the dashboard restarts), or send <code>Authorization: Bearer TOKEN</code>.</p>"#,
                html::escape(why)
            ),
        ),
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_pass_the_host_check() {
        for ok in [
            "localhost",
            "localhost:9090",
            "127.0.0.1:9090",
            "[::1]:9090",
            "app.localhost:1",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:9090",
            "10.0.0.1",
            "",
            "localhost.evil.example",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn only_a_plain_local_path_is_a_place_to_return_to() {
        let local = |target: &str| {
            let uri: Uri = target.parse().expect("a request target");
            local_path(&uri).map(str::to_string)
        };
        for ok in ["/", "/queues/q", "/queues/%7Bq%7D/dead", "/a/b//c"] {
            assert_eq!(local(ok).as_deref(), Some(ok), "{ok}");
        }
        for bad in [
            "//evil.example/x",
            "/\\evil.example",
            "/a\\b",
            "/%2F%2Fevil.example",
            "/%5Cevil.example",
            "/%09/evil.example",
            "https://evil.example",
            "https://evil.example/x",
        ] {
            assert_eq!(local(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_action_notice_is_rebuilt_from_numbers() {
        let p = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        assert_eq!(
            notice(
                &p(&[("done", "retried"), ("n", "2"), ("skipped", "1")]),
                "q"
            )
            .as_deref(),
            Some(
                "Retried 2 dead jobs onto q. Left 1 malformed payload in the dead list (they are not jobs)."
            )
        );
        assert_eq!(notice(&p(&[("done", "<b>"), ("n", "1")]), "q"), None);
        assert_eq!(notice(&p(&[("done", "purged"), ("n", "x")]), "q"), None);
    }
}
