# The training cluster's Grafana dashboard and the Prometheus job that feeds it: the
# control plane's metrics (serve --metrics-listen) scraped with one of the team's tokens.
data "gpufleet_cluster_dashboard" "train" {
  cluster_id      = gpufleet_tenant_cluster.train.id
  metrics_address = "gpufleet.example.internal:9400" # optional: default, where serve says it listens
  token_file      = "/etc/prometheus/gpufleet-vision.token"
}

# With the Grafana provider:
# resource "grafana_dashboard" "train" {
#   config_json = data.gpufleet_cluster_dashboard.train.dashboard_json
# }

output "prometheus_job" {
  value = data.gpufleet_cluster_dashboard.train.prometheus_scrape_config
}
