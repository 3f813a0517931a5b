//! List resources over the wire (`terraform query`, Terraform 1.14+): each list is named
//! by the managed resource type whose objects it finds, and streams one event per object
//! with its identity, a display name and, when asked, its state. The request's `limit` is
//! honoured and bounded here ([`MAX_RESULTS`]), whatever the list resource does.

use super::convert;
use super::service::{decode, encode, unknown_type, ListEvents, ProviderService, Registered};
use super::tfplugin6 as tf;
use super::write_only;
use crate::framework::{Diagnostic, Diagnostics, ListResourceType, Listed, Severity};

/// The most results one list answers, whatever its limit (Terraform's default is 100).
pub const MAX_RESULTS: usize = 1000;

impl ProviderService {
    fn list_type(&self, type_name: &str) -> Result<&Registered<dyn ListResourceType>, Diagnostics> {
        self.lists
            .get(type_name)
            .ok_or_else(|| unknown_type("list resource", type_name))
    }

    pub(super) async fn validate_list(
        &self,
        req: tf::validate_list_resource_config::Request,
    ) -> tf::validate_list_resource_config::Response {
        let result = async {
            let l = self.list_type(&req.type_name)?;
            let config = decode(req.config.as_ref(), &l.ty)?;
            l.inner.validate(&config).await
        }
        .await;
        tf::validate_list_resource_config::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }

    /// The events of one list, or one event holding why there are none. A list cut at
    /// [`MAX_RESULTS`] below the limit asked ends with a warning saying so (Terraform shows
    /// an event's warning and skips the event when it has no identity).
    pub(super) async fn list(&self, req: tf::list_resource::Request) -> ListEvents {
        let asked = usize::try_from(req.limit.max(0)).unwrap_or(usize::MAX);
        let limit = asked.min(MAX_RESULTS);
        let events = match self.listed(&req, limit).await {
            Ok(mut events) => {
                if asked > MAX_RESULTS && events.len() == MAX_RESULTS {
                    events.push(cut_short(&req.type_name));
                }
                events
            }
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
        let l = self.list_type(&req.type_name)?;
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

fn cut_short(type_name: &str) -> tf::list_resource::Event {
    let warning = Diagnostic {
        severity: Severity::Warning,
        ..Diagnostic::error(
            format!("limit: {type_name} answers at most {MAX_RESULTS} results; there may be more"),
            "Narrow the list (e.g. `config { tenant = \"...\" }`) to find the rest.",
        )
    };
    tf::list_resource::Event {
        diagnostic: convert::diagnostics(warning.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;
    use tonic::Request;

    use super::super::fakes::service;
    use super::super::service::{decode, encode};
    use super::super::tfplugin6 as tf;
    use crate::framework::{Type, Value};
    use tf::provider_server::Provider;

    fn config(prefix: Option<&str>) -> Option<tf::DynamicValue> {
        let ty = Type::object([("prefix", Type::String)]);
        encode(
            &Value::object([("prefix", prefix.map_or(Value::Null, Value::string))]),
            &ty,
        )
    }

    async fn events(req: tf::list_resource::Request) -> Vec<tf::list_resource::Event> {
        let (svc, _calls) = service();
        let stream = svc
            .list_resource(Request::new(req))
            .await
            .unwrap()
            .into_inner();
        stream.map(|e| e.unwrap()).collect().await
    }

    #[tokio::test]
    async fn list_schemas_are_offered_by_the_managed_type_they_list() {
        let (svc, _calls) = service();
        let schema = svc
            .get_provider_schema(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        let list = &schema.list_resource_schemas["test_thing"];
        assert_eq!(list.block.as_ref().unwrap().attributes[0].name, "prefix");
        assert!(schema.resource_schemas.contains_key("test_thing"));
        let metadata = svc
            .get_metadata(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(metadata.list_resources[0].type_name, "test_thing");
    }

    #[tokio::test]
    async fn results_carry_identity_and_name_and_the_limit_cuts_them() {
        let found = events(tf::list_resource::Request {
            type_name: "test_thing".into(),
            config: config(Some("x")),
            include_resource_object: false,
            limit: 2,
        })
        .await;
        assert_eq!(found.len(), 2, "the limit holds whatever the list gives");
        assert_eq!(found[0].display_name, "thing x0");
        let identity_ty = Type::object([("name", Type::String)]);
        let identity = found[1].identity.as_ref().unwrap();
        let identity = decode(identity.identity_data.as_ref(), &identity_ty).unwrap();
        assert_eq!(identity.get("name"), &Value::string("x1"));
        assert!(found[0].resource_object.is_none(), "not asked for");
    }

    #[tokio::test]
    async fn states_come_when_asked_and_a_huge_limit_is_bounded() {
        let found = events(tf::list_resource::Request {
            type_name: "test_thing".into(),
            config: config(None),
            include_resource_object: true,
            limit: i64::MAX,
        })
        .await;
        assert_eq!(found.len(), 5, "fewer than the bound: no warning");
        let thing_ty = Type::object([("name", Type::String), ("size", Type::Number)]);
        let state = decode(found[3].resource_object.as_ref(), &thing_ty).unwrap();
        assert_eq!(state.get("size"), &Value::Number(3));
        assert_eq!(super::MAX_RESULTS, 1000);
    }

    #[tokio::test]
    async fn an_unknown_list_is_one_event_with_an_error_and_bad_config_names_its_attribute() {
        let found = events(tf::list_resource::Request {
            type_name: "test_nothing".into(),
            limit: 10,
            ..Default::default()
        })
        .await;
        assert_eq!(found.len(), 1);
        assert!(found[0].identity.is_none());
        assert!(found[0].diagnostic[0].summary.contains("test_nothing"));

        let (svc, _calls) = service();
        let validated = svc
            .validate_list_resource_config(Request::new(
                tf::validate_list_resource_config::Request {
                    type_name: "test_thing".into(),
                    config: config(Some("")),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            validated.diagnostics[0].summary,
            "prefix: must not be empty"
        );
    }

    #[test]
    fn a_list_cut_at_the_bound_ends_with_a_warning_naming_the_limit() {
        let event = super::cut_short("test_thing");
        assert!(event.identity.is_none());
        assert_eq!(
            event.diagnostic[0].severity,
            tf::diagnostic::Severity::Warning as i32
        );
        assert!(event.diagnostic[0]
            .summary
            .starts_with("limit: test_thing answers at most 1000 results"));
    }
}
