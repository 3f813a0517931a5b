//! The metrics endpoint under a team's scrape flood: the operator's scrapes render in
//! slots of their own, so every one of them is answered while a team floods with its
//! token (the team's own scrapes past its bound are answered 503).

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;

/// The status code of one scrape with `token`.
fn scrape_status(addr: &str, token: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(
        format!("GET /metrics HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_scrape_flood_never_turns_the_operators_scrapes_away() {
    // Bounded: 24 team scrapers of 40 scrapes each, against 60 of the operator's.
    const FLOODERS: usize = 24;
    const EACH: usize = 40;
    const OPERATOR: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &["--admin-token", ADMIN, "--metrics-listen", "127.0.0.1:0"],
    );
    let mut admin = agent.admin().await;
    let (_team, team_token) = admin.tenant("team-a").await;
    let addr = metrics_addr(&agent);
    let operator_token = std::fs::read_to_string(agent.data_dir.join("metrics.token"))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        scrape_status(&addr, &team_token),
        200,
        "the team's own view"
    );

    let busy = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..FLOODERS)
        .map(|_| {
            let (addr, token, busy) = (addr.clone(), team_token.clone(), busy.clone());
            std::thread::spawn(move || {
                for _ in 0..EACH {
                    match scrape_status(&addr, &token) {
                        200 => {}
                        503 => {
                            busy.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("a team scrape answered {other}"),
                    }
                }
            })
        })
        .collect();
    let operator = tokio::task::spawn_blocking(move || {
        (0..OPERATOR)
            .map(|_| scrape_status(&addr, &operator_token))
            .filter(|&c| c != 200)
            .count()
    })
    .await
    .unwrap();
    for f in flood {
        f.join().unwrap();
    }
    eprintln!(
        "team scrapes answered 503: {} of {}; operator scrapes not answered 200: {operator} of {OPERATOR}",
        busy.load(Ordering::Relaxed),
        FLOODERS * EACH
    );
    assert_eq!(operator, 0, "every operator scrape is served");
}
