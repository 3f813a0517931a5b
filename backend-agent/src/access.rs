//! How a tenant reaches its cluster: the endpoint and the credentials for it.

use crate::auth::new_token;

pub fn endpoint(orchestrator: &str, tenant: &str, cluster: &str) -> String {
    match orchestrator {
        "slurm" => format!("{cluster}-login.{tenant}.slurm.gpufleet.internal:22"),
        _ => format!("https://{cluster}.{tenant}.k8s.gpufleet.internal:6443"),
    }
}

/// A kubeconfig for Kubernetes (its own CA and a client certificate signed by it), a
/// login block for Slurm with its own random token.
pub fn credentials(orchestrator: &str, tenant: &str, cluster: &str) -> anyhow::Result<String> {
    let endpoint = endpoint(orchestrator, tenant, cluster);
    Ok(match orchestrator {
        "slurm" => {
            let token = new_token("gfc_");
            let host = endpoint.trim_end_matches(":22");
            format!("host: {host}\nport: 22\nuser: {tenant}\ntoken: {token}\n")
        }
        _ => {
            let issued = crate::kubeconfig::issue(tenant, cluster)?;
            crate::kubeconfig::render(tenant, cluster, &endpoint, &issued)
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints_and_credentials() {
        assert_eq!(
            super::endpoint("kubernetes", "t", "c"),
            "https://c.t.k8s.gpufleet.internal:6443"
        );
        assert_eq!(
            super::endpoint("slurm", "t", "c"),
            "c-login.t.slurm.gpufleet.internal:22"
        );
        let k = super::credentials("kubernetes", "t", "c").unwrap();
        assert!(
            k.contains("server: https://c.t.k8s.gpufleet.internal:6443")
                && k.contains("certificate-authority-data: ")
                && k.contains("client-key-data: ")
        );
        let s = super::credentials("slurm", "t", "c").unwrap();
        assert!(
            s.starts_with("host: c-login.t.slurm.gpufleet.internal\n") && s.contains("user: t\n")
        );
        assert_ne!(super::credentials("slurm", "t", "c").unwrap(), s);
    }
}
