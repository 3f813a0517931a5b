//! Ephemeral resources over the wire (protocol 6.7, Terraform 1.10+): validate, open,
//! renew and close. Their results go back to Terraform only in these answers; Terraform
//! keeps them in memory for the run and writes them to no state and no plan.

use super::convert;
use super::dynamic::{decode, encode};
use super::service::{unknown_type, ProviderService, Registered};
use super::tfplugin6 as tf;
use crate::framework::{Diagnostics, EphemeralResourceType};

impl ProviderService {
    fn ephemeral(
        &self,
        type_name: &str,
    ) -> Result<&Registered<dyn EphemeralResourceType>, Diagnostics> {
        self.ephemeral
            .get(type_name)
            .ok_or_else(|| unknown_type("ephemeral resource", type_name))
    }

    pub(super) async fn validate_ephemeral(
        &self,
        req: tf::validate_ephemeral_resource_config::Request,
    ) -> tf::validate_ephemeral_resource_config::Response {
        let result = async {
            let e = self.ephemeral(&req.type_name)?;
            let config = decode(req.config.as_ref(), &e.ty)?;
            e.inner.validate(&config).await
        }
        .await;
        tf::validate_ephemeral_resource_config::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }

    pub(super) async fn open_ephemeral(
        &self,
        req: tf::open_ephemeral_resource::Request,
    ) -> tf::open_ephemeral_resource::Response {
        let result = async {
            let e = self.ephemeral(&req.type_name)?;
            let config = decode(req.config.as_ref(), &e.ty)?;
            let opened = e.inner.open(&config).await?;
            Ok::<_, Diagnostics>((encode(&opened.result, &e.ty), opened))
        }
        .await;
        match result {
            Ok((result, opened)) => tf::open_ephemeral_resource::Response {
                diagnostics: Vec::new(),
                renew_at: opened.renew_at.map(timestamp),
                result,
                private: opened.private,
            },
            Err(d) => tf::open_ephemeral_resource::Response {
                diagnostics: convert::diagnostics(d),
                ..Default::default()
            },
        }
    }

    pub(super) async fn renew_ephemeral(
        &self,
        req: tf::renew_ephemeral_resource::Request,
    ) -> tf::renew_ephemeral_resource::Response {
        let result = async {
            let e = self.ephemeral(&req.type_name)?;
            e.inner.renew(req.private.as_deref()).await
        }
        .await;
        match result {
            Ok(renew_at) => tf::renew_ephemeral_resource::Response {
                diagnostics: Vec::new(),
                renew_at: renew_at.map(timestamp),
                private: req.private,
            },
            Err(d) => tf::renew_ephemeral_resource::Response {
                diagnostics: convert::diagnostics(d),
                renew_at: None,
                private: req.private,
            },
        }
    }

    pub(super) async fn close_ephemeral(
        &self,
        req: tf::close_ephemeral_resource::Request,
    ) -> tf::close_ephemeral_resource::Response {
        let result = async {
            let e = self.ephemeral(&req.type_name)?;
            e.inner.close(req.private.as_deref()).await
        }
        .await;
        tf::close_ephemeral_resource::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }
}

fn timestamp(unix: i64) -> tf::Timestamp {
    tf::Timestamp {
        seconds: unix,
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use tonic::Request;

    use super::super::dynamic::{decode, encode};
    use super::super::fakes::service;
    use super::super::tfplugin6 as tf;
    use crate::framework::{Type, Value};
    use tf::provider_server::Provider;

    fn ticket_ty() -> Type {
        Type::object([("for", Type::String), ("secret", Type::String)])
    }

    #[tokio::test]
    async fn ephemeral_schemas_are_offered_in_their_own_field_and_metadata() {
        let (svc, _calls) = service();
        let schema = svc
            .get_provider_schema(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert!(schema
            .ephemeral_resource_schemas
            .contains_key("test_ticket"));
        assert!(!schema.resource_schemas.contains_key("test_ticket"));
        let metadata = svc
            .get_metadata(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(metadata.ephemeral_resources[0].type_name, "test_ticket");
    }

    #[tokio::test]
    async fn open_answers_the_result_and_close_gets_back_what_open_kept() {
        let (svc, calls) = service();
        let config = Value::object([("for", Value::string("ci")), ("secret", Value::Null)]);
        let opened = svc
            .open_ephemeral_resource(Request::new(tf::open_ephemeral_resource::Request {
                type_name: "test_ticket".into(),
                config: encode(&config, &ticket_ty()),
                client_capabilities: None,
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(opened.diagnostics.is_empty(), "{:?}", opened.diagnostics);
        let result = decode(opened.result.as_ref(), &ticket_ty()).unwrap();
        assert_eq!(result.get("secret"), &Value::string("s3cret"));
        assert_eq!(opened.renew_at.unwrap().seconds, 1_900_000_000);

        let closed = svc
            .close_ephemeral_resource(Request::new(tf::close_ephemeral_resource::Request {
                type_name: "test_ticket".into(),
                private: opened.private.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(closed.diagnostics.is_empty());
        assert_eq!(*calls.closed.lock().unwrap(), vec![Some(b"ci".to_vec())]);

        let unknown = svc
            .open_ephemeral_resource(Request::new(tf::open_ephemeral_resource::Request {
                type_name: "test_nothing".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(unknown.diagnostics[0].summary.contains("test_nothing"));
    }
}
