//! How a tenant reaches a Kubernetes cluster: the endpoint and the credentials for it.
//! (A Slurm cluster's come from its real controller: `slurm::cluster::prepare`.)

/// The API server URL of a Kubernetes cluster; empty for Slurm (filled in by
/// `slurm::cluster::prepare`).
pub fn endpoint(orchestrator: &str, tenant: &str, cluster: &str) -> String {
    match orchestrator {
        "slurm" => String::new(),
        _ => format!("https://{cluster}.{tenant}.k8s.gpufleet.internal:6443"),
    }
}

/// A kubeconfig for a Kubernetes cluster (its own CA and a client certificate signed by
/// it); empty for Slurm (filled in by `slurm::cluster::prepare`).
pub fn credentials(orchestrator: &str, tenant: &str, cluster: &str) -> anyhow::Result<String> {
    if orchestrator == "slurm" {
        return Ok(String::new());
    }
    let issued = crate::kubeconfig::issue(tenant, cluster)?;
    Ok(crate::kubeconfig::render(
        tenant,
        cluster,
        &endpoint(orchestrator, tenant, cluster),
        &issued,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints_and_credentials() {
        assert_eq!(
            super::endpoint("kubernetes", "t", "c"),
            "https://c.t.k8s.gpufleet.internal:6443"
        );
        let k = super::credentials("kubernetes", "t", "c").unwrap();
        assert!(
            k.contains("server: https://c.t.k8s.gpufleet.internal:6443")
                && k.contains("certificate-authority-data: ")
                && k.contains("client-key-data: ")
        );
        assert_ne!(super::credentials("kubernetes", "t", "c").unwrap(), k);
        // Slurm's come from its controller.
        assert_eq!(super::endpoint("slurm", "t", "c"), "");
        assert_eq!(super::credentials("slurm", "t", "c").unwrap(), "");
    }
}
