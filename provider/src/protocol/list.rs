//! List resources over the wire (`terraform query`, Terraform 1.14+): each list is named
//! by the managed resource type whose objects it finds, and streams one event per object
//! with its identity, a display name and, when asked, its state. The request's `limit` is
//! honoured and bounded here ([`MAX_RESULTS`]), whatever the list resource does.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::Status;

use super::convert;
use super::service::{decode, encode, unknown_type, ProviderService, Registered};
use super::tfplugin6 as tf;
use super::write_only;
use crate::framework::{Diagnostic, Diagnostics, ListResourceType, Listed};

/// The most results one list answers, whatever its limit (Terraform's default is 100).
pub const MAX_RESULTS: usize = 1000;

pub type Events = Pin<Box<dyn Stream<Item = Result<tf::list_resource::Event, Status>> + Send>>;

impl ProviderService {
    fn list_resource(
        &self,
        type_name: &str,
    ) -> Result<&Registered<dyn ListResourceType>, Diagnostics> {
        self.lists
            .get(type_name)
            .ok_or_else(|| unknown_type("list resource", type_name))
    }

    pub(super) async fn validate_list(
        &self,
        req: tf::validate_list_resource_config::Request,
    ) -> tf::validate_list_resource_config::Response {
        let result = async {
            let l = self.list_resource(&req.type_name)?;
            let config = decode(req.config.as_ref(), &l.ty)?;
            l.inner.validate(&config).await
        }
        .await;
        tf::validate_list_resource_config::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }

    /// The events of one list, or one event holding why there are none.
    pub(super) async fn list(&self, req: tf::list_resource::Request) -> Events {
        let limit = usize::try_from(req.limit.max(0))
            .unwrap_or(MAX_RESULTS)
            .min(MAX_RESULTS);
        let events = match self.listed(&req, limit).await {
            Ok(events) => events,
            Err(d) => vec![tf::list_resource::Event {
                diagnostic: convert::diagnostics(d),
                ..Default::default()
            }],
        };
        Box::pin(tokio_stream::iter(events.into_iter().map(Ok)))
    }

    async fn listed(
        &self,
        req: &tf::list_resource::Request,
        limit: usize,
    ) -> Result<Vec<tf::list_resource::Event>, Diagnostics> {
        let l = self.list_resource(&req.type_name)?;
        let r = self.resources.get(&req.type_name).ok_or_else(|| {
            Diagnostics::from(Diagnostic::error(
                format!(
                    "list resource {} lists no managed resource type",
                    req.type_name
                ),
                "",
            ))
        })?;
        let config = decode(req.config.as_ref(), &l.ty)?;
        let found = l
            .inner
            .list(&config, req.include_resource_object, limit)
            .await?;
        Ok(found
            .into_iter()
            .take(limit)
            .map(
                |Listed {
                     identity,
                     display_name,
                     state,
                 }| tf::list_resource::Event {
                    identity: self.identities.encoded(&req.type_name, &identity),
                    display_name,
                    resource_object: state
                        .filter(|_| req.include_resource_object)
                        .and_then(|s| encode(&write_only::nulled(&r.schema, s), &r.ty)),
                    diagnostic: Vec::new(),
                },
            )
            .collect())
    }
}
