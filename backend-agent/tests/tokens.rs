//! Tokens a platform can live with (issue 30), against the real `serve`: a tenant's token
//! rotated in place with an overlap (the clock moved by its file), read tokens that plan
//! but never change, revocation of one token leaving another, expiry, the admin token's
//! rotation surviving a restart, the audit log (a team's own only), and event cursors
//! that say nothing of other teams.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// A serve whose clock is the file's: the test moves time by writing it.
struct Clocked {
    agent: Agent,
    clock: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Clocked {
    fn start() -> Clocked {
        let dir = tempfile::tempdir().unwrap();
        let clock = dir.path().join("clock");
        std::fs::write(&clock, now().to_string()).unwrap();
        let agent = Agent::start_with(
            &dir.path().join("data"),
            &[
                "--admin-token",
                ADMIN,
                "--clock-file",
                clock.to_str().unwrap(),
            ],
        );
        Clocked {
            agent,
            clock,
            _dir: dir,
        }
    }

    fn advance(&self, seconds: i64) {
        let t: i64 = std::fs::read_to_string(&self.clock)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::write(&self.clock, (t + seconds).to_string()).unwrap();
    }
}

async fn works(agent: &Agent, token: &str) -> Result<Tenant, tonic::Status> {
    let mut c = agent.clients(token).await;
    c.tenants
        .get_tenant(GetTenantRequest::default())
        .await
        .map(|r| r.into_inner())
}

fn rotate(name: &str, overlap: i64, request_id: &str) -> RotateTokenRequest {
    RotateTokenRequest {
        tenant_id: String::new(),
        name: name.into(),
        overlap_seconds: Some(overlap),
        request_id: request_id.into(),
    }
}

#[tokio::test]
async fn a_rotated_token_works_for_its_overlap_then_is_refused_as_rotated() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (team, old) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 8, 0).await;
    let cluster = admin
        .create_pool_cluster(&team.id, "train", "H100-80GB", 1)
        .await;

    // The team rotates its own token, with a two-minute overlap.
    let mut own = s.agent.clients(&old).await;
    let issued = own
        .access
        .rotate_token(rotate("default", 120, "r1"))
        .await
        .unwrap()
        .into_inner();
    let new = issued.secret.clone();
    assert!(new.starts_with("gft_") && new != old);
    assert_eq!(issued.token.unwrap().scope, "write");
    // A retry of the same rotation re-issues its secret; it does not rotate again.
    let again = own
        .access
        .rotate_token(rotate("default", 120, "r1"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(again.secret, new);
    let new = again.secret;

    s.advance(60);
    assert_eq!(works(&s.agent, &old).await.unwrap().id, team.id);
    assert_eq!(works(&s.agent, &new).await.unwrap().id, team.id);
    let listed = own
        .access
        .list_tokens(ListTokensRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let states: Vec<&str> = listed.iter().map(|t| t.state.as_str()).collect();
    assert_eq!(states, vec!["retiring", "active"], "{listed:?}");

    s.advance(61);
    let refused = works(&s.agent, &old).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused
            .message()
            .contains("token 'default' of tenant 'team-a' was rotated at")
            && refused.message().contains("use the new token"),
        "{refused:?}"
    );
    // The team's things are untouched, and the new token reaches them.
    let mut fresh = s.agent.clients(&new).await;
    let c = fresh
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: cluster.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((c.status.as_str(), c.node_count), ("running", 1));
    let quotas = fresh
        .quotas
        .list_gpu_quotas(ListGpuQuotasRequest::default())
        .await
        .unwrap()
        .into_inner()
        .quotas;
    assert_eq!(quotas.len(), 1);
    // Out of bounds overlaps are refused by name.
    let too_long = fresh
        .access
        .rotate_token(rotate("default", 8 * 24 * 3600, "r2"))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    assert!(
        too_long.message().starts_with("overlap_seconds:"),
        "{too_long:?}"
    );
}

#[tokio::test]
async fn a_read_token_plans_and_reads_but_changes_nothing() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (team, write) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 16, 0).await;
    let cluster = admin
        .create_pool_cluster(&team.id, "train", "H100-80GB", 1)
        .await;
    let mut own = s.agent.clients(&write).await;
    let read = own
        .access
        .create_token(CreateTokenRequest {
            name: "ci-plan".into(),
            scope: "read".into(),
            request_id: "t1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret;

    let mut ci = s.agent.clients(&read).await;
    // Reads and dry runs answer.
    ci.clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap();
    let dry = ci
        .clusters
        .update_tenant_cluster(UpdateTenantClusterRequest {
            id: cluster.id.clone(),
            node_count: 2,
            validate_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.node_count, 2);
    // A change is refused naming the scope, and changes nothing.
    for refused in [
        ci.clusters
            .update_tenant_cluster(UpdateTenantClusterRequest {
                id: cluster.id.clone(),
                node_count: 2,
                ..Default::default()
            })
            .await
            .unwrap_err(),
        ci.clusters
            .delete_tenant_cluster(DeleteTenantClusterRequest {
                id: cluster.id.clone(),
            })
            .await
            .unwrap_err(),
        ci.access
            .create_token(CreateTokenRequest {
                name: "escalate".into(),
                scope: "write".into(),
                request_id: "t2".into(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(refused.code(), Code::PermissionDenied);
        assert!(
            refused.message().contains("token 'ci-plan' has scope read"),
            "{refused:?}"
        );
    }
    let c = admin.get_cluster(&cluster.id).await;
    assert_eq!((c.node_count, c.status.as_str()), (1, "running"));
}

#[tokio::test]
async fn revoking_one_token_leaves_the_others_and_expired_tokens_say_so() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (team, write) = admin.tenant("team-a").await;
    let issue = |name: &'static str, expires: Option<i64>| {
        let mut admin = admin.access.clone();
        let tenant_id = team.id.clone();
        async move {
            admin
                .create_token(CreateTokenRequest {
                    tenant_id,
                    name: name.into(),
                    scope: "read".into(),
                    expires_at: expires.and_then(ts),
                    request_id: format!("issue-{name}"),
                    validate_only: false,
                })
                .await
                .unwrap()
                .into_inner()
                .secret
        }
    };
    let one = issue("one", None).await;
    let two = issue("two", None).await;
    let t0: i64 = std::fs::read_to_string(&s.clock).unwrap().parse().unwrap();
    let short = issue("short", Some(t0 + 30)).await;

    let mut own = s.agent.clients(&write).await;
    let revoked = own
        .access
        .revoke_token(RevokeTokenRequest {
            tenant_id: String::new(),
            name: "one".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.state, "revoked");
    let refused = works(&s.agent, &one).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused
        .message()
        .contains("token 'one' of tenant 'team-a' was revoked"));
    assert_eq!(works(&s.agent, &two).await.unwrap().id, team.id);
    assert_eq!(works(&s.agent, &write).await.unwrap().id, team.id);

    assert!(works(&s.agent, &short).await.is_ok());
    s.advance(31);
    let expired = works(&s.agent, &short).await.unwrap_err();
    assert!(expired
        .message()
        .contains("token 'short' of tenant 'team-a' expired at"));
    // A name in use is refused; so is a past expiry, by field.
    let taken = admin
        .access
        .create_token(CreateTokenRequest {
            tenant_id: team.id.clone(),
            name: "two".into(),
            scope: "read".into(),
            request_id: "x1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    let past = admin
        .access
        .create_token(CreateTokenRequest {
            tenant_id: team.id.clone(),
            name: "late".into(),
            scope: "read".into(),
            expires_at: ts(t0),
            request_id: "x2".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(past.message().starts_with("expires_at:"), "{past:?}");
}

#[tokio::test]
async fn the_admin_token_rotates_into_its_file_and_admin_read_tokens_only_read() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // No --admin-token: serve makes and reads <data-dir>/admin.token.
    let agent = Agent::start_with(&data, &[]);
    let first = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let mut admin = agent.clients(&first).await;
    let dashboard = admin
        .access
        .create_token(CreateTokenRequest {
            name: "dashboard".into(),
            scope: "read".into(),
            request_id: "d1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret;
    let mut reader = agent.clients(&dashboard).await;
    reader
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap();
    let refused = reader
        .tenants
        .create_tenant(CreateTenantRequest {
            name: "nope".into(),
            request_id: "n1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let rotated = admin
        .access
        .rotate_token(rotate("admin", 0, "a1"))
        .await
        .unwrap()
        .into_inner()
        .secret;
    assert!(rotated.starts_with("gfa_"));
    let on_disk = std::fs::read_to_string(data.join("admin.token")).unwrap();
    assert_eq!(on_disk.trim(), rotated);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.join("admin.token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let old = agent
        .clients(&first)
        .await
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap_err();
    assert!(
        old.message().contains("token 'admin' was rotated"),
        "{old:?}"
    );
    drop((admin, reader));
    agent.stop();
    // The next start reads the new one; the old one stays refused.
    let agent = Agent::start_with(&data, &[]);
    let mut admin = agent.clients(&rotated).await;
    admin
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap();
    assert_eq!(
        agent
            .clients(&first)
            .await
            .tenants
            .list_tenants(ListTenantsRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );
    let revoke_admin = admin
        .access
        .revoke_token(RevokeTokenRequest {
            tenant_id: String::new(),
            name: "admin".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(revoke_admin.code(), Code::InvalidArgument);
}

/// Every audit entry the client may read, once `done` holds for them (entries are
/// written by a background writer: wait on the condition, bounded).
async fn audit_until(
    c: &mut Clients,
    tenant_id: &str,
    done: impl Fn(&[AuditEntry]) -> bool,
) -> Vec<AuditEntry> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let entries = c
            .access
            .list_audit_entries(ListAuditEntriesRequest {
                tenant_id: tenant_id.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .entries;
        if done(&entries) {
            return entries;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "audit log never held what was expected: {entries:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_audit_log_records_changes_and_refusals_and_each_team_sees_its_own() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (a, a_token) = admin.tenant("team-a").await;
    let (b, b_token) = admin.tenant("team-b").await;
    for t in [&a, &b] {
        admin.quota(&t.id, "H100-80GB", 8, 0).await;
    }
    let mut ca = s.agent.clients(&a_token).await;
    let mut cb = s.agent.clients(&b_token).await;
    // B's change, then A's: a change, a read (not recorded), a refusal.
    cb.clusters
        .create_tenant_cluster(Clients::cluster("", "b-secret", "H100-80GB", 1))
        .await
        .unwrap();
    let a_cluster = ca
        .clusters
        .create_tenant_cluster(Clients::cluster("", "a-train", "H100-80GB", 1))
        .await
        .unwrap()
        .into_inner();
    ca.clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap();
    ca.tenants
        .delete_tenant(DeleteTenantRequest {
            id: a.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let mut stranger = s.agent.clients("gft_not-a-token").await;
    stranger
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap_err();

    // The admin's quota for A is in A's view too, first.
    let own = audit_until(&mut ca, "", |e| e.len() >= 3).await;
    let rows: Vec<(i64, &str, &str, &str)> = own
        .iter()
        .map(|e| {
            (
                e.seq,
                e.method.as_str(),
                e.token_name.as_str(),
                e.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                1,
                "gpufleet.v1.GpuQuotaService/CreateGpuQuota",
                "admin",
                "OK"
            ),
            (
                2,
                "gpufleet.v1.TenantClusterService/CreateTenantCluster",
                "default",
                "OK"
            ),
            (
                3,
                "gpufleet.v1.TenantService/DeleteTenant",
                "default",
                "PERMISSION_DENIED"
            ),
        ],
        "{own:#?}"
    );
    assert!(own[0].by_admin && !own[1].by_admin);
    assert!(own[1].object.ends_with("/a-train") && own[2].object == a.id);
    assert!(own.iter().all(|e| e.tenant_id == a.id));
    let text = format!("{own:?}");
    assert!(!text.contains("b-secret") && !text.contains(&b.id));
    // A cannot ask for B's.
    let refused = ca
        .access
        .list_audit_entries(ListAuditEntriesRequest {
            tenant_id: b.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    // The admin sees every entry, the unknown caller's refusal too, never a secret.
    let all = audit_until(&mut admin, "", |e| {
        e.iter().any(|e| e.outcome == "UNAUTHENTICATED")
    })
    .await;
    assert!(all.iter().any(|e| e.tenant_id == b.id));
    assert!(all.iter().any(|e| e.token_name == "admin"));
    let all_text = format!("{all:?}");
    for secret in [a_token.as_str(), b_token.as_str(), ADMIN] {
        assert!(!all_text.contains(secret));
    }
    // A's event cursor counts only A's events: B's allocation came first.
    let events = ca
        .fleet
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .events;
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.object_id == a_cluster.id));
    let admins = admin
        .fleet
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .events;
    assert!(admins.len() > events.len());
}

#[tokio::test]
async fn another_teams_tokens_are_out_of_reach_and_look_like_no_tenant() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (a, a_token) = admin.tenant("team-a").await;
    let (_, b_token) = admin.tenant("team-b").await;
    let mut b = s.agent.clients(&b_token).await;
    const NOWHERE: &str = "00000000-0000-4000-8000-000000000000";
    // Each call on A's tokens answers as one naming a tenant that does not exist.
    for tenant in [a.id.as_str(), "team-a"] {
        let mut answers = Vec::new();
        for id in [tenant, NOWHERE] {
            let calls = [
                b.access
                    .get_token(GetTokenRequest {
                        tenant_id: id.into(),
                        name: "default".into(),
                    })
                    .await
                    .map(|_| ()),
                b.access
                    .list_tokens(ListTokensRequest {
                        tenant_id: id.into(),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
                b.access
                    .create_token(CreateTokenRequest {
                        tenant_id: id.into(),
                        name: "mine-now".into(),
                        scope: "write".into(),
                        request_id: format!("c-{id}"),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
                b.access
                    .rotate_token(RotateTokenRequest {
                        tenant_id: id.into(),
                        name: "default".into(),
                        overlap_seconds: Some(0),
                        request_id: format!("r-{id}"),
                    })
                    .await
                    .map(|_| ()),
                b.access
                    .revoke_token(RevokeTokenRequest {
                        tenant_id: id.into(),
                        name: "default".into(),
                    })
                    .await
                    .map(|_| ()),
                b.access
                    .list_audit_entries(ListAuditEntriesRequest {
                        tenant_id: id.into(),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
            ];
            answers.push(
                calls
                    .into_iter()
                    .map(|r| {
                        let s = r.unwrap_err();
                        (s.code(), s.message().replace(id, "<tenant>"))
                    })
                    .collect::<Vec<_>>(),
            );
        }
        assert!(
            answers[0].iter().all(|(c, _)| *c == Code::NotFound),
            "{answers:?}"
        );
        assert_eq!(answers[0], answers[1]);
    }
    // A's token still works, and B made no token.
    assert_eq!(works(&s.agent, &a_token).await.unwrap().id, a.id);
    let a_tokens = admin
        .access
        .list_tokens(ListTokensRequest {
            tenant_id: a.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(a_tokens.len(), 1);
    assert_eq!(
        (a_tokens[0].name.as_str(), a_tokens[0].state.as_str()),
        ("default", "active")
    );
}

/// `gpufleet-agent ARGS` with the token in GPUFLEET_TOKEN (never on the command line):
/// its stdout, or a failure with its stderr.
fn cli(agent: &Agent, token: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(args)
        .env("GPUFLEET_ENDPOINT", &agent.endpoint)
        .env("GPUFLEET_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpufleet-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_team_manages_its_tokens_and_reads_its_audit_log_from_the_cli() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (team, write) = admin.tenant("team-a").await;
    // A new secret is alone on stdout, for a redirect into a file.
    let read = cli(
        &s.agent,
        &write,
        &[
            "token",
            "create",
            "ci-plan",
            "--scope",
            "read",
            "--expires-in",
            "24h",
        ],
    );
    let read = read.trim();
    assert!(read.starts_with("gft_") && !read.contains(char::is_whitespace));
    assert_eq!(works(&s.agent, read).await.unwrap().id, team.id);
    let rotated = cli(
        &s.agent,
        &write,
        &["token", "rotate", "default", "--overlap", "0s"],
    );
    let rotated = rotated.trim();
    assert_eq!(works(&s.agent, rotated).await.unwrap().id, team.id);
    assert!(works(&s.agent, &write).await.is_err());
    let listed = cli(&s.agent, rotated, &["token", "list"]);
    let rows: Vec<Vec<&str>> = listed
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["ci-plan", "read", "active"],
            vec!["default", "write", "rotated"],
            vec!["default", "write", "active"],
        ],
        "{listed}"
    );
    cli(&s.agent, rotated, &["token", "revoke", "ci-plan"]);
    assert!(works(&s.agent, read).await.is_err());
    // The audit log, oldest first, with each token's name.
    let audit = |text: &str| -> Vec<String> {
        text.lines()
            .skip(1)
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                format!("{} {} {}", cells[3], cells[5], cells[cells.len() - 2])
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let lines = audit(&cli(&s.agent, rotated, &["audit"]));
        if lines.len() >= 5 {
            assert_eq!(
                lines,
                vec![
                    "default AccessService/CreateToken OK",
                    "default AccessService/RotateToken OK",
                    // Refusals of its rotated and revoked secrets are the team's entries
                    // too (their messages end "use the new token", "ask for a new one").
                    "default TenantService/GetTenant new",
                    "default AccessService/RevokeToken OK",
                    "ci-plan TenantService/GetTenant new",
                ]
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "audit: {lines:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_token_expiry_past_ten_years_is_refused_naming_the_attribute_and_the_longest() {
    let s = Clocked::start();
    let mut admin = s.agent.admin().await;
    let (_team, token) = admin.tenant("team-a").await;
    let mut team = s.agent.clients(&token).await;
    let create = |name: &str, seconds: i64| CreateTokenRequest {
        name: name.into(),
        scope: "read".into(),
        request_id: format!("create-{name}"),
        expires_at: ts(seconds),
        ..Default::default()
    };
    // 2^62 s from now, as the probe gave it, and one second past ten years.
    for (name, at) in [
        ("huge", now().saturating_add(1 << 62)),
        ("eleven", now() + 10 * 366 * 24 * 3600 + 3600),
    ] {
        let refused = team
            .access
            .create_token(create(name, at))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().starts_with("expires_at: ")
                && refused.message().contains("more than 10 years"),
            "{refused:?}"
        );
    }
    let nine = now() + 9 * 365 * 24 * 3600;
    let issued = team
        .access
        .create_token(create("nine", nine))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(issued.token.unwrap().expires_at.unwrap().seconds, nine);
}
