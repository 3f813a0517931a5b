//! Ephemeral resources over the wire (protocol 6.7, Terraform 1.10+): validate, open,
//! renew and close. Their results go back to Terraform only in these answers; Terraform
//! keeps them in memory for the run and writes them to no state and no plan.

use super::convert;
use super::service::{decode, encode, unknown_type, ProviderService, Registered};
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
