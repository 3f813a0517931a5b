//! Bounded inputs and bounded answers, through the raw gRPC API of a real backend process:
//! every out-of-range integer, time and oversized string is refused with the right code
//! naming the field (and quoting at most a short prefix of the value), the backend stays
//! up, list calls page, a cluster's answer stays readable however many nodes it has, and
//! a tenant's open reservations are limited. The harness's clients keep tonic's default
//! 4 MiB receive limit, so every answer they read was within it. One Terraform case: the provider refuses an
//! out-of-range attribute at plan time.

use std::collections::{BTreeSet, HashMap};

use gpufleet_e2e::fixtures::{create_quota, create_reservation, create_tenant, request_id};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::{Backend, Clients, Terraform};
use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::*;
use prost_types::Timestamp;
use tonic::{Code, Status};

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Asserts the refusal's code and that its message starts with `prefix`; messages stay
/// short whatever the request carried.
fn assert_refused<T: std::fmt::Debug>(
    answer: Result<tonic::Response<T>, Status>,
    code: Code,
    prefix: &str,
) {
    let status = answer.expect_err("the call should have been refused");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().starts_with(prefix),
        "{:?} does not start with {prefix:?}",
        status.message()
    );
    assert!(
        status.message().len() < 400,
        "message of {} bytes",
        status.message().len()
    );
}

/// The backend process is up and answers a normal call.
async fn assert_alive(admin: &mut Clients) {
    let types = admin
        .fleet
        .list_gpu_types(ListGpuTypesRequest {})
        .await
        .expect("the backend still answers after a refused call")
        .into_inner()
        .gpu_types;
    assert!(!types.is_empty());
}

fn quota(tenant_id: &str, gpu_type: &str, gpus: i64, burst_gpus: i64) -> CreateGpuQuotaRequest {
    CreateGpuQuotaRequest {
        request_id: request_id(),
        tenant_id: tenant_id.into(),
        gpu_type: gpu_type.into(),
        gpus,
        burst_gpus,
        ..Default::default()
    }
}

fn reservation(tenant_id: &str, start: Timestamp, end: Timestamp) -> CreateReservationRequest {
    CreateReservationRequest {
        request_id: request_id(),
        tenant_id: tenant_id.into(),
        gpu_type: "H100-80GB".into(),
        node_count: 1,
        start_time: Some(start),
        end_time: Some(end),
        ..Default::default()
    }
}

