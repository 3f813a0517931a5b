//! How a tenant reaches its cluster: the endpoint and the credentials for it.

use crate::auth::new_token;

pub fn endpoint(orchestrator: &str, tenant: &str, cluster: &str) -> String {
    match orchestrator {
        "slurm" => format!("{cluster}-login.{tenant}.slurm.gpufleet.internal:22"),
        _ => format!("https://{cluster}.{tenant}.k8s.gpufleet.internal:6443"),
    }
}

/// A kubeconfig for Kubernetes, a login block for Slurm; each with its own random token.
pub fn credentials(orchestrator: &str, tenant: &str, cluster: &str) -> String {
    let token = new_token("gfc_");
    let endpoint = endpoint(orchestrator, tenant, cluster);
    match orchestrator {
        "slurm" => {
            let host = endpoint.trim_end_matches(":22");
            format!("host: {host}\nport: 22\nuser: {tenant}\ntoken: {token}\n")
        }
        _ => format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {endpoint}\ncontexts:\n- name: {tenant}@{cluster}\n  context:\n    cluster: {cluster}\n    user: {tenant}\ncurrent-context: {tenant}@{cluster}\nusers:\n- name: {tenant}\n  user:\n    token: {token}\n"
        ),
    }
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
        let k = super::credentials("kubernetes", "t", "c");
        assert!(
            k.contains("server: https://c.t.k8s.gpufleet.internal:6443")
                && k.contains("token: gfc_")
        );
        let s = super::credentials("slurm", "t", "c");
        assert!(
            s.starts_with("host: c-login.t.slurm.gpufleet.internal\n") && s.contains("user: t\n")
        );
        assert_ne!(super::credentials("slurm", "t", "c"), s);
    }
}
