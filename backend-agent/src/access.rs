//! `token ...` and `audit`: a tenant's tokens (or the admin's) and the audit log. A new
//! secret is printed alone on stdout, so `gpufleet-agent token create ci --scope read >
//! ci.token` keeps it out of the terminal's history; what it is goes to stderr.

use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{self, access_service_client::AccessServiceClient};
use gpufleet_proto::BearerAuth;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::cli::{
    AuditArgs, ClientArgs, ListArgs, TokenCreateArgs, TokenNameArgs, TokenRotateArgs,
};
use crate::client::{channel, status, table};
use crate::lists::{all_rows, cell, rfc3339};

type Client = AccessServiceClient<InterceptedService<Channel, BearerAuth>>;

async fn client(args: &ClientArgs) -> anyhow::Result<Client> {
    let (ch, auth) = channel(args).await?;
    Ok(
        AccessServiceClient::with_interceptor(ch, auth)
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// A request id for one invocation (a command is not retried with the same one).
fn request_id() -> String {
    gpufleet_control::auth::new_token("cli_")
}

fn issued(what: &str, t: v1::IssuedToken) {
    let token = t.token.unwrap_or_default();
    eprintln!(
        "{what} token '{}' (scope {}, {}); its secret, shown only now, is on stdout",
        token.name,
        token.scope,
        match token.expires_at {
            Some(_) => format!("expires {}", rfc3339(token.expires_at)),
            None => "does not expire".into(),
        }
    );
    println!("{}", t.secret);
}

pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let c = client(&args.client).await?;
    let tenant_id = args.tenant.unwrap_or_default();
    let rows = all_rows(|page_token| {
        let (mut c, tenant_id) = (c.clone(), tenant_id.clone());
        async move {
            let page = c
                .list_tokens(v1::ListTokensRequest {
                    tenant_id,
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .tokens
                .into_iter()
                .map(|t| {
                    let until = match t.state.as_str() {
                        "retiring" | "rotated" => rfc3339(t.retire_at),
                        "revoked" => rfc3339(t.revoked_at),
                        _ => rfc3339(t.expires_at),
                    };
                    vec![t.name, t.scope, t.state, rfc3339(t.created_at), until]
                })
                .collect();
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
    print!(
        "{}",
        table(&["NAME", "SCOPE", "STATE", "CREATED", "UNTIL"], &rows)
    );
    Ok(())
}

pub async fn create(args: TokenCreateArgs) -> anyhow::Result<()> {
    let TokenCreateArgs {
        token:
            TokenNameArgs {
                name,
                tenant,
                client: ca,
            },
        scope,
        expires_in,
    } = args;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let expires_at = expires_in
        .map(|d| gpufleet_proto::timestamp::from_unix(now.saturating_add(d.as_secs() as i64)));
    let t = client(&ca)
        .await?
        .create_token(v1::CreateTokenRequest {
            tenant_id: tenant.unwrap_or_default(),
            name,
            scope,
            expires_at,
            request_id: request_id(),
            validate_only: false,
        })
        .await
        .map_err(status)?
        .into_inner();
    issued("issued", t);
    Ok(())
}

pub async fn rotate(args: TokenRotateArgs) -> anyhow::Result<()> {
    let t = client(&args.token.client)
        .await?
        .rotate_token(v1::RotateTokenRequest {
            tenant_id: args.token.tenant.unwrap_or_default(),
            name: args.token.name,
            overlap_seconds: Some(args.overlap.as_secs() as i64),
            request_id: request_id(),
        })
        .await
        .map_err(status)?
        .into_inner();
    eprintln!(
        "the old secret works until {}",
        rfc3339(t.token.as_ref().and_then(|t| t.created_at).map(|c| {
            gpufleet_proto::timestamp::from_unix(c.seconds + args.overlap.as_secs() as i64)
        }))
    );
    issued("rotated", t);
    Ok(())
}

pub async fn revoke(args: TokenNameArgs) -> anyhow::Result<()> {
    let t = client(&args.client)
        .await?
        .revoke_token(v1::RevokeTokenRequest {
            tenant_id: args.tenant.unwrap_or_default(),
            name: args.name,
        })
        .await
        .map_err(status)?
        .into_inner();
    println!("token '{}' revoked at {}", t.name, rfc3339(t.revoked_at));
    Ok(())
}

pub async fn print_audit(args: AuditArgs) -> anyhow::Result<()> {
    if args.verify {
        return verify_audit(args.list.client.data_dir).await;
    }
    let args = args.list;
    let c = client(&args.client).await?;
    let tenant_id = args.tenant.unwrap_or_default();
    let rows = all_rows(|page_token| {
        let (mut c, tenant_id) = (c.clone(), tenant_id.clone());
        async move {
            let page = c
                .list_audit_entries(v1::ListAuditEntriesRequest {
                    tenant_id,
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            let rows = page
                .entries
                .into_iter()
                .map(|e| {
                    let token = match (e.token_name.as_str(), e.by_admin) {
                        ("", _) => "-".to_string(),
                        // An admin-scoped token's name could be a team's token's.
                        (name, true) if name != gpufleet_control::auth::ADMIN_TOKEN_NAME => {
                            format!("admin/{name} ({})", e.token_scope)
                        }
                        (name, _) => format!("{name} ({})", e.token_scope),
                    };
                    vec![
                        e.seq.to_string(),
                        rfc3339(e.time),
                        cell(e.tenant_id),
                        token,
                        e.method.trim_start_matches("gpufleet.v1.").to_string(),
                        cell(e.object),
                        e.outcome,
                        cell(e.message),
                    ]
                })
                .collect();
            Ok((rows, page.next_page_token))
        }
    })
    .await?;
    print!(
        "{}",
        table(
            &["SEQ", "TIME", "TENANT", "TOKEN", "METHOD", "OBJECT", "OUTCOME", "MESSAGE"],
            &rows
        )
    );
    Ok(())
}

/// `audit --verify`: walks the hash chains of the data dir's state.db, read-only; fails
/// naming the first broken entry.
async fn verify_audit(data_dir: std::path::PathBuf) -> anyhow::Result<()> {
    use gpufleet_control::audit::chain;
    let path = data_dir.join("state.db");
    let verified = tokio::task::spawn_blocking(move || chain::verify_file(&path)).await??;
    if let Some(first) = verified.broken.first() {
        for b in &verified.broken[1..] {
            eprintln!("also broken at entry {}: {}", b.seq, b.why);
        }
        anyhow::bail!(
            "the audit log is broken at entry {}: {}",
            first.seq,
            first.why
        );
    }
    let entries: u64 = verified.whole.iter().map(|w| w.entries).sum();
    let copies: u64 = verified.whole.iter().map(|w| w.copies).sum();
    let unchained: u64 = verified.whole.iter().map(|w| w.unchained).sum();
    println!(
        "the audit log is whole: {entries} entries in {} chains{}{}",
        verified.whole.len(),
        // The admin's listing shows each of these calls once, so it lists fewer.
        if copies > 0 {
            format!(" ({copies} of them teams' copies of the admin's calls on their objects)")
        } else {
            String::new()
        },
        if unchained > 0 {
            format!(" ({unchained} older entries from before the chains, not verified)")
        } else {
            String::new()
        }
    );
    let rows: Vec<Vec<String>> = verified
        .whole
        .iter()
        .map(|w| {
            let r = w.record.as_ref();
            vec![
                cell(chain::label(&w.chain)),
                w.entries.to_string(),
                r.map_or("-".into(), |r| format!("#{}", r.start_chain_seq)),
                r.map_or("-".into(), |r| r.pruned.to_string()),
                r.map_or("-".into(), |r| {
                    format!("#{} (entry {})", r.head_chain_seq, r.head_seq)
                }),
                r.map_or("-".into(), |r| chain::hex(&r.head_hash)),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "CHAIN",
                "ENTRIES",
                "STARTS AT",
                "PRUNED",
                "NEWEST",
                "NEWEST HASH"
            ],
            &rows
        )
    );
    Ok(())
}