fn cluster(tenant_id: &str, name: &str, node_count: i64) -> CreateTenantClusterRequest {
    CreateTenantClusterRequest {
        request_id: request_id(),
        tenant_id: tenant_id.into(),
        name: name.into(),
        orchestrator: "kubernetes".into(),
        gpu_type: "H100-80GB".into(),
        node_count,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_integers_and_times_are_refused_naming_the_field() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (t, _) = create_tenant(&mut admin, "team").await;

    // A quota of i64::MAX guaranteed plus i64::MAX burst (their sum once read -2).
    assert_refused(
        admin
            .quotas
            .create_gpu_quota(quota(&t.id, "H100-80GB", i64::MAX, i64::MAX))
            .await,
        Code::InvalidArgument,
        &format!("gpus: must be at most 1000000 (got {})", i64::MAX),
    );
    assert_refused(
        admin
            .quotas
            .create_gpu_quota(quota(&t.id, "H100-80GB", 8, i64::MAX))
            .await,
        Code::InvalidArgument,
        "burst_gpus: must be at most 1000000",
    );
    assert_alive(&mut admin).await;
    let q = create_quota(&mut admin, &t.id, "H100-80GB", 16, 0).await;
    assert_refused(
        admin
            .quotas
            .update_gpu_quota(UpdateGpuQuotaRequest {
                id: q.id.clone(),
                gpus: 16,
                burst_gpus: i64::MAX,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "burst_gpus: must be at most 1000000",
    );

    // A reservation held "for ever", and timestamps no library can read back.
    let start = from_unix(now() + 3600);
    assert_refused(
        admin
            .reservations
            .create_reservation(reservation(
                &t.id,
                start,
                Timestamp {
                    seconds: i64::MAX,
                    nanos: 0,
                },
            ))
            .await,
        Code::InvalidArgument,
        "end_time: must be between 2000-01-01T00:00:00Z and 2200-12-31T23:59:59Z",
    );
    for nanos in [-1, 1_000_000_000] {
        assert_refused(
            admin
                .reservations
                .create_reservation(reservation(
                    &t.id,
                    Timestamp {
                        seconds: now() + 3600,
                        nanos,
                    },
                    from_unix(now() + 7200),
                ))
                .await,
            Code::InvalidArgument,
            &format!("start_time: nanos must be 0..=999999999 (got {nanos})"),
        );
    }
    let mut huge = reservation(&t.id, start, from_unix(now() + 7200));
    huge.node_count = i64::MAX;
    assert_refused(
        admin.reservations.create_reservation(huge).await,
        Code::InvalidArgument,
        "node_count: must be at most 10000",
    );
    assert_refused(
        admin
            .fleet
            .get_availability(AvailabilityRequest {
                gpu_type: "H100-80GB".into(),
                start_time: None,
                end_time: Some(Timestamp {
                    seconds: -62_135_596_800,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "end_time: must be between 2000",
    );
    assert_alive(&mut admin).await;
    let r = create_reservation(&mut admin, &t.id, "H100-80GB", 1, 1, 2).await;
    assert_refused(
        admin
            .reservations
            .update_reservation(UpdateReservationRequest {
                id: r.id.clone(),
                end_time: Some(Timestamp {
                    seconds: i64::MAX,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "end_time: must be between",
    );

    // Storage of i64::MAX GiB, and a MIG layout entry of 0 instances.
    let mut big = cluster(&t.id, "big", 1);
    big.storage_gib = i64::MAX;
    assert_refused(
        admin.clusters.create_tenant_cluster(big).await,
        Code::InvalidArgument,
        "storage_gib: must be at most 1048576",
    );
    let mut empty_slice = cluster(&t.id, "mig", 1);
    empty_slice.mig_layout = HashMap::from([("1g.10gb".to_string(), 0)]);
    assert_refused(
        admin.clusters.create_tenant_cluster(empty_slice).await,
        Code::InvalidArgument,
        "mig_layout[\"1g.10gb\"]: must be at least 1 (got 0)",
    );
    let mut many = cluster(&t.id, "many", 1);
    many.mig_layout = HashMap::from([("1g.10gb".to_string(), i32::MAX)]);
    assert_refused(
        admin.clusters.create_tenant_cluster(many).await,
        Code::InvalidArgument,
        "mig_layout[\"1g.10gb\"]: must be at most 64",
    );
    assert_refused(
        admin
            .fleet
            .check_mig_layout(CheckMigLayoutRequest {
                gpu_type: "H100-80GB".into(),
                layout: HashMap::from([("1g.10gb".to_string(), i32::MAX)]),
            })
            .await,
        Code::InvalidArgument,
        "layout[\"1g.10gb\"]: must be at most 64",
    );
    let mut unavailable = cluster(&t.id, "roll", 1);
    unavailable.max_unavailable = i32::MAX;
    assert_refused(
        admin.clusters.create_tenant_cluster(unavailable).await,
        Code::InvalidArgument,
        "max_unavailable: must be at most 1000",
    );

    // Nothing was created by the refused calls, and the process is still up.
    assert_alive(&mut admin).await;
    let inventory = admin.inventory().await;
    assert_eq!(inventory.quotas.len(), 1);
    assert_eq!(inventory.reservations.len(), 1);
    assert!(inventory.clusters.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_for_a_model_the_fleet_does_not_have_is_refused() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (t, _) = create_tenant(&mut admin, "team").await;
    // L40S is in the catalog, but the default fleet has none.
    assert_refused(
        admin
            .quotas
            .create_gpu_quota(quota(&t.id, "L40S", 8, 0))
            .await,
        Code::InvalidArgument,
        "gpu_type: the fleet has no L40S nodes (it has A100-80GB, H100-80GB, H200-141GB)",
    );
    assert_alive(&mut admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_strings_are_refused_with_a_short_quote() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let mega = "x".repeat(1 << 20);
    let tenant = |name: &str| CreateTenantRequest {
        request_id: request_id(),
        name: name.into(),
        ..Default::default()
    };

    let mut big_display = tenant("a");
    big_display.display_name = mega.clone();
    assert_refused(
        admin.tenants.create_tenant(big_display).await,
        Code::InvalidArgument,
        "display_name: must be at most 256 characters (got 1048576): 'xxxx",
    );
    let mut big_label = tenant("b");
    big_label.labels = HashMap::from([("team".to_string(), mega.clone())]);
    assert_refused(
        admin.tenants.create_tenant(big_label).await,
        Code::InvalidArgument,
        "labels['team']: must be at most 256 characters",
    );
    let mut many_labels = tenant("c");
    many_labels.labels = (0..10_000)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    assert_refused(
        admin.tenants.create_tenant(many_labels).await,
        Code::InvalidArgument,
        "labels: at most 64 entries (got 10000)",
    );
    let mut big_request_id = tenant("d");
    big_request_id.request_id = mega.clone();
    assert_refused(
        admin.tenants.create_tenant(big_request_id).await,
        Code::InvalidArgument,
        "request_id: must be at most 128 characters",
    );
    assert_alive(&mut admin).await;

    // A 1 MB id names nothing: NOT_FOUND, quoting a prefix (not RESOURCE_EXHAUSTED from a
    // 1 MB error message).
    assert_refused(
        admin
            .clusters
            .get_tenant_cluster(GetTenantClusterRequest { id: mega.clone() })
            .await,
        Code::NotFound,
        "tenant cluster 'xxxxxxxx",
    );
    assert_refused(
        admin
            .tenants
            .get_tenant(GetTenantRequest { id: mega.clone() })
            .await,
        Code::NotFound,
        "tenant 'xxxx",
    );
    let (t, _) = create_tenant(&mut admin, "team").await;
    let mut by_long_name = quota(&t.id, "H100-80GB", 8, 0);
    by_long_name.tenant_id = mega.clone();
    assert_refused(
        admin.quotas.create_gpu_quota(by_long_name).await,
        Code::NotFound,
        "tenant 'xxxx",
    );
    let mut bad_model = quota(&t.id, &mega, 8, 0);
    bad_model.request_id = request_id();
    assert_refused(
        admin.quotas.create_gpu_quota(bad_model).await,
        Code::InvalidArgument,
        "gpu_type: must be at most 64 characters",
    );
    let mut bad_reservation = cluster(&t.id, "c", 1);
    bad_reservation.reservation_id = mega.clone();
    assert_refused(
        admin.clusters.create_tenant_cluster(bad_reservation).await,
        Code::InvalidArgument,
        "reservation_id: must be at most 128 characters",
    );
    assert_alive(&mut admin).await;
    assert_eq!(admin.inventory().await.tenants.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_trailing_whitespace_is_refused_plainly() {
    let backend = Backend::start();
    let mut spaced = backend
        .clients(&format!("{} ", backend.admin_token()))
        .await;
    let answer = spaced.fleet.list_gpu_types(ListGpuTypesRequest {}).await;
    assert_refused(
        answer,
        Code::Unauthenticated,
        "the bearer token has leading or trailing whitespace",
    );
    let mut huge = backend.clients(&"t".repeat(4096)).await;
    assert_refused(
        huge.fleet.list_gpu_types(ListGpuTypesRequest {}).await,
        Code::Unauthenticated,
        "the bearer token is 4096 characters long",
    );
    assert_alive(&mut backend.admin().await).await;
}

/// Every tenant through ListTenants pages of `page_size`, with how many pages it took.
async fn all_tenants(admin: &mut Clients, page_size: i32) -> (Vec<Tenant>, usize) {
    let (mut all, mut pages, mut page_token) = (Vec::new(), 0, String::new());
    loop {
        let page = admin
            .tenants
            .list_tenants(ListTenantsRequest {
                page_size,
                page_token,
            })
            .await
            .expect("every page fits a default client's 4 MiB")
            .into_inner();
        pages += 1;
        // 0 asks for the default page size, 500.
        assert!(
            page.tenants.len()
                <= if page_size == 0 {
                    500
                } else {
                    page_size as usize
                }
        );
        all.extend(page.tenants);
        if page.next_page_token.is_empty() {
            return (all, pages);
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_calls_page_and_every_item_comes_back_once() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    // 200 tenants with the most labels allowed, each as long as allowed: 5 MB in all, more
    // than one answer may hold.
    let labels: HashMap<String, String> = (0..64)
        .map(|i| (format!("{i:0>128}"), "v".repeat(256)))
        .collect();
    let mut names = BTreeSet::new();
    for i in 0..200 {
        let name = format!("team-{i:03}");
        admin
            .tenants
            .create_tenant(CreateTenantRequest {
                request_id: request_id(),
                name: name.clone(),
                display_name: "d".repeat(256),
                labels: labels.clone(),
                validate_only: false,
            })
            .await
            .unwrap_or_else(|s| panic!("CreateTenant {name}: {s}"));
        names.insert(name);
    }
    for size in [1000, 0, 7] {
        let (tenants, pages) = all_tenants(&mut admin, size).await;
        let listed: Vec<String> = tenants.into_iter().map(|t| t.name).collect();
        assert_eq!(listed.len(), names.len(), "page_size {size}");
        assert_eq!(
            listed.iter().cloned().collect::<BTreeSet<_>>(),
            names,
            "page_size {size}"
        );
        assert!(pages > 1, "page_size {size}: one answer of 5 MB");
        if size == 7 {
            assert_eq!(pages, 200usize.div_ceil(7));
        }
    }

    // A token from elsewhere and a page too big are refused by name.
    assert_refused(
        admin
            .tenants
            .list_tenants(ListTenantsRequest {
                page_size: 10,
                page_token: "not-a-token".into(),
            })
            .await,
        Code::InvalidArgument,
        "page_token:",
    );
    assert_refused(
        admin
            .tenants
            .list_tenants(ListTenantsRequest {
                page_size: 1001,
                page_token: String::new(),
            })
            .await,
        Code::InvalidArgument,
        "page_size: must be at most 1000",
    );

    // Reservations, nodes, quotas and clusters page the same way.
    let first = admin.tenants.list_tenants(ListTenantsRequest::default());
    let t = first.await.unwrap().into_inner().tenants.remove(0);
    create_quota(&mut admin, &t.id, "H100-80GB", 8, 0).await;
    create_quota(&mut admin, &t.id, "A100-80GB", 8, 0).await;
    let mut reserved = BTreeSet::new();
    for i in 0..12 {
        let r = create_reservation(&mut admin, &t.id, "H100-80GB", 1, 2 * i + 1, 2 * i + 2).await;
        reserved.insert(r.id);
    }
    let mut seen = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .reservations
            .list_reservations(ListReservationsRequest {
                tenant_id: t.id.clone(),
                page_size: 5,
                page_token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.reservations.len() <= 5);
        seen.extend(page.reservations.into_iter().map(|r| r.id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(seen.len(), 12);
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), reserved);

    let all_nodes = admin.nodes().await;
    let mut paged = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .fleet
            .list_nodes(ListNodesRequest {
                page_size: 3,
                page_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        paged.extend(page.nodes.into_iter().map(|n| n.hostname));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let hostnames: Vec<String> = all_nodes.into_iter().map(|n| n.hostname).collect();
    assert_eq!(paged, hostnames);

    let page = admin
        .quotas
        .list_gpu_quotas(ListGpuQuotasRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.quotas.len(), 1);
    let rest = admin
        .quotas
        .list_gpu_quotas(ListGpuQuotasRequest {
            page_size: 1,
            page_token: page.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.quotas.len(), 1);
    assert!(rest.next_page_token.is_empty());
    assert_ne!(page.quotas[0].id, rest.quotas[0].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_a_limited_number_of_open_reservations() {
    let backend = Backend::start_with_args(&["--max-open-reservations", "3"]);
    let mut admin = backend.admin().await;
    let (a, _) = create_tenant(&mut admin, "team-a").await;
    let (b, _) = create_tenant(&mut admin, "team-b").await;
    create_quota(&mut admin, &a.id, "H100-80GB", 8, 0).await;
    create_quota(&mut admin, &b.id, "H100-80GB", 8, 0).await;
    let hour = |h: i64| from_unix(now() + h * 3600);
    let mut held = Vec::new();
    for i in 0..3 {
        let request = reservation(&a.id, hour(2 * i + 1), hour(2 * i + 2));
        let r = admin
            .reservations
            .create_reservation(request.clone())
            .await
            .unwrap()
            .into_inner();
        held.push((request, r));
    }
    assert_refused(
        admin
            .reservations
            .create_reservation(reservation(&a.id, hour(20), hour(21)))
            .await,
        Code::FailedPrecondition,
        "tenant 'team-a' already holds 3 reservations that have not ended, the limit of open reservations per tenant (3, serve --max-open-reservations)",
    );
    // A retried create still answers with what it created; another tenant is not limited
    // by team-a's reservations.
    let (retry, first) = &held[2];
    let again = admin
        .reservations
        .create_reservation(retry.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.id, first.id);
    admin
        .reservations
        .create_reservation(reservation(&b.id, hour(20), hour(21)))
        .await
        .expect("team-b has none open");
    // One fewer open makes room for one more.
    admin
        .reservations
        .delete_reservation(DeleteReservationRequest {
            id: held[0].1.id.clone(),
        })
        .await
        .unwrap();
    admin
        .reservations
        .create_reservation(reservation(&a.id, hour(20), hour(21)))
        .await
        .expect("room for one after a delete");
}

const NODES: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_many_mig_nodes_reads_back_in_bounded_answers() {
    // An answer lists the first 100 nodes and counts the rest. (1,100 such nodes, whose
    // unbounded answer was 4.5 MB, take minutes to partition; that pages stay under the
    // message limit is shown with big tenants above.)
    let backend = Backend::start_with_fleet(&format!(
        "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = {NODES}\n"
    ));
    let mut admin = backend.admin().await;
    let (t, _) = create_tenant(&mut admin, "big").await;
    let gpus = (NODES * 8) as i64;
    create_quota(&mut admin, &t.id, "H100-80GB", gpus, 0).await;
    let mut request = cluster(&t.id, "wide", NODES as i64);
    request.mig_layout = HashMap::from([("1g.10gb".to_string(), 7)]);
    let created = admin
        .clusters
        .create_tenant_cluster(request)
        .await
        .expect("the create answer fits a default client")
        .into_inner();
    assert_eq!(created.node_count, NODES as i64);
    assert_eq!(created.nodes.len(), 100);
    assert_eq!(created.nodes_omitted as usize, NODES - 100);
    let got = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.nodes, created.nodes);
    let listed = admin
        .clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.clusters.len(), 1);

    // Every node, once, through ListNodes by cluster; each with its 7 slices per GPU.
    let mut hostnames = Vec::new();
    let mut pages = 0;
    let mut page_token = String::new();
    loop {
        let page = admin
            .fleet
            .list_nodes(ListNodesRequest {
                cluster_id: created.id.clone(),
                page_size: 64,
                page_token,
                ..Default::default()
            })
            .await
            .expect("every page fits a default client")
            .into_inner();
        pages += 1;
        for n in &page.nodes {
            assert_eq!(n.cluster_id, created.id);
            assert!(n.gpus.iter().all(|g| g.mig_devices.len() == 7));
        }
        hostnames.extend(page.nodes.into_iter().map(|n| n.hostname));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(pages, NODES.div_ceil(64));
    assert_eq!(hostnames.len(), NODES);
    assert_eq!(hostnames.iter().collect::<BTreeSet<_>>().len(), NODES);
    let shown: Vec<&String> = created.nodes.iter().map(|n| &n.hostname).collect();
    assert_eq!(shown, hostnames.iter().take(100).collect::<Vec<_>>());

    // Terraform sees every node: the provider reads the omitted ones page by page, for the
    // resource (imported here) and for the gpufleet_nodes data source.
    let tf = Terraform::new(&backend, backend.admin_token());
    let config = hcl::config(&[
        hcl::pool_cluster("wide", &hcl::id(&t.id), "wide", "H100-80GB", NODES as i64)
            .expr("mig_layout", "{ \"1g.10gb\" = 7 }"),
        Block::data("gpufleet_nodes", "wide").string("cluster_id", &created.id),
        Block::output("nodes", "length(data.gpufleet_nodes.wide.nodes)"),
    ]);
    tf.write_main(&config);
    tf.init();
    tf.import("gpufleet_tenant_cluster.wide", &created.id);
    let state = tf.resource("gpufleet_tenant_cluster.wide");
    let in_state = state["nodes"].as_array().expect("nodes in state").len();
    assert_eq!(in_state, NODES);
    tf.refresh();
    assert_eq!(tf.outputs()["nodes"], NODES as u64);
}

/// Plans `hcl` and asserts it fails naming each of `needles`, and that nothing reached the
/// backend.
async fn assert_refused_at_plan(backend: &Backend, tf: &Terraform, hcl: &str, needles: &[&str]) {
    tf.write_main(hcl);
    tf.plan_fails().assert_mentions(needles);
    assert!(backend.admin().await.inventory().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_attributes_are_refused_at_plan_time() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main("");
    tf.init();
    let with_tenant = |blocks: &[Block]| {
        let mut all = vec![hcl::tenant("t", "team")];
        all.extend_from_slice(blocks);
        hcl::config(&all)
    };
    let max = i64::MAX.to_string();
    let huge_quota = hcl::quota("q", "gpufleet_tenant.t.name", "H100-80GB", 8)
        .expr("gpus", &max)
        .expr("burst_gpus", &max);
    assert_refused_at_plan(
        &backend,
        &tf,
        &with_tenant(&[huge_quota]),
        &[
            "gpus: must be at most 1000000",
            "burst_gpus: must be at most",
        ],
    )
    .await;
    let long_display = hcl::tenant("t", "team").string("display_name", &"d".repeat(300));
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl::config(&[long_display]),
        &["display_name: must be at most 256 characters (got 300"],
    )
    .await;
    let far = hcl::reservation(
        "r",
        "gpufleet_tenant.t.name",
        "H100-80GB",
        1,
        "2030-01-01T00:00:00Z",
        "2999-01-01T00:00:00Z",
    );
    assert_refused_at_plan(
        &backend,
        &tf,
        &with_tenant(&[far]),
        &["end_time", "2999-01-01T00:00:00Z", "2200-12-31T23:59:59Z"],
    )
    .await;
    let storage = hcl::pool_cluster("c", "gpufleet_tenant.t.name", "c", "H100-80GB", 1)
        .number("storage_gib", 1 << 40);
    assert_refused_at_plan(
        &backend,
        &tf,
        &with_tenant(&[storage]),
        &["storage_gib: must be at most 1048576"],
    )
    .await;
    // A typo'd attribute is Terraform's own error, naming it.
    let typo = hcl::quota("q", "gpufleet_tenant.t.name", "H100-80GB", 8).number("burst_gpu", 1);
    assert_refused_at_plan(&backend, &tf, &with_tenant(&[typo]), &["burst_gpu"]).await;

    // A token with a trailing newline (as file() reads it) is refused before any call.
    let spaced = Terraform::new(&backend, &format!("{}\n", backend.admin_token()));
    spaced.write_main(&hcl::config(&[hcl::tenant("t", "team")]));
    spaced.init();
    spaced
        .plan_fails()
        .assert_mentions(&["token: has leading or trailing whitespace", "trimspace"]);
    assert!(backend.admin().await.inventory().await.is_empty());
}
