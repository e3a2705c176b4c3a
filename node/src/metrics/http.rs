//! The metrics listener: a deliberately tiny HTTP/1.1 server on core 0 that
//! answers `GET /metrics` (Prometheus text format) and `GET /health`; on a
//! controller-only node (no cores), the same on one plain thread
//! (`serve_controller`).
//!
//! One request per connection (`Connection: close`), GET (and HEAD) only, the
//! request head bounded by `REQUEST_HEAD_BYTES_MAX` and `REQUEST_TIMEOUT`, at
//! most `CONNECTIONS_MAX` connections at once (more are closed at accept). A
//! request body is never read. Anything malformed gets 400, other paths 404,
//! other methods 405; nothing a client sends can stop the listener.
//!
//! The socket is bound by `crate::listeners` (no SO_REUSEPORT, so a second node
//! configured with the same address fails to start instead of silently sharing
//! the port and answering half the scrapes).

use std::rc::Rc;
use std::time::Duration;

use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};

use crate::state::CoreState;

/// Bytes of request line and headers read before answering 400.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 << 10;
/// Connections served at once; more are closed as soon as they are accepted.
pub const CONNECTIONS_MAX: usize = 64;
/// Time for a client to send its request head and read the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves until `stop` fires. Runs on core 0.
pub async fn serve(
    core: Rc<CoreState>,
    listener: TcpListener,
    stop: local_channel::LocalReceiver<()>,
) {
    let open = Rc::new(std::cell::Cell::new(0usize));
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            let _ = stop.recv().await;
            None
        })
        .await;
        match accepted {
            None => return,
            Some(Ok(stream)) => {
                if open.get() >= CONNECTIONS_MAX {
                    tracing::debug!("metrics listener: too many connections, closing one");
                    continue;
                }
                open.set(open.get() + 1);
                let (core, open) = (core.clone(), open.clone());
                glommio::spawn_local(async move {
                    futures_lite::future::or(connection(&core, stream), async {
                        glommio::timer::sleep(REQUEST_TIMEOUT).await;
                    })
                    .await;
                    open.set(open.get() - 1);
                })
                .detach();
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// What a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Health,
}

/// A parsed request head, or the status to refuse it with.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    route: Route,
    head_only: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    BadRequest(&'static str),
    NotFound,
    MethodNotAllowed,
    /// `/metrics` without the bearer token `metrics.bearer.token.file` names.
    Unauthorized,
}

/// Parses `METHOD SP target SP HTTP/1.x` and checks the header lines' shape;
/// with a `token`, `/metrics` needs `Authorization: Bearer <token>`.
fn parse_head(
    head: &[u8],
    token: Option<&skiff_security::SharedSecret>,
) -> Result<Parsed, Refusal> {
    let text = std::str::from_utf8(head).map_err(|_| Refusal::BadRequest("not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::BadRequest("malformed request line"));
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(Refusal::BadRequest("unsupported HTTP version"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refusal::BadRequest("malformed method"));
    }
    if !target.starts_with('/') {
        return Err(Refusal::BadRequest("malformed target"));
    }
    let mut bearer = None;
    for line in lines.filter(|l| !l.is_empty()) {
        match line.split_once(':') {
            Some((name, value)) if !name.is_empty() && !name.contains([' ', '\t']) => {
                if name.eq_ignore_ascii_case("authorization") {
                    bearer = value.trim().strip_prefix("Bearer ").map(str::trim);
                }
            }
            _ => return Err(Refusal::BadRequest("malformed header line")),
        }
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let route = match path {
        "/metrics" => Route::Metrics,
        "/health" => Route::Health,
        _ => return Err(Refusal::NotFound),
    };
    if let (Route::Metrics, Some(token)) = (route, token) {
        if !bearer.is_some_and(|b| token.matches(b.as_bytes())) {
            return Err(Refusal::Unauthorized);
        }
    }
    match method {
        "GET" => Ok(Parsed {
            route,
            head_only: false,
        }),
        "HEAD" => Ok(Parsed {
            route,
            head_only: true,
        }),
        _ => Err(Refusal::MethodNotAllowed),
    }
}

/// Reads the request head (up to the blank line). `Ok(None)`: the client closed
/// without sending anything.
async fn read_head(stream: &mut TcpStream) -> Result<Option<Vec<u8>>, Refusal> {
    let mut buf = vec![0u8; REQUEST_HEAD_BYTES_MAX];
    let mut len = 0;
    loop {
        if let Some(end) = find(&buf[..len], b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(Some(buf));
        }
        if len == buf.len() {
            return Err(Refusal::BadRequest("request head too large"));
        }
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|_| Refusal::BadRequest("read failed"))?;
        if n == 0 {
            return if len == 0 {
                Ok(None)
            } else {
                Err(Refusal::BadRequest("incomplete request head"))
            };
        }
        len += n;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn connection(core: &CoreState, mut stream: TcpStream) {
    let (status, content_type, body, head_only) = match read_head(&mut stream).await {
        Ok(None) => return,
        Ok(Some(head)) => match parse_head(&head, core.node.config.metrics_token.as_ref()) {
            Ok(parsed) => {
                let (status, content_type, body) = answer(core, parsed.route).await;
                (status, content_type, body, parsed.head_only)
            }
            Err(refusal) => refuse(refusal),
        },
        Err(refusal) => refuse(refusal),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        response.push_str("Allow: GET, HEAD\r\n");
    }
    if status.starts_with("401") {
        response.push_str("WWW-Authenticate: Bearer\r\n");
    }
    response.push_str("\r\n");
    let mut bytes = response.into_bytes();
    if !head_only {
        bytes.extend_from_slice(body.as_bytes());
    }
    if stream.write_all(&bytes).await.is_err() {
        return;
    }
    let _ = stream.flush().await;
    // Half-close, then drain what the client may still send (a body we never
    // read), briefly: closing with unread bytes would reset the connection and
    // could cut the answer off on the client's side.
    let _ = stream.shutdown(std::net::Shutdown::Write).await;
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < REQUEST_HEAD_BYTES_MAX * 8 {
        let read = futures_lite::future::or(async { stream.read(&mut sink).await.ok() }, async {
            glommio::timer::sleep(Duration::from_millis(200)).await;
            None
        })
        .await;
        match read {
            Some(n) if n > 0 => drained += n,
            _ => break,
        }
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

fn refuse(refusal: Refusal) -> (&'static str, &'static str, String, bool) {
    match refusal {
        Refusal::BadRequest(why) => (
            "400 Bad Request",
            TEXT,
            format!("bad request: {why}\n"),
            false,
        ),
        Refusal::NotFound => (
            "404 Not Found",
            TEXT,
            "not found: try /metrics or /health\n".into(),
            false,
        ),
        Refusal::MethodNotAllowed => (
            "405 Method Not Allowed",
            TEXT,
            "method not allowed: GET only\n".into(),
            false,
        ),
        Refusal::Unauthorized => (
            "401 Unauthorized",
            TEXT,
            "unauthorized: /metrics needs Authorization: Bearer <metrics.bearer.token.file>\n"
                .into(),
            false,
        ),
    }
}

async fn answer(core: &CoreState, route: Route) -> (&'static str, &'static str, String) {
    match route {
        Route::Health => match super::health(core).await {
            Ok(()) => ("200 OK", TEXT, "ok\n".into()),
            Err(reason) => ("503 Service Unavailable", TEXT, format!("{reason}\n")),
        },
        Route::Metrics => match super::gather(core).await {
            Ok(snapshot) => (
                "200 OK",
                super::exposition::CONTENT_TYPE,
                super::exposition::render(&snapshot, core.node.config.node_id),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "metrics scrape failed");
                ("503 Service Unavailable", TEXT, format!("{e}\n"))
            }
        },
    }
}

/// A controller-only node's metrics listener: no shard runtime there, so one
/// plain thread answers the same routes (one connection at a time, each
/// bounded by `REQUEST_TIMEOUT`): `/metrics` with the controller's families,
/// `/health` 200 while the controller runs. Stops when `stop` is set (the
/// caller then connects once to wake the accept).
pub fn serve_controller(
    listener: std::net::TcpListener,
    status: skiff_controller::service::StatusReader,
    token: Option<skiff_security::SharedSecret>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    std::thread::Builder::new()
        .name("skiff-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
                let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
                let mut buf = vec![0u8; REQUEST_HEAD_BYTES_MAX];
                let mut len = 0;
                let head = loop {
                    if let Some(end) = find(&buf[..len], b"\r\n\r\n") {
                        break Ok(buf[..end].to_vec());
                    }
                    if len == buf.len() {
                        break Err(Refusal::BadRequest("request head too large"));
                    }
                    match stream.read(&mut buf[len..]) {
                        Ok(0) | Err(_) if len == 0 => break Err(Refusal::BadRequest("")),
                        Ok(0) | Err(_) => break Err(Refusal::BadRequest("incomplete request head")),
                        Ok(n) => len += n,
                    }
                };
                let (status_line, content_type, body, head_only) = match head.and_then(|h| parse_head(&h, token.as_ref())) {
                    Ok(parsed) => {
                        let (s, t, b) = match parsed.route {
                            Route::Health => ("200 OK", TEXT, "ok: controller\n".to_string()),
                            Route::Metrics => (
                                "200 OK",
                                super::exposition::CONTENT_TYPE,
                                super::exposition::render_controller(&status.status()),
                            ),
                        };
                        (s, t, b, parsed.head_only)
                    }
                    Err(Refusal::BadRequest("")) => continue,
                    Err(refusal) => refuse(refusal),
                };
                let challenge = if status_line.starts_with("401") {
                    "WWW-Authenticate: Bearer\r\n"
                } else {
                    ""
                };
                let mut response = format!(
                    "HTTP/1.1 {status_line}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n{challenge}\r\n",
                    body.len()
                )
                .into_bytes();
                if !head_only {
                    response.extend_from_slice(body.as_bytes());
                }
                let _ = stream.write_all(&response);
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_refusals() {
        let ok = |route, head_only| Ok(Parsed { route, head_only });
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x", None),
            ok(Route::Metrics, false)
        );
        assert_eq!(
            parse_head(b"GET /health?x=1 HTTP/1.0", None),
            ok(Route::Health, false)
        );
        assert_eq!(
            parse_head(b"HEAD /health HTTP/1.1", None),
            ok(Route::Health, true)
        );
        assert_eq!(
            parse_head(b"GET /nope HTTP/1.1", None),
            Err(Refusal::NotFound)
        );
        assert_eq!(
            parse_head(b"POST /metrics HTTP/1.1\r\nContent-Length: 3", None),
            Err(Refusal::MethodNotAllowed)
        );
        for bad in [
            &b"GET /metrics"[..],
            b"GET  /metrics HTTP/1.1",
            b"GET /metrics HTTP/2.0",
            b"get /metrics HTTP/1.1",
            b"GET metrics HTTP/1.1",
            b"GET /metrics HTTP/1.1\r\nno colon here",
            b"\xff\xfe",
            b"",
        ] {
            assert!(
                matches!(parse_head(bad, None), Err(Refusal::BadRequest(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_bearer_token_guards_metrics_not_health() {
        let token = skiff_security::SharedSecret::new(b"a metrics token, 16+ bytes").unwrap();
        let t = Some(&token);
        let metrics = |auth: &str| {
            let head = format!("GET /metrics HTTP/1.1\r\nHost: x{auth}");
            parse_head(head.as_bytes(), t)
        };
        assert_eq!(metrics(""), Err(Refusal::Unauthorized));
        assert_eq!(
            metrics("\r\nAuthorization: Bearer another token, 16+ bytes"),
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            metrics("\r\nAuthorization: Basic YTpi"),
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            metrics("\r\nauthorization:  Bearer a metrics token, 16+ bytes "),
            Ok(Parsed {
                route: Route::Metrics,
                head_only: false
            })
        );
        assert_eq!(
            parse_head(b"GET /health HTTP/1.1", t),
            Ok(Parsed {
                route: Route::Health,
                head_only: false
            })
        );
    }
}
