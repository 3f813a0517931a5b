//! Actions over the wire (Terraform 1.14+): their configuration checked at validate and
//! plan, and an invocation streamed as progress lines then one `Completed` event with the
//! outcome's diagnostics. If Terraform goes away mid-way, the action's future is dropped.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert;
use super::service::{decode, unknown_type, ActionEvents, ProviderService, Registered};
use super::tfplugin6 as tf;
use crate::framework::{ActionType, Diagnostics, Progress, Type};

/// Progress lines waiting for Terraform: a slow reader holds the action back, never
/// memory.
const PROGRESS_BACKLOG: usize = 16;

impl ProviderService {
    fn action(&self, type_name: &str) -> Result<&Registered<dyn ActionType>, Diagnostics> {
        self.actions
            .get(type_name)
            .ok_or_else(|| unknown_type("action", type_name))
    }

    pub(super) async fn validate_action(
        &self,
        req: tf::validate_action_config::Request,
    ) -> tf::validate_action_config::Response {
        let result = async {
            let a = self.action(&req.type_name)?;
            let config = decode(req.config.as_ref(), &a.ty)?;
            a.inner.validate(&config).await
        }
        .await;
        tf::validate_action_config::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }

    pub(super) async fn plan_action_config(
        &self,
        req: tf::plan_action::Request,
    ) -> tf::plan_action::Response {
        let result = async {
            let a = self.action(&req.action_type)?;
            let config = decode(req.config.as_ref(), &a.ty)?;
            a.inner.plan(&config).await
        }
        .await;
        tf::plan_action::Response {
            diagnostics: result.err().map(convert::diagnostics).unwrap_or_default(),
        }
    }

    pub(super) fn invoke(&self, req: tf::invoke_action::Request) -> ActionEvents {
        let found = self
            .action(&req.action_type)
            .map(|a| (a.inner.clone(), a.ty.clone()));
        let (events, rx) = mpsc::channel(PROGRESS_BACKLOG);
        tokio::spawn(async move {
            let outcome = match found {
                Ok((action, ty)) => run(action, ty, req.config, &events).await,
                Err(d) => Err(d),
            };
            let _ = events.send(Ok(completed(outcome))).await;
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

type Sender = mpsc::Sender<Result<tf::invoke_action::Event, Status>>;

/// Runs the action, forwarding its progress lines as they come.
async fn run(
    action: Arc<dyn ActionType>,
    ty: Type,
    config: Option<tf::DynamicValue>,
    events: &Sender,
) -> Result<(), Diagnostics> {
    let config = decode(config.as_ref(), &ty)?;
    let (lines, mut said) = mpsc::channel(PROGRESS_BACKLOG);
    let progress = Progress::new(lines);
    let invoked = action.invoke(&config, &progress);
    tokio::pin!(invoked);
    let outcome = loop {
        tokio::select! {
            outcome = &mut invoked => break outcome,
            Some(line) = said.recv() => {
                if events.send(Ok(progress_event(line))).await.is_err() {
                    // Terraform went away: the action's future is dropped with this task.
                    return Ok(());
                }
            }
        }
    };
    while let Ok(line) = said.try_recv() {
        let _ = events.send(Ok(progress_event(line))).await;
    }
    outcome
}

fn progress_event(message: String) -> tf::invoke_action::Event {
    tf::invoke_action::Event {
        r#type: Some(tf::invoke_action::event::Type::Progress(
            tf::invoke_action::event::Progress { message },
        )),
    }
}

fn completed(outcome: Result<(), Diagnostics>) -> tf::invoke_action::Event {
    tf::invoke_action::Event {
        r#type: Some(tf::invoke_action::event::Type::Completed(
            tf::invoke_action::event::Completed {
                diagnostics: outcome.err().map(convert::diagnostics).unwrap_or_default(),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;
    use tonic::Request;

    use super::super::fakes::service;
    use super::super::service::encode;
    use super::super::tfplugin6 as tf;
    use crate::framework::{Type, Value};
    use tf::invoke_action::event::Type as Kind;
    use tf::provider_server::Provider;

    fn config(target: &str, fail: bool) -> Option<tf::DynamicValue> {
        let ty = Type::object([("target", Type::String), ("fail", Type::Bool)]);
        encode(
            &Value::object([
                ("target", Value::string(target)),
                ("fail", Value::Bool(fail)),
            ]),
            &ty,
        )
    }

    async fn invoked(fail: bool) -> Vec<Kind> {
        let (svc, _calls) = service();
        let stream = svc
            .invoke_action(Request::new(tf::invoke_action::Request {
                action_type: "test_ping".into(),
                config: config("db", fail),
                client_capabilities: None,
            }))
            .await
            .unwrap()
            .into_inner();
        stream.map(|e| e.unwrap().r#type.unwrap()).collect().await
    }

    fn progress_of(events: &[Kind]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Kind::Progress(p) => Some(p.message.clone()),
                Kind::Completed(_) => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn an_invocation_streams_its_progress_then_one_completed_event() {
        let events = invoked(false).await;
        assert_eq!(progress_of(&events), ["pinging db", "db answered"]);
        match events.last() {
            Some(Kind::Completed(c)) => assert!(c.diagnostics.is_empty()),
            other => panic!("ends with Completed, not {other:?}"),
        }
        let failed = invoked(true).await;
        assert_eq!(progress_of(&failed).len(), 2, "progress before the failure");
        match failed.last() {
            Some(Kind::Completed(c)) => {
                assert_eq!(c.diagnostics[0].summary, "target: answered too late");
                assert!(c.diagnostics[0].attribute.is_some());
            }
            other => panic!("ends with Completed, not {other:?}"),
        }
    }

    #[tokio::test]
    async fn schemas_validation_plan_and_an_unknown_action() {
        let (svc, _calls) = service();
        let schema = svc
            .get_provider_schema(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        let ping = schema.action_schemas["test_ping"].schema.as_ref().unwrap();
        assert_eq!(ping.block.as_ref().unwrap().attributes.len(), 2);
        let metadata = svc
            .get_metadata(Request::new(Default::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(metadata.actions[0].type_name, "test_ping");

        let validated = svc
            .validate_action_config(Request::new(tf::validate_action_config::Request {
                type_name: "test_ping".into(),
                config: config("", false),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            validated.diagnostics[0].summary,
            "target: must not be empty"
        );
        let planned = svc
            .plan_action(Request::new(tf::plan_action::Request {
                action_type: "test_ping".into(),
                config: config("", false),
                client_capabilities: None,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(planned.diagnostics.len(), 1, "plan checks again");

        let unknown = svc
            .invoke_action(Request::new(tf::invoke_action::Request {
                action_type: "test_nothing".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        let events: Vec<_> = unknown.map(|e| e.unwrap().r#type.unwrap()).collect().await;
        match &events[..] {
            [Kind::Completed(c)] => assert!(c.diagnostics[0].summary.contains("test_nothing")),
            other => panic!("one Completed with the error, not {other:?}"),
        }
    }
}
