//! Drives Strata's NBD client alone against a server, as fio's nbd engine drives libnbd, so
//! that `bench/remote.py` can put the two side by side on the same server: `IODEPTH` tasks
//! each keep one request in flight on the client's connection for `SECONDS`.
//!
//! ```text
//! client_bench URI RW BS IODEPTH SECONDS [CA [CERT KEY]]
//!   RW: randread | randwrite | read (sequential, each task taking the next block)
//! ```
//! Prints one line of JSON: `{"ops": N, "bytes": B, "seconds": S}`. One runtime thread by
//! default, as fio's nbd engine runs its job in one thread (`CLIENT_THREADS` to change).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_nbd::client::{Client, ClientOptions, NbdUri};
use strata_nbd::tls::{ClientTls, ClientTlsFiles};

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    RandRead,
    RandWrite,
    SeqRead,
}

fn usage() -> ! {
    eprintln!("usage: client_bench URI randread|randwrite|read BS IODEPTH SECONDS [CA [CERT KEY]]");
    std::process::exit(2)
}

/// xorshift64*: a cheap, well-spread offset sequence per task (no rand dependency here).
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        usage();
    }
    let uri: NbdUri = args[0].parse().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let pattern = match args[1].as_str() {
        "randread" => Pattern::RandRead,
        "randwrite" => Pattern::RandWrite,
        "read" => Pattern::SeqRead,
        _ => usage(),
    };
    let block: u64 = args[2].parse().unwrap_or_else(|_| usage());
    let depth: usize = args[3].parse().unwrap_or_else(|_| usage());
    let seconds: u64 = args[4].parse().unwrap_or_else(|_| usage());
    let tls = args.get(5).map(|ca| {
        let files = ClientTlsFiles {
            ca: ca.into(),
            certificate: args.get(6).map(Into::into),
            key: args.get(7).map(Into::into),
        };
        ClientTls::load(&files, &uri.host()).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        })
    });
    let threads = std::env::var("CLIENT_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let options = ClientOptions {
            timeout: Duration::from_secs(30),
            ..ClientOptions::default()
        };
        let client = Arc::new(
            Client::connect_with(uri, options, tls)
                .await
                .unwrap_or_else(|e| {
                    eprintln!("{e}");
                    std::process::exit(1)
                }),
        );
        let blocks = client.info().size / block;
        let cursor = Arc::new(AtomicU64::new(0));
        let payload = Bytes::from(vec![0x5au8; block as usize]);
        let start = Instant::now();
        let deadline = start + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..depth)
            .map(|task| {
                let (client, cursor, payload) = (client.clone(), cursor.clone(), payload.clone());
                tokio::spawn(async move {
                    let mut state = 0x9e37_79b9_7f4a_7c15 ^ (task as u64 + 1);
                    let mut ops = 0u64;
                    while Instant::now() < deadline {
                        let index = match pattern {
                            Pattern::SeqRead => cursor.fetch_add(1, Ordering::Relaxed) % blocks,
                            _ => next(&mut state) % blocks,
                        };
                        let offset = index * block;
                        let done = match pattern {
                            Pattern::RandWrite => client
                                .write(offset, payload.clone(), false)
                                .await
                                .map(|_| ()),
                            _ => client.read(offset, block as usize).await.map(|_| ()),
                        };
                        done.unwrap_or_else(|e| panic!("request at {offset}: {e}"));
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        let mut ops = 0;
        for task in tasks {
            ops += task.await.expect("a bench task");
        }
        let elapsed = start.elapsed().as_secs_f64();
        println!(
            "{{\"ops\": {ops}, \"bytes\": {}, \"seconds\": {elapsed:.3}}}",
            ops * block
        );
    });
}
