//! The HTTP front. At this stage it serves the health endpoint and answers every other path
//! with a JSON error in the OpenAI error shape; the provider routes arrive with the proxy work.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::arena::Arena;
use crate::memory::Memory;

/// What every connection shares.
#[derive(Debug)]
pub struct State {
    pub memory: Memory,
    /// The arena the scan reads, opened (re-mapped or rebuilt) and caught up at start.
    pub arena: std::sync::RwLock<Arena>,
}

/// Accept connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<State>) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| route(req, Arc::clone(&state)));
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
}

async fn route(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => json(
            StatusCode::OK,
            serde_json::json!({
                "status": "ok",
                "dictionary": state.memory.dictionary.version(),
                "next_row": state.memory.store.next_row().0,
            }),
        ),
        (_, path) => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({
                "error": {
                    "message": format!("no route for {} {path}", req.method()),
                    "type": "not_found_error",
                }
            }),
        ),
    })
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
