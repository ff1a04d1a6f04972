//! The ceiling for the webhook benchmark: a bare hyper 1 server that reads the whole body and
//! answers 200, with the same runtime shape as `sluice run --threads N`.
//!
//! Run: cargo bench --bench bare_hyper -- --listen 127.0.0.1:18080 [--threads 1] [--exit-after SECS]
//! (Without --listen it exits at once, so a plain `cargo bench` does not hang on it.)

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    std::hint::black_box(body);
    Ok(Response::new(Full::new(Bytes::from_static(
        b"{\"status\":\"ok\"}",
    ))))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(listen) = arg("--listen") else {
        eprintln!(
            "bare_hyper: pass --listen ADDR to run the ceiling server (see benches/webhook.sh)"
        );
        return;
    };
    let addr: SocketAddr = listen.parse().expect("--listen ADDR");
    // --exit-after SECS: a normal exit after SECS, so a profile-guided build's instrumented
    // binary writes its profile (it does at exit, not when killed; docs/benchmarks.md).
    if let Some(secs) = arg("--exit-after") {
        let secs: u64 = secs.parse().expect("--exit-after SECS");
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(secs));
            std::process::exit(0)
        });
    }
    let threads: usize = arg("--threads").map_or(1, |t| t.parse().expect("--threads N"));
    // The same shape as `sluice run --threads N`: one thread is tokio's current-thread
    // scheduler, more the multi-thread one.
    let mut rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let rt = rt.enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        eprintln!("bare_hyper: listening on {addr} with {threads} worker thread(s)");
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service_fn(handle))
                    .await;
            });
        }
    });
}
