//! The `http` handler: POST each job to a URL, for example a sidecar in the
//! same pod.
//!
//! The body is the job's JSON object. A 2xx answer completes the job; a 4xx
//! other than 408 and 429 is permanent (the job goes to the dead list with
//! the status and the start of the body); anything else — 5xx, 408, 429,
//! refused connections, resets — is retried with backoff. The runtime's
//! `--job-timeout` bounds each request by dropping it, which closes that
//! connection; every other connection is kept alive and reused.

use std::time::Duration;

use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::handler::{Handler, Outcome};
use workerpool_queue::job::Job;

/// How much of an error response's body goes into the job's error.
const ERROR_BODY_CHARS: usize = 200;
/// The most of a response body read; more is dropped with its connection.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Header carrying the job's id, so a receiver can deduplicate without
/// parsing the body first.
pub const JOB_ID_HEADER: &str = "x-workerpool-job-id";
/// Header carrying the attempt number.
pub const ATTEMPT_HEADER: &str = "x-workerpool-attempt";

/// Posts jobs to one URL over a pool of kept-alive connections.
#[derive(Debug, Clone)]
pub struct HttpHandler {
    url: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Checks a `--http-url`: an absolute `http://` URL with a host.
pub fn parse_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("--http-url {url:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "--http-url {url:?}: only http:// is supported (the handler is meant for a sidecar or a service inside the cluster)"
            ));
        }
        _ => {
            return Err(format!(
                "--http-url {url:?} must be an absolute http:// URL, for example http://127.0.0.1:9000/jobs"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("--http-url {url:?} has no host"));
    }
    Ok(uri)
}

impl HttpHandler {
    /// A handler posting to `url` (see [`parse_url`]).
    pub fn new(url: Uri) -> Self {
        let mut connector = HttpConnector::new();
        // Jobs are small requests answered one at a time per connection:
        // Nagle's algorithm would only add latency.
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Self { url, client }
    }

    /// The URL jobs are posted to.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    async fn post(&self, job: &Job) -> Outcome {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ATTEMPT_HEADER, job.attempt());
        if let Ok(id) = HeaderValue::from_str(job.id()) {
            request = request.header(JOB_ID_HEADER, id);
        }
        if let Some(traceparent) = job.attempt_trace() {
            request = request.header("traceparent", traceparent);
        }
        let request = match request.body(Full::new(Bytes::from_owner(job.json_line()))) {
            Ok(r) => r,
            Err(e) => return Outcome::permanent(format!("cannot build the request: {e}")),
        };
        let response = match self.client.request(request).await {
            Ok(r) => r,
            // Refused, reset, closed before the answer: the receiver may be
            // starting or restarting.
            Err(e) => return Outcome::retry(format!("POST {}: {}", self.url, chain(&e))),
        };
        let status = response.status();
        // Reading the body to its end lets the connection be reused.
        let body = read_body(response.into_body()).await;
        classify(status, &body)
    }
}

impl Handler for HttpHandler {
    fn handle<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(self.post(job))
    }
}

/// The outcome of an answer with `status` and `body`.
pub fn classify(status: StatusCode, body: &[u8]) -> Outcome {
    if status.is_success() {
        // A body that is JSON is what the job returned.
        let json = std::str::from_utf8(body.trim_ascii())
            .ok()
            .filter(|text| !text.is_empty())
            .filter(|text| serde_json::from_str::<&serde_json::value::RawValue>(text).is_ok());
        return json.map_or(Outcome::Done, |text| Outcome::Returned(text.to_string()));
    }
    // Any bytes at all: what is not UTF-8 shows escaped (`\xff`), not as
    // replacement characters that would hide what the receiver sent.
    let excerpt = workerpool_queue::text::escaped(body.trim_ascii(), ERROR_BODY_CHARS);
    let error = if excerpt.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {excerpt}")
    };
    let permanent = status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS;
    if permanent {
        Outcome::permanent(error)
    } else {
        Outcome::retry(error)
    }
}

/// Up to [`MAX_BODY_BYTES`] of the body; a read error ends it early (the
/// status already decided the outcome).
async fn read_body(mut body: Incoming) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
            if out.len() > MAX_BODY_BYTES {
                break;
            }
        }
    }
    out
}

/// An error and its causes on one line: hyper's top-level messages alone
/// ("client error (Connect)") do not say what went wrong.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_map_to_done_permanent_and_retry() {
        for (code, expected) in [
            (200, Some(None)),
            (204, Some(None)),
            (400, Some(Some(false))),
            (404, Some(Some(false))),
            (422, Some(Some(false))),
            (408, Some(Some(true))),
            (429, Some(Some(true))),
            (500, Some(Some(true))),
            (503, Some(Some(true))),
            (302, Some(Some(true))),
        ] {
            let status = StatusCode::from_u16(code).expect("valid code");
            let outcome = classify(status, b"details");
            let got = match &outcome {
                Outcome::Done | Outcome::Returned(_) | Outcome::ResultNotKept(_) => Some(None),
                Outcome::Failed { retry, .. } => Some(Some(*retry)),
                Outcome::NotRun { .. } => None,
            };
            assert_eq!(got, expected, "{code}: {outcome:?}");
        }
    }

    #[test]
    fn the_error_carries_the_status_and_the_start_of_the_body() {
        let long = "x".repeat(1000);
        match classify(StatusCode::UNPROCESSABLE_ENTITY, long.as_bytes()) {
            Outcome::Failed { error, .. } => {
                assert!(
                    error.starts_with("HTTP 422 Unprocessable Entity: xxx"),
                    "{error}"
                );
                assert!(error.chars().count() < 260, "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY, b""),
            Outcome::retry("HTTP 502 Bad Gateway")
        );
    }

    #[test]
    fn a_body_that_is_not_utf8_shows_its_bytes_escaped() {
        assert_eq!(
            classify(StatusCode::BAD_REQUEST, b"  bad \xff\xfe input\n"),
            Outcome::permanent("HTTP 400 Bad Request: bad \\xff\\xfe input")
        );
    }

    #[test]
    fn only_absolute_http_urls_with_a_host_are_accepted() {
        assert!(parse_url("http://127.0.0.1:9000/jobs").is_ok());
        for bad in [
            "https://x/jobs",
            "/jobs",
            "127.0.0.1:9000",
            "ftp://x/",
            "not a url",
        ] {
            let e = parse_url(bad).expect_err(bad);
            assert!(e.contains("--http-url"), "{e}");
        }
    }

    #[test]
    fn a_json_body_of_a_success_is_the_jobs_result_and_any_other_body_is_not() {
        assert_eq!(
            classify(StatusCode::OK, b" {\"url\": \"/out/1.mp4\"}\n"),
            Outcome::Returned(r#"{"url": "/out/1.mp4"}"#.into())
        );
        assert_eq!(
            classify(StatusCode::OK, b"42"),
            Outcome::Returned("42".into())
        );
        for body in [&b""[..], b"OK", b"<html></html>", b"\xff{}"] {
            assert_eq!(classify(StatusCode::NO_CONTENT, body), Outcome::Done);
        }
    }
}
