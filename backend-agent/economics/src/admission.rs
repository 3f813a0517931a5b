//! The control plane's admission, driven directly: a temporary real SQLite store seeded
//! with a fleet's nodes, its teams as tenants and their quotas, and a reservation
//! admitted the way `CreateReservation` admits one (`scheduling::reservations::place`,
//! then the row written) at a time the replay chooses. No rule is repeated here: what
//! fits is what the control plane says fits.
//!
//! A job starts now, as a cluster would: its pool nodes are held to the other teams'
//! lending limits exactly as the control plane holds a cluster that takes pool nodes
//! without a reservation (`sharing::shares` and `sharing::Lendable` over the store's
//! holdings), and [`Batch::shares`] reads each team's weighted share from the store the
//! same way (`sharing::shares`), for the replay's fair-share order.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use gpufleet_control::error::Error;
use gpufleet_control::fleet::{FleetFile, NodeGroup, DEFAULT_CUDA, DEFAULT_DRIVER};
use gpufleet_control::rules::Split;
use gpufleet_control::scheduling::{self, reservations, sharing, Exclude};
use gpufleet_control::store::{
    self, quotas::QuotaRow, reservations::ReservationRow, tenants::TenantRow,
};
use rusqlite::Connection;

use crate::fleet::Fleet;

/// One replay's store. Dropping it removes the database.
pub struct Admission {
    conn: Connection,
    /// The teams as tenants, in the fleet's order: (id, name).
    tenants: Vec<(String, String)>,
    /// A team's index by its tenant id.
    team_of: HashMap<String, usize>,
    allow_on_demand: Vec<bool>,
    gpus_per_node: BTreeMap<String, i64>,
    /// Whether any team has a lending limit (else no job is held to one).
    lending_limits: bool,
    next_id: u64,
    _dir: tempfile::TempDir,
}

impl Admission {
    /// A fresh store holding `fleet`'s nodes, teams and quotas, as of `now`.
    pub fn open(fleet: &Fleet, now: i64) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("gpufleet-replay")
            .tempdir()
            .context("cannot make the replay's temporary store")?;
        let mut conn = store::open(&dir.path().join("state.db"))?;
        gpufleet_control::fleet::seed(&conn, &hardware(fleet), now)?;
        let tx = conn.transaction()?;
        let mut tenants = Vec::new();
        for (i, team) in fleet.teams.iter().enumerate() {
            let id = format!("team-{i}");
            store::tenants::insert(
                &tx,
                &TenantRow {
                    id: id.clone(),
                    name: team.name.clone(),
                    display_name: team.name.clone(),
                    labels: BTreeMap::new(),
                    created_at: now,
                },
            )?;
            for q in &team.quotas {
                // The guarantee rule CreateGpuQuota runs held when the fleet was read
                // (`fleet::parse`), and holds for a partition by construction.
                let mut row = QuotaRow::new(
                    format!("{id}-{}", q.gpu_type),
                    id.clone(),
                    q.gpu_type.clone(),
                    q.gpus,
                    q.burst_gpus,
                );
                row.weight = q.weight;
                row.lending_limit_gpus = q.lending_limit_gpus;
                store::quotas::insert(&tx, &row)?;
            }
            tenants.push((id, team.name.clone()));
        }
        tx.commit()?;
        Ok(Self {
            conn,
            team_of: tenants
                .iter()
                .enumerate()
                .map(|(i, (id, _))| (id.clone(), i))
                .collect(),
            tenants,
            lending_limits: fleet
                .teams
                .iter()
                .flat_map(|t| &t.quotas)
                .any(|q| q.lending_limit_gpus.is_some()),
            allow_on_demand: fleet.teams.iter().map(|t| t.allow_on_demand).collect(),
            gpus_per_node: fleet
                .models
                .iter()
                .map(|m| (m.gpu_type.clone(), m.gpus_per_node))
                .collect(),
            next_id: 0,
            _dir: dir,
        })
    }

    /// Admits what `batch` asks in one transaction, as a burst of creates would be.
    pub fn batch<T>(
        &mut self,
        batch: impl FnOnce(&mut Batch) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let tx = self.conn.transaction()?;
        let mut b = Batch {
            conn: &tx,
            tenants: &self.tenants,
            team_of: &self.team_of,
            allow_on_demand: &self.allow_on_demand,
            gpus_per_node: &self.gpus_per_node,
            lending_limits: self.lending_limits,
            next_id: &mut self.next_id,
        };
        let out = batch(&mut b)?;
        tx.commit()?;
        Ok(out)
    }
}

/// Admissions inside one transaction.
pub struct Batch<'a> {
    conn: &'a Connection,
    tenants: &'a [(String, String)],
    team_of: &'a HashMap<String, usize>,
    allow_on_demand: &'a [bool],
    gpus_per_node: &'a BTreeMap<String, i64>,
    lending_limits: bool,
    next_id: &'a mut u64,
}

