//! What each request does, said once per request type: whether it changes anything (a
//! `read` token may only plan and read) and which object it names (for the audit log).
//! Authentication requires it of every request, so a new call cannot forget to say.

use gpufleet_proto::v1;

pub trait Intent {
    /// Whether the call changes anything. A plan-time dry run (`validate_only`) does not.
    fn changes(&self) -> bool;
    /// The object the call names (an id or a name; "" when none), for the audit log.
    fn object(&self) -> String;
    /// The tenant's object the call acts on, if any: an admin's call on it is recorded in
    /// that tenant's audit view too.
    fn owner(&self) -> Owner<'_> {
        Owner::None
    }
}

/// A tenant's object a call acts on, as the request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    None,
    /// The tenant itself, or its tokens (by id or name).
    Tenant(&'a str),
    Quota(&'a str),
    Reservation(&'a str),
    Cluster(&'a str),
}

/// `reads!(Type => |r| object)`: never changes anything.
macro_rules! reads {
    ($($t:ty => |$r:ident| $object:expr;)*) => {$(
        impl Intent for $t {
            fn changes(&self) -> bool {
                false
            }
            fn object(&self) -> String {
                let $r = self;
                $object.to_string()
            }
        }
    )*};
}

/// `changes!(Type => |r| object)`: always a change.
macro_rules! changes {
    ($($t:ty => |$r:ident| $object:expr $(, $owner:ident($of:expr))?;)*) => {$(
        impl Intent for $t {
            fn changes(&self) -> bool {
                true
            }
            fn object(&self) -> String {
                let $r = self;
                $object.to_string()
            }
            $(fn owner(&self) -> Owner<'_> {
                let $r = self;
                Owner::$owner(&$of)
            })?
        }
    )*};
}

/// `changes_unless_dry_run!(Type => |r| object)`: a change unless `validate_only`.
macro_rules! changes_unless_dry_run {
    ($($t:ty => |$r:ident| $object:expr $(, $owner:ident($of:expr))?;)*) => {$(
        impl Intent for $t {
            fn changes(&self) -> bool {
                !self.validate_only
            }
            fn object(&self) -> String {
                let $r = self;
                $object.to_string()
            }
            $(fn owner(&self) -> Owner<'_> {
                let $r = self;
                Owner::$owner(&$of)
            })?
        }
    )*};
}

reads! {
    v1::GetTenantRequest => |r| r.id;
    v1::ListTenantsRequest => |_r| "";
    v1::GetGpuQuotaRequest => |r| r.id;
    v1::ListGpuQuotasRequest => |r| r.tenant_id;
    v1::QuotaUsageRequest => |r| r.tenant_id;
    v1::UsageRequest => |r| r.tenant_id;
    v1::GetReservationRequest => |r| r.id;
    v1::ListReservationsRequest => |r| r.tenant_id;
    v1::ListNodesRequest => |r| r.cluster_id;
    v1::ListGpuTypesRequest => |_r| "";
    v1::AvailabilityRequest => |r| r.gpu_type;
    v1::CheckMigLayoutRequest => |r| r.gpu_type;
    v1::GetMetricsEndpointRequest => |_r| "";
    v1::ListDriverVersionsRequest => |r| r.gpu_type;
    v1::ResolveDriverRequest => |r| r.gpu_type;
    v1::ListEventsRequest => |r| r.object_id;
    v1::ListQuarantineBreakersRequest => |_r| "";
    v1::GetTenantClusterRequest => |r| r.id;
    v1::ListTenantClustersRequest => |r| r.tenant_id;
    v1::GetHealthReportRequest => |r| r.cluster_id;
    v1::GetTokenRequest => |r| token_object(&r.tenant_id, &r.name);
    v1::ListTokensRequest => |r| r.tenant_id;
    v1::ListAuditEntriesRequest => |r| r.tenant_id;
}

changes! {
    v1::UpdateTenantRequest => |r| r.id, Tenant(r.id);
    v1::DeleteTenantRequest => |r| r.id, Tenant(r.id);
    v1::DeleteReservationRequest => |r| r.id, Reservation(r.id);
    v1::ReturnNodeRequest => |r| r.name;
    v1::DrainNodeRequest => |r| r.name;
    v1::ForgetNodeSecretRequest => |r| r.name;
    v1::ResetQuarantineBreakerRequest => |r| r.gpu_type;
    v1::DeleteTenantClusterRequest => |r| r.id, Cluster(r.id);
    // Runs tests on the team's nodes: an action, not a read.
    v1::RunHealthCheckRequest => |r| r.cluster_id, Cluster(r.cluster_id);
    v1::RotateTokenRequest => |r| token_object(&r.tenant_id, &r.name), Tenant(r.tenant_id);
    v1::RevokeTokenRequest => |r| token_object(&r.tenant_id, &r.name), Tenant(r.tenant_id);
}

changes_unless_dry_run! {
    v1::CreateTenantRequest => |r| r.name;
    v1::CreateGpuQuotaRequest => |r| format!("{}/{}", r.tenant_id, r.gpu_type), Tenant(r.tenant_id);
    v1::UpdateGpuQuotaRequest => |r| r.id, Quota(r.id);
    v1::DeleteGpuQuotaRequest => |r| r.id, Quota(r.id);
    v1::CreateReservationRequest => |r| format!("{}/{}", r.tenant_id, r.gpu_type), Tenant(r.tenant_id);
    v1::UpdateReservationRequest => |r| r.id, Reservation(r.id);
    v1::CreateTenantClusterRequest => |r| format!("{}/{}", r.tenant_id, r.name), Tenant(r.tenant_id);
    v1::UpdateTenantClusterRequest => |r| r.id, Cluster(r.id);
    v1::CreateTokenRequest => |r| token_object(&r.tenant_id, &r.name), Tenant(r.tenant_id);
}

/// A token as the audit log names it: `tenant/name`, or `name` for an admin-scoped one.
fn token_object(tenant: &str, name: &str) -> String {
    if tenant.is_empty() {
        name.to_string()
    } else {
        format!("{tenant}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_runs_and_reads_change_nothing() {
        let dry = v1::UpdateTenantClusterRequest {
            id: "c".into(),
            validate_only: true,
            ..Default::default()
        };
        assert!(!dry.changes());
        assert!(v1::UpdateTenantClusterRequest::default().changes());
        assert!(!v1::ListEventsRequest::default().changes());
        assert!(v1::DeleteTenantClusterRequest::default().changes());
        assert_eq!(
            v1::RevokeTokenRequest {
                tenant_id: "a".into(),
                name: "ci".into()
            }
            .object(),
            "a/ci"
        );
        // What an admin's change acts on, for the team's audit view.
        let quota = v1::DeleteGpuQuotaRequest {
            id: "q1".into(),
            ..Default::default()
        };
        assert_eq!(quota.owner(), Owner::Quota("q1"));
        assert_eq!(
            v1::ResetQuarantineBreakerRequest::default().owner(),
            Owner::None
        );
    }
}
