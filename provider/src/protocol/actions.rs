//! Actions over the wire (Terraform 1.14+): their configuration checked at validate and
//! plan, and an invocation streamed as progress lines then one `Completed` event with the
//! outcome's diagnostics. If Terraform goes away mid-way, the action's future is dropped.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::Status;

use super::convert;
use super::service::{decode, unknown_type, ProviderService, Registered};
use super::tfplugin6 as tf;
use crate::framework::{ActionType, Diagnostics, Progress, Type};

pub type Events = Pin<Box<dyn Stream<Item = Result<tf::invoke_action::Event, Status>> + Send>>;

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

    pub(super) fn invoke(&self, req: tf::invoke_action::Request) -> Events {
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