impl Batch<'_> {
    /// Asks for `gpus` GPUs of `gpu_type` for team `team` over `[start, end)` as a
    /// reservation of whole nodes starting now (`start`): Some(how its nodes split) when
    /// the control plane admits it (it then holds them), None when it refuses.
    pub fn admit(
        &mut self,
        team: usize,
        gpu_type: &str,
        gpus: i64,
        start: i64,
        end: i64,
    ) -> anyhow::Result<Option<Split>> {
        let Some(r) = self.place(team, gpu_type, gpus, start, end)? else {
            return Ok(None);
        };
        store::reservations::insert(self.conn, &r)?;
        Ok(Some(Split {
            pool: r.pool_nodes,
            on_demand: r.on_demand_nodes,
        }))
    }

    /// Whether the control plane would admit the job on the fleet with nothing else held:
    /// asked (and not recorded) for a window after everything the replay can hold,
    /// `duration` seconds from `after`. A job it refuses even then (more than the team's
    /// quota, or than the capacity the team may use) can never run.
    pub fn ever_admits(
        &mut self,
        team: usize,
        gpu_type: &str,
        gpus: i64,
        after: i64,
        duration: i64,
    ) -> anyhow::Result<bool> {
        Ok(self
            .place(team, gpu_type, gpus, after, after + duration)?
            .is_some())
    }

    /// Each team's weighted share of `gpu_type` at `t` as fair sharing sees it
    /// (`sharing::shares` over the store's holdings): (pool GPUs borrowed beyond its
    /// guarantee, weight), by team index; None for a team without a quota of the model.
    pub fn shares(&mut self, gpu_type: &str, t: i64) -> anyhow::Result<Vec<Option<(i64, i64)>>> {
        let gpn = self.gpus_per_node[gpu_type];
        let held = scheduling::holdings(self.conn, gpu_type, t, Exclude::default())?;
        let mut out = vec![None; self.tenants.len()];
        for s in sharing::shares(self.conn, gpu_type, &held, t, gpn)? {
            if let Some(&team) = self.team_of.get(&s.tenant_id) {
                out[team] = Some((s.borrowed(), s.weight));
            }
        }
        Ok(out)
    }

    /// Whether the other teams' lending limits leave `r`'s pool nodes free at its start:
    /// the control plane's check of a cluster that takes pool nodes without a reservation
    /// (`sharing::Lendable` of the free pool GPUs then, over `sharing::shares`).
    fn within_lending_limits(&self, r: &ReservationRow) -> anyhow::Result<bool> {
        if !self.lending_limits || r.pool_nodes == 0 {
            return Ok(true);
        }
        let t = r.start_time;
        let gpn = self.gpus_per_node[&r.gpu_type];
        let held = scheduling::holdings(self.conn, &r.gpu_type, t, Exclude::default())?;
        let cap = scheduling::capacity(self.conn, &r.gpu_type, &held)?;
        let free = cap.free_pool(t, Some(t + 1)).saturating_mul(gpn);
        let shares = sharing::shares(self.conn, &r.gpu_type, &held, t, gpn)?;
        let lendable = sharing::Lendable::of(free, &shares, &r.tenant_id);
        Ok(r.pool_nodes.saturating_mul(gpn) <= lendable.gpus())
    }

    /// The reservation the control plane admits for the job, not yet recorded; None when
    /// it refuses (short of quota or capacity, or of what other teams' lending limits
    /// leave).
    fn place(
        &mut self,
        team: usize,
        gpu_type: &str,
        gpus: i64,
        start: i64,
        end: i64,
    ) -> anyhow::Result<Option<ReservationRow>> {
        let gpn = self.gpus_per_node[gpu_type];
        let (tenant_id, tenant_name) = &self.tenants[team];
        *self.next_id += 1;
        let mut r = ReservationRow {
            id: format!("job-{:012}", self.next_id),
            tenant_id: tenant_id.clone(),
            gpu_type: gpu_type.to_string(),
            node_count: (gpus + gpn - 1) / gpn,
            start_time: start,
            end_time: end,
            allow_on_demand: self.allow_on_demand[team],
            pool_nodes: 0,
            on_demand_nodes: 0,
        };
        let none = Split {
            pool: 0,
            on_demand: 0,
        };
        match reservations::place(
            self.conn,
            tenant_name,
            &mut r,
            Exclude::default(),
            none,
            start,
        ) {
            Ok(()) if self.within_lending_limits(&r)? => Ok(Some(r)),
            Ok(()) | Err(Error::Precondition(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The fleet's hardware as the control plane's fleet file, for its seeding.
fn hardware(fleet: &Fleet) -> FleetFile {
    let group = |gpu_type: &str, nodes: i64, gpus_per_node: i64| NodeGroup {
        gpu_type: gpu_type.to_string(),
        nodes: nodes as u32,
        gpus_per_node: gpus_per_node as u32,
        driver_version: DEFAULT_DRIVER.to_string(),
        cuda_version: DEFAULT_CUDA.to_string(),
        bus_bandwidth_gbps: None,
        cpus_per_node: None,
        memory_mib_per_node: None,
        load_test_min_fraction: None,
        load_test_skip: None,
        load_test_burn_seconds: None,
    };
    let of = |nodes: fn(&crate::fleet::Model) -> i64| {
        fleet
            .models
            .iter()
            .filter(|m| nodes(m) > 0)
            .map(|m| group(&m.gpu_type, nodes(m), m.gpus_per_node))
            .collect()
    };
    FleetFile {
        drivers: Vec::new(),
        pool: of(|m| m.pool_nodes),
        on_demand: of(|m| m.on_demand_nodes),
    }
}
