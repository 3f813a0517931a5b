//! A node agent written by an attacker who holds the join token: it registers what it
//! likes, heartbeats, and answers orders (or not) as the test says. Only the protocol,
//! none of the real agent's code.

use std::time::Duration;

use gpufleet_proto::v1::{
    agent_message, control_message, node_agent_service_client::NodeAgentServiceClient, *,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub struct Rogue {
    pub node_id: String,
    /// The node secret the control plane issued at this registration ("" when none).
    pub secret: String,
    out: mpsc::UnboundedSender<AgentMessage>,
    inbound: tonic::Streaming<ControlMessage>,
    heartbeats: Option<tokio::task::JoinHandle<()>>,
}

/// A registration of `gpus` GPUs of `model` under `name`, with UUIDs of its own.
pub fn registration(name: &str, model: &str, gpus: usize) -> RegisterNode {
    let memory_mib = gpufleet_gpu::catalog::model(model)
        .map(|m| m.memory_mib as i64)
        .unwrap_or(1024);
    RegisterNode {
        name: name.into(),
        capacity: "pool".into(),
        hardware: "sim".into(),
        bandwidth_addr: String::new(),
        inventory: Some(NodeInventory {
            gpu_type: model.into(),
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i as i32,
                    uuid: format!("GPU-{name}-{i}"),
                    model: model.into(),
                    memory_mib,
                    ..Default::default()
                })
                .collect(),
        }),
        ..Default::default()
    }
}

fn join_token(data_dir: &std::path::Path) -> String {
    std::fs::read_to_string(data_dir.join("join.token"))
        .expect("the control plane's join.token")
        .trim()
        .to_string()
}

impl Rogue {
    /// Opens a session and registers; the control plane's refusal when it refuses.
    pub async fn register(
        endpoint: &str,
        data_dir: &std::path::Path,
        reg: RegisterNode,
    ) -> Result<Rogue, tonic::Status> {
        let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let mut client = NodeAgentServiceClient::with_interceptor(
            channel,
            gpufleet_proto::BearerAuth::new(&join_token(data_dir)).unwrap(),
        )
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
        let (out, rx) = mpsc::unbounded_channel();
        out.send(AgentMessage {
            msg: Some(agent_message::Msg::Register(reg)),
        })
        .unwrap();
        let mut inbound = client
            .session(UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = inbound
            .message()
            .await?
            .expect("a first message from the control plane");
        let Some(control_message::Msg::Registered(r)) = first.msg else {
            panic!("expected Registered, got {first:?}");
        };
        let beat = out.clone();
        let every = Duration::from_millis(u64::from(r.heartbeat_interval_ms.max(20)));
        let heartbeats = tokio::spawn(async move {
            let mut seq = 0;
            loop {
                tokio::time::sleep(every).await;
                seq += 1;
                let hb = AgentMessage {
                    msg: Some(agent_message::Msg::Heartbeat(Heartbeat {
                        seq,
                        orders_queued: 0,
                        gpus: Vec::new(),
                        ..Default::default()
                    })),
                };
                if beat.send(hb).is_err() {
                    return;
                }
            }
        });
        Ok(Rogue {
            node_id: r.node_id,
            secret: r.node_secret,
            out,
            inbound,
            heartbeats: Some(heartbeats),
        })
    }

    /// The next order the control plane sends (within 60 s).
    pub async fn next_order(&mut self) -> WorkOrder {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(60), self.inbound.message())
                .await
                .expect("an order within 60s")
                .expect("the session stays open")
                .expect("the session stays open");
            if let Some(control_message::Msg::Order(o)) = m.msg {
                return o;
            }
        }
    }

    pub fn answer(&self, result: OrderResult) {
        self.out
            .send(AgentMessage {
                msg: Some(agent_message::Msg::Result(result)),
            })
            .expect("the session stays open");
    }

    /// Answers a health check order as passed (one passing check).
    pub fn pass_check(&self, order: &WorkOrder) {
        self.answer_check(order, "gpu_count", "pass", "");
    }

    /// Answers a health check order as failed on `check` (what a failing GPU reports).
    pub fn fail_check(&self, order: &WorkOrder, check: &str) {
        self.answer_check(order, check, "fail", "3 uncorrected");
    }

    /// Answers a health check order with one check's verdict.
    fn answer_check(&self, order: &WorkOrder, check: &str, verdict: &str, value: &str) {
        let Some(work_order::Kind::RunHealthCheck(h)) = &order.kind else {
            panic!("expected a health check, got {order:?}");
        };
        self.answer(OrderResult {
            order_id: order.id.clone(),
            ok: true,
            health: Some(HealthReport {
                level: h.level.clone(),
                checks: vec![CheckResult {
                    name: check.into(),
                    verdict: verdict.into(),
                    value: value.into(),
                    ..Default::default()
                }],
                finished_at: 0,
            }),
            ..Default::default()
        });
    }

    /// Stops the regular heartbeats (the test sends its own with [`Rogue::send`]).
    pub fn silence(&mut self) {
        if let Some(h) = self.heartbeats.take() {
            h.abort();
        }
    }

    /// Sends any message; false once the session is gone.
    pub fn send(&self, msg: agent_message::Msg) -> bool {
        self.out.send(AgentMessage { msg: Some(msg) }).is_ok()
    }

    /// The status the control plane ended the session with (within `within`); orders it
    /// sent meanwhile are skipped.
    pub async fn ended(&mut self, within: Duration) -> tonic::Status {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.inbound.message()).await {
                Err(_) => panic!("the session was not ended within {within:?}"),
                Ok(Err(status)) => return status,
                Ok(Ok(None)) => return tonic::Status::ok("the stream ended without a status"),
                Ok(Ok(Some(_))) => {}
            }
        }
    }

    /// Ends the session at once (heartbeats stop, the stream closes).
    pub fn leave(mut self) {
        if let Some(h) = self.heartbeats.take() {
            h.abort();
        }
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeats.take() {
            h.abort();
        }
    }
}
