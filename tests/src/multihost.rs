//! A fleet on the multi-host tier ([`crate::netns`]): a control-plane host `cp` running
//! `serve --node-agents external`, a `client` host the harness's clients (and Terraform)
//! work from, and a GPU host per name, each running a node agent of that name.

use std::time::Duration;

use crate::netns::Network;
use crate::{eventually, Backend, NodeAgent};

/// A simulated GPU host's agent flags: one GPU, and the CPUs and memory a GPU host
/// declares to Slurm, not this machine's two cores.
pub const ONE_GPU_HOST: [&str; 6] = ["--gpus", "1", "--cpus", "16", "--memory-mib", "65536"];

/// Fields drop in order: the agents first, the network last.
pub struct Fleet {
    pub agents: Vec<NodeAgent>,
    pub backend: Backend,
    pub net: Network,
}

impl Fleet {
    /// Starts the hosts, `serve --node-agents external --health-interval 0 serve_args` on
    /// `cp` and `node agent_args` on each of `gpu_hosts`, and returns once every node is
    /// ready (`limit` is the safety net of that wait).
    pub async fn start(
        gpu_hosts: &[&str],
        serve_args: &[&str],
        agent_args: &[&str],
        limit: Duration,
    ) -> Fleet {
        let mut names = vec!["cp", "client"];
        names.extend(gpu_hosts);
        let net = Network::new(&names);
        let mut args = vec!["--node-agents", "external", "--health-interval", "0"];
        args.extend(serve_args);
        let backend = Backend::start_on(net.host("cp"), net.host("client"), &args);
        let agents: Vec<NodeAgent> = gpu_hosts
            .iter()
            .map(|h| NodeAgent::start_on(net.host(h), &backend, h, agent_args))
            .collect();
        nodes_ready(&backend, gpu_hosts.len(), limit).await;
        Fleet {
            agents,
            backend,
            net,
        }
    }
}

/// Waits until `backend` has `count` nodes and every one is ready (`limit` is the safety
/// net of that wait): after a start, a restart, or a host healed.
pub async fn nodes_ready(backend: &Backend, count: usize, limit: Duration) {
    let admin = backend.admin().await;
    eventually("every node ready", limit, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == count && nodes.iter().all(|n| n.state == "ready")).then_some(())
        }
    })
    .await;
}
