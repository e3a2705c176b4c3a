//! `skiff partition reassign | plan` and `skiff node drain | remove`: moving
//! replicas between nodes over the Kafka APIs (AlterPartitionReassignments,
//! ListPartitionReassignments, UnregisterBroker), so they work against any
//! cluster that serves them.
//!
//! Plans are Kafka's reassignment JSON (what `kafka-reassign-partitions.sh`
//! reads and writes):
//!
//! ```json
//! {"version":1,"partitions":[{"topic":"orders","partition":0,"replicas":[2,3,4]}]}
//! ```
//!
//! `generate` makes one from the current layout: replicas on nodes that are
//! not in the node list move (in place, so a moved preferred leader is
//! replaced by its successor), then, when balancing, replicas move from the
//! most loaded node to the least loaded until they differ by at most one, and
//! preferred leaders are spread the same way. Racks are kept apart where the
//! choice allows. It moves as little as that takes: a balanced cluster gets an
//! empty plan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
    UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};

use crate::admin_client::AdminClient;
use crate::config::{FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS};

/// A Kafka error with the server's message, if it sent one.
fn refusal(e: ResponseError, message: Option<&str>) -> String {
    match message {
        Some(m) => format!("{e}: {m}"),
        None => e.to_string(),
    }
}

/// Kafka's reassignment plan file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub version: u32,
    pub partitions: Vec<PlannedPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPartition {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<i32>,
    /// Kafka's per-replica log directories: one directory per node here, so
    /// only "any" (or nothing) is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_dirs: Vec<String>,
}

impl Plan {
    pub fn new(partitions: Vec<PlannedPartition>) -> Self {
        Plan {
            version: 1,
            partitions,
        }
    }

    /// Reads and checks a plan file.
    pub fn read(path: &Path) -> anyhow::Result<Plan> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the plan {}", path.display()))?;
        let plan: Plan = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a reassignment plan", path.display()))?;
        plan.check()
            .with_context(|| format!("the plan {}", path.display()))?;
        Ok(plan)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.version != 1 {
            bail!("version {} (only 1 is known)", self.version);
        }
        let mut seen = BTreeSet::new();
        for p in &self.partitions {
            let name = format!("{}-{}", p.topic, p.partition);
            if !seen.insert((p.topic.as_str(), p.partition)) {
                bail!("{name} appears twice");
            }
            if p.partition < 0 {
                bail!("{name}: a partition index is not negative");
            }
            if p.replicas.is_empty() {
                bail!("{name}: no replicas");
            }
            if p.replicas.iter().collect::<BTreeSet<_>>().len() != p.replicas.len() {
                bail!("{name}: {:?} names a node twice", p.replicas);
            }
            if !p.log_dirs.is_empty()
                && (p.log_dirs.len() != p.replicas.len() || p.log_dirs.iter().any(|d| d != "any"))
            {
                bail!("{name}: log_dirs must be \"any\" per replica (one log directory per node)");
            }
        }
        Ok(())
    }

    pub fn to_json(&self) -> String {
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A node the plan may place replicas on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanNode {
    pub id: i32,
    pub rack: Option<String>,
}

/// The partitions of `current` whose replicas should change so that every
/// replica is on one of `nodes` (with `rf` replicas each, or as many as now),
/// and, with `balance`, replicas and preferred leaders are spread evenly.
/// Deterministic: the same layout gives the same plan.
pub fn generate(
    current: &[PlannedPartition],
    nodes: &[PlanNode],
    rf: Option<usize>,
    balance: bool,
) -> anyhow::Result<Vec<PlannedPartition>> {
    if nodes.is_empty() {
        bail!("no node to place replicas on");
    }
    let ids: BTreeSet<i32> = nodes.iter().map(|n| n.id).collect();
    let rack: BTreeMap<i32, Option<&str>> =
        nodes.iter().map(|n| (n.id, n.rack.as_deref())).collect();
    let mut load: BTreeMap<i32, usize> = ids.iter().map(|n| (*n, 0)).collect();
    // Step 1: keep the replicas on listed nodes (holes where others were).
    let mut sets: Vec<Vec<Option<i32>>> = Vec::with_capacity(current.len());
    for p in current {
        let want = rf.unwrap_or(p.replicas.len());
        if want == 0 || want > ids.len() {
            bail!(
                "{}-{}: {want} replicas cannot be placed on {} nodes",
                p.topic,
                p.partition,
                ids.len()
            );
        }
        let mut set: Vec<Option<i32>> = p
            .replicas
            .iter()
            .map(|r| ids.contains(r).then_some(*r))
            .collect();
        // Fewer replicas: holes go first, then the last replicas.
        while set.len() > want {
            match set.iter().rposition(Option::is_none) {
                Some(hole) => {
                    set.remove(hole);
                }
                None => {
                    set.pop();
                }
            }
        }
        set.resize(want, None);
        for r in set.iter().flatten() {
            *load.entry(*r).or_default() += 1;
        }
        sets.push(set);
    }
    // Step 2: fill the holes with the least loaded nodes, racks apart.
    let mut placed: Vec<Vec<i32>> = Vec::with_capacity(sets.len());
    for set in sets {
        let mut filled: Vec<i32> = set.iter().flatten().copied().collect();
        let mut out = Vec::with_capacity(set.len());
        for slot in set {
            let node = match slot {
                Some(n) => n,
                None => {
                    let n = pick_least_loaded(&load, &rack, &filled, None)
                        .context("no node left for a replica")?;
                    filled.push(n);
                    *load.entry(n).or_default() += 1;
                    n
                }
            };
            out.push(node);
        }
        placed.push(out);
    }
    if balance {
        balance_replicas(&mut placed, &mut load, &rack);
        balance_leaders(&mut placed, &ids);
    }
    Ok(current
        .iter()
        .zip(placed)
        .filter(|(p, replicas)| p.replicas != *replicas)
        .map(|(p, replicas)| PlannedPartition {
            topic: p.topic.clone(),
            partition: p.partition,
            replicas,
            log_dirs: Vec::new(),
        })
        .collect())
}

/// The least loaded node not in `taken` (lowest id on ties), preferring a rack
/// none of `taken` (but `replacing`) is on.
fn pick_least_loaded(
    load: &BTreeMap<i32, usize>,
    rack: &BTreeMap<i32, Option<&str>>,
    taken: &[i32],
    replacing: Option<i32>,
) -> Option<i32> {
    let used: BTreeSet<&str> = taken
        .iter()
        .filter(|n| Some(**n) != replacing)
        .filter_map(|n| rack.get(n).copied().flatten())
        .collect();
    load.iter()
        .filter(|(n, _)| !taken.contains(n))
        .min_by_key(|(n, l)| {
            let rack_clash = rack
                .get(n)
                .copied()
                .flatten()
                .is_some_and(|r| used.contains(r));
            (rack_clash, **l, **n)
        })
        .map(|(n, _)| *n)
}

/// Moves replicas from the most to the least loaded node until loads differ
/// by at most one (or no partition allows the move). Each move lowers the
/// spread, so it ends.
fn balance_replicas(
    placed: &mut [Vec<i32>],
    load: &mut BTreeMap<i32, usize>,
    rack: &BTreeMap<i32, Option<&str>>,
) {
    let total: usize = load.values().sum();
    for _ in 0..=total {
        let Some((&most, &high)) = load.iter().max_by_key(|(n, l)| (**l, -**n)) else {
            return;
        };
        let Some((&least, &low)) = load.iter().min_by_key(|(n, l)| (**l, **n)) else {
            return;
        };
        if high <= low + 1 {
            return;
        }
        // A partition on `most` but not `least`; one where `least` keeps
        // racks apart first.
        let candidates = placed
            .iter()
            .enumerate()
            .filter(|(_, set)| set.contains(&most) && !set.contains(&least));
        let mut chosen = None;
        for (i, set) in candidates {
            let clash = {
                let others: BTreeSet<&str> = set
                    .iter()
                    .filter(|n| **n != most)
                    .filter_map(|n| rack.get(n).copied().flatten())
                    .collect();
                rack.get(&least)
                    .copied()
                    .flatten()
                    .is_some_and(|r| others.contains(r))
            };
            if !clash {
                chosen = Some(i);
                break;
            }
            chosen.get_or_insert(i);
        }
        let Some(i) = chosen else {
            return;
        };
        for r in placed[i].iter_mut() {
            if *r == most {
                *r = least;
            }
        }
        *load.entry(most).or_default() -= 1;
        *load.entry(least).or_default() += 1;
    }
}

/// Spreads preferred leaders (each partition's first replica) so that no
/// node is preferred for more than one partition above another, by swapping
/// replicas' order within partitions.
fn balance_leaders(placed: &mut [Vec<i32>], ids: &BTreeSet<i32>) {
    let mut lead: BTreeMap<i32, usize> = ids.iter().map(|n| (*n, 0)).collect();
    for set in placed.iter() {
        if let Some(first) = set.first() {
            *lead.entry(*first).or_default() += 1;
        }
    }
    for _ in 0..=placed.len() {
        let mut moved = false;
        // The most preferred node hands one partition to the least preferred
        // node that replicates it.
        let mut by_load: Vec<(i32, usize)> = lead.iter().map(|(n, l)| (*n, *l)).collect();
        by_load.sort_by_key(|(n, l)| (std::cmp::Reverse(*l), *n));
        'search: for &(most, high) in &by_load {
            for set in placed.iter_mut() {
                if set.first() != Some(&most) {
                    continue;
                }
                let better = set
                    .iter()
                    .enumerate()
                    .skip(1)
                    .filter(|(_, n)| lead.get(n).is_some_and(|l| *l + 1 < high))
                    .min_by_key(|(_, n)| (lead.get(n).copied().unwrap_or(0), **n));
                if let Some((pos, &n)) = better {
                    set.swap(0, pos);
                    *lead.entry(most).or_default() -= 1;
                    *lead.entry(n).or_default() += 1;
                    moved = true;
                    break 'search;
                }
            }
        }
        if !moved {
            return;
        }
    }
}

/// The current replicas of every partition of `topics` (all topics: `None`),
/// and the nodes the cluster lists.
pub fn layout(
    client: &mut AdminClient,
    topics: Option<Vec<String>>,
) -> anyhow::Result<(Vec<PlannedPartition>, Vec<PlanNode>)> {
    let metadata = client.metadata(topics)?;
    let mut partitions = Vec::new();
    for t in &metadata.topics {
        let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
        if let Some(e) = ResponseError::try_from_code(t.error_code) {
            bail!("topic {name}: {e}");
        }
        if t.is_internal {
            continue;
        }
        for p in &t.partitions {
            partitions.push(PlannedPartition {
                topic: name.clone(),
                partition: p.partition_index,
                replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                log_dirs: Vec::new(),
            });
        }
    }
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let nodes = metadata
        .brokers
        .iter()
        .map(|b| PlanNode {
            id: b.node_id.0,
            rack: b.rack.as_ref().map(|r| r.to_string()),
        })
        .collect();
    Ok((partitions, nodes))
}

/// One partition's answer to a reassignment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub topic: String,
    pub partition: i32,
    /// `None`: accepted.
    pub error: Option<String>,
}

/// Sends AlterPartitionReassignments for `entries` (`None` replicas:
/// cancel); each partition's answer.
fn alter(
    client: &mut AdminClient,
    entries: &[(String, i32, Option<Vec<i32>>)],
) -> anyhow::Result<Vec<Outcome>> {
    let mut by_topic: BTreeMap<&str, Vec<ReassignablePartition>> = BTreeMap::new();
    for (topic, partition, replicas) in entries {
        by_topic.entry(topic).or_default().push(
            ReassignablePartition::default()
                .with_partition_index(*partition)
                .with_replicas(
                    replicas
                        .as_ref()
                        .map(|r| r.iter().copied().map(BrokerId).collect()),
                ),
        );
    }
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(60_000)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(name, partitions)| {
                    ReassignableTopic::default()
                        .with_name(TopicName(StrBytes::from_string(name.to_string())))
                        .with_partitions(partitions)
                })
                .collect(),
        );
    let response: AlterPartitionReassignmentsResponse = client.call(&request, 0)?;
    if let Some(e) = ResponseError::try_from_code(response.error_code) {
        bail!("{}", refusal(e, response.error_message.as_deref()));
    }
    Ok(response
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Outcome {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                error: ResponseError::try_from_code(p.error_code)
                    .map(|e| refusal(e, p.error_message.as_deref())),
            })
        })
        .collect())
}

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

/// IncrementalAlterConfigs on one resource: `Some` sets, `None` deletes.
fn alter_configs(
    client: &mut AdminClient,
    resource_type: i8,
    name: &str,
    ops: &[(&str, Option<String>)],
) -> anyhow::Result<()> {
    let resource = AlterConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_string(name.to_string()))
        .with_configs(
            ops.iter()
                .map(|(k, v)| {
                    AlterableConfig::default()
                        .with_name(StrBytes::from_string(k.to_string()))
                        .with_config_operation(if v.is_some() { 0 } else { 1 })
                        .with_value(v.clone().map(StrBytes::from_string))
                })
                .collect(),
        );
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![resource]);
    let response: IncrementalAlterConfigsResponse = client.call(&request, 1)?;
    for r in response.responses {
        if let Some(e) = ResponseError::try_from_code(r.error_code) {
            bail!(
                "altering configs of {name:?}: {}",
                refusal(e, r.error_message.as_deref())
            );
        }
    }
    Ok(())
}

/// The topic throttle lists for moving `current` to `plan` (Kafka's
/// reassignment tool's): per topic, the leader side names every current
/// replica of a moving partition (whichever leads serves the new ones), the
/// follower side the replicas being added.
fn throttled_replicas(
    current: &[PlannedPartition],
    plan: &Plan,
) -> BTreeMap<String, (String, String)> {
    let mut lists: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for p in &plan.partitions {
        let Some(c) = current
            .iter()
            .find(|c| c.topic == p.topic && c.partition == p.partition)
        else {
            continue;
        };
        let entry = lists.entry(p.topic.clone()).or_default();
        let adding: Vec<i32> = p
            .replicas
            .iter()
            .copied()
            .filter(|r| !c.replicas.contains(r))
            .collect();
        if adding.is_empty() {
            continue;
        }
        entry
            .0
            .extend(c.replicas.iter().map(|r| format!("{}:{r}", p.partition)));
        entry
            .1
            .extend(adding.iter().map(|r| format!("{}:{r}", p.partition)));
    }
    lists
        .into_iter()
        .filter(|(_, (l, f))| !l.is_empty() || !f.is_empty())
        .map(|(t, (l, f))| (t, (l.join(","), f.join(","))))
        .collect()
}

/// Removes the throttles a plan's start set: the cluster-wide rates and the
/// plan's topics' throttled replica lists.
pub fn remove_throttle(bootstrap: &str, plan: &Plan) -> anyhow::Result<()> {
    let mut client = AdminClient::connect(bootstrap)?;
    alter_configs(
        &mut client,
        RESOURCE_BROKER,
        "",
        &[(LEADER_RATE, None), (FOLLOWER_RATE, None)],
    )?;
    let topics: BTreeSet<&str> = plan.partitions.iter().map(|p| p.topic.as_str()).collect();
    for topic in topics {
        alter_configs(
            &mut client,
            RESOURCE_TOPIC,
            topic,
            &[(LEADER_REPLICAS, None), (FOLLOWER_REPLICAS, None)],
        )?;
    }
    Ok(())
}

/// Starts the plan's moves (under a replication throttle of `throttle`
/// bytes/s when given); returns each partition's answer and the plan that
/// puts the partitions back where they are now (print it first: it is the
/// way back).
pub fn execute(
    bootstrap: &str,
    plan: &Plan,
    throttle: Option<u64>,
) -> anyhow::Result<(Vec<Outcome>, Plan)> {
    let mut client = AdminClient::connect(bootstrap)?;
    let topics: BTreeSet<String> = plan.partitions.iter().map(|p| p.topic.clone()).collect();
    let (current, _) = layout(&mut client, Some(topics.into_iter().collect()))?;
    let now: BTreeMap<(&str, i32), &PlannedPartition> = current
        .iter()
        .map(|p| ((p.topic.as_str(), p.partition), p))
        .collect();
    let mut rollback = Vec::new();
    for p in &plan.partitions {
        let Some(c) = now.get(&(p.topic.as_str(), p.partition)) else {
            bail!("{}-{} does not exist", p.topic, p.partition);
        };
        rollback.push((*c).clone());
    }
    if let Some(rate) = throttle {
        if rate == 0 {
            bail!("a throttle of 0 bytes/s would never finish");
        }
        for (topic, (leaders, followers)) in throttled_replicas(&current, plan) {
            alter_configs(
                &mut client,
                RESOURCE_TOPIC,
                &topic,
                &[
                    (LEADER_REPLICAS, Some(leaders)),
                    (FOLLOWER_REPLICAS, Some(followers)),
                ],
            )?;
        }
        alter_configs(
            &mut client,
            RESOURCE_BROKER,
            "",
            &[
                (LEADER_RATE, Some(rate.to_string())),
                (FOLLOWER_RATE, Some(rate.to_string())),
            ],
        )?;
    }
    let entries: Vec<(String, i32, Option<Vec<i32>>)> = plan
        .partitions
        .iter()
        .map(|p| (p.topic.clone(), p.partition, Some(p.replicas.clone())))
        .collect();
    let outcomes = alter(&mut client, &entries)?;
    Ok((outcomes, Plan::new(rollback)))
}

/// Cancels the running reassignments of the plan's partitions.
pub fn cancel(bootstrap: &str, plan: &Plan) -> anyhow::Result<Vec<Outcome>> {
    let mut client = AdminClient::connect(bootstrap)?;
    let entries: Vec<(String, i32, Option<Vec<i32>>)> = plan
        .partitions
        .iter()
        .map(|p| (p.topic.clone(), p.partition, None))
        .collect();
    alter(&mut client, &entries)
}

/// A running reassignment as ListPartitionReassignments reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

/// Every running reassignment.
pub fn running(client: &mut AdminClient) -> anyhow::Result<Vec<Running>> {
    let request = ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000);
    let response: ListPartitionReassignmentsResponse = client.call(&request, 0)?;
    if let Some(e) = ResponseError::try_from_code(response.error_code) {
        bail!("{e}");
    }
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    Ok(response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Running {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                replicas: ids(&p.replicas),
                adding: ids(&p.adding_replicas),
                removing: ids(&p.removing_replicas),
            })
        })
        .collect())
}

/// Where each planned partition stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Done,
    Running(Running),
    /// Not moving, and not where the plan puts it (cancelled, or replaced).
    Differs(Vec<i32>),
    Missing,
}

pub fn verify(bootstrap: &str, plan: &Plan) -> anyhow::Result<Vec<(PlannedPartition, Progress)>> {
    let mut client = AdminClient::connect(bootstrap)?;
    let topics: BTreeSet<String> = plan.partitions.iter().map(|p| p.topic.clone()).collect();
    let (current, _) = layout(&mut client, Some(topics.into_iter().collect()))?;
    let moving: BTreeMap<(String, i32), Running> = running(&mut client)?
        .into_iter()
        .map(|r| ((r.topic.clone(), r.partition), r))
        .collect();
    let now: BTreeMap<(&str, i32), &PlannedPartition> = current
        .iter()
        .map(|p| ((p.topic.as_str(), p.partition), p))
        .collect();
    Ok(plan
        .partitions
        .iter()
        .map(|p| {
            let progress = if let Some(r) = moving.get(&(p.topic.clone(), p.partition)) {
                Progress::Running(r.clone())
            } else {
                match now.get(&(p.topic.as_str(), p.partition)) {
                    None => Progress::Missing,
                    Some(c) if c.replicas == p.replicas => Progress::Done,
                    Some(c) => Progress::Differs(c.replicas.clone()),
                }
            };
            (p.clone(), progress)
        })
        .collect())
}

/// `skiff node drain`: the plan that moves every replica off `node` onto the
/// other nodes (least loaded first, racks apart), and nothing else.
pub fn drain_plan(bootstrap: &str, node: i32) -> anyhow::Result<Plan> {
    let mut client = AdminClient::connect(bootstrap)?;
    let (current, nodes) = layout(&mut client, None)?;
    if !nodes.iter().any(|n| n.id == node) && !current.iter().any(|p| p.replicas.contains(&node)) {
        bail!("node {node} is not in the cluster's metadata and holds no replica");
    }
    let others: Vec<PlanNode> = nodes.into_iter().filter(|n| n.id != node).collect();
    let holding: Vec<PlannedPartition> = current
        .into_iter()
        .filter(|p| p.replicas.contains(&node))
        .collect();
    Ok(Plan::new(generate(&holding, &others, None, false)?))
}

/// Waits until none of the plan's partitions is moving any more, or
/// `timeout`; the ones still moving.
pub fn wait(bootstrap: &str, plan: &Plan, timeout: Duration) -> anyhow::Result<Vec<Running>> {
    let deadline = Instant::now() + timeout;
    let wanted: BTreeSet<(String, i32)> = plan
        .partitions
        .iter()
        .map(|p| (p.topic.clone(), p.partition))
        .collect();
    loop {
        let mut client = AdminClient::connect(bootstrap)?;
        let still: Vec<Running> = running(&mut client)?
            .into_iter()
            .filter(|r| wanted.contains(&(r.topic.clone(), r.partition)))
            .collect();
        if still.is_empty() || Instant::now() >= deadline {
            return Ok(still);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// UnregisterBroker: `node` leaves the cluster (refused while it runs or
/// holds replicas, with the reason).
pub fn unregister(bootstrap: &str, node: i32) -> anyhow::Result<()> {
    let mut client = AdminClient::connect(bootstrap)?;
    let request = UnregisterBrokerRequest::default().with_broker_id(BrokerId(node));
    let response: UnregisterBrokerResponse = client.call(&request, 0)?;
    if let Some(e) = ResponseError::try_from_code(response.error_code) {
        bail!("{}", refusal(e, response.error_message.as_deref()));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn part(topic: &str, partition: i32, replicas: &[i32]) -> PlannedPartition {
        PlannedPartition {
            topic: topic.into(),
            partition,
            replicas: replicas.to_vec(),
            log_dirs: Vec::new(),
        }
    }

    fn nodes(ids: &[i32]) -> Vec<PlanNode> {
        ids.iter()
            .map(|id| PlanNode {
                id: *id,
                rack: None,
            })
            .collect()
    }

    /// Applies a plan to a layout.
    fn apply(current: &[PlannedPartition], plan: &[PlannedPartition]) -> Vec<PlannedPartition> {
        current
            .iter()
            .map(|c| {
                plan.iter()
                    .find(|p| p.topic == c.topic && p.partition == c.partition)
                    .cloned()
                    .unwrap_or_else(|| c.clone())
            })
            .collect()
    }

    fn count(layout: &[PlannedPartition], first_only: bool) -> BTreeMap<i32, usize> {
        let mut out = BTreeMap::new();
        for p in layout {
            let replicas = if first_only {
                &p.replicas[..1]
            } else {
                &p.replicas[..]
            };
            for r in replicas {
                *out.entry(*r).or_default() += 1;
            }
        }
        out
    }

    /// Twelve partitions, RF 3, round robin over nodes 1-3.
    fn three_node_layout() -> Vec<PlannedPartition> {
        (0..12)
            .map(|i| {
                let a = i % 3;
                part("t", i, &[a + 1, (a + 1) % 3 + 1, (a + 2) % 3 + 1])
            })
            .collect()
    }

    #[test]
    fn a_new_node_gets_its_share_and_leaders_spread() {
        let current = three_node_layout();
        let plan = generate(&current, &nodes(&[1, 2, 3, 4]), None, true).unwrap();
        let after = apply(&current, &plan);
        let replicas = count(&after, false);
        assert_eq!(
            replicas.values().copied().collect::<Vec<_>>(),
            vec![9, 9, 9, 9]
        );
        let leaders = count(&after, true);
        assert_eq!(
            leaders.values().copied().collect::<Vec<_>>(),
            vec![3, 3, 3, 3]
        );
        // Each partition moved at most one replica (9 replicas move to node 4).
        for (c, a) in current.iter().zip(&after) {
            let moved = a
                .replicas
                .iter()
                .filter(|r| !c.replicas.contains(r))
                .count();
            assert!(moved <= 1, "{c:?} -> {a:?}");
            assert_eq!(a.replicas.len(), 3);
        }
        // Balanced already: nothing to do.
        assert!(generate(&after, &nodes(&[1, 2, 3, 4]), None, true)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_drain_moves_only_the_drained_nodes_replicas_in_place() {
        let current = three_node_layout();
        let mut with_four = current.clone();
        with_four.push(part("u", 0, &[4, 1, 2]));
        let holding: Vec<PlannedPartition> = with_four
            .iter()
            .filter(|p| p.replicas.contains(&2))
            .cloned()
            .collect();
        let plan = generate(&holding, &nodes(&[1, 3, 4]), None, false).unwrap();
        assert_eq!(plan.len(), holding.len());
        for (before, after) in holding.iter().zip(&plan) {
            assert!(!after.replicas.contains(&2));
            for (b, a) in before.replicas.iter().zip(&after.replicas) {
                if *b != 2 {
                    assert_eq!(
                        a, b,
                        "other replicas keep their place: {before:?} -> {after:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn racks_stay_apart_and_impossible_plans_are_refused() {
        let racked = vec![
            PlanNode {
                id: 1,
                rack: Some("a".into()),
            },
            PlanNode {
                id: 2,
                rack: Some("a".into()),
            },
            PlanNode {
                id: 3,
                rack: Some("b".into()),
            },
            PlanNode {
                id: 4,
                rack: Some("c".into()),
            },
        ];
        // Node 3 drained from [1, 3]: node 4 (rack c) beats node 2 (rack a, like 1).
        let plan = generate(&[part("t", 0, &[1, 3])], &racked, None, false).unwrap();
        assert!(plan.is_empty(), "nothing to move while node 3 is listed");
        let others: Vec<PlanNode> = racked.iter().filter(|n| n.id != 3).cloned().collect();
        let plan = generate(&[part("t", 0, &[1, 3])], &others, None, false).unwrap();
        assert_eq!(plan[0].replicas, vec![1, 4]);
        assert!(generate(&[part("t", 0, &[1, 2, 3])], &nodes(&[1, 2]), None, false).is_err());
        assert!(generate(&[part("t", 0, &[1])], &[], None, true).is_err());
        // A replication factor change.
        let plan = generate(&[part("t", 0, &[1])], &nodes(&[1, 2, 3]), Some(3), false).unwrap();
        assert_eq!(plan[0].replicas.len(), 3);
        assert_eq!(plan[0].replicas[0], 1);
    }

    #[test]
    fn throttles_name_the_current_replicas_and_the_added_ones() {
        let current = vec![
            part("t", 0, &[1, 2, 3]),
            part("t", 1, &[2, 3, 1]),
            part("u", 0, &[1]),
        ];
        let plan = Plan::new(vec![
            part("t", 0, &[4, 2, 3]),
            part("t", 1, &[3, 2, 1]),
            part("u", 0, &[1, 5]),
        ]);
        let lists = throttled_replicas(&current, &plan);
        assert_eq!(lists["t"], ("0:1,0:2,0:3".to_string(), "0:4".to_string()));
        assert_eq!(lists["u"], ("0:1".to_string(), "0:5".to_string()));
        assert_eq!(lists.len(), 2, "a reordering moves no data");
    }

    #[test]
    fn plan_files_are_kafkas_format_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        let text = r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3],"log_dirs":["any","any"]}]}"#;
        std::fs::write(&path, text).unwrap();
        let plan = Plan::read(&path).unwrap();
        assert_eq!(plan.partitions[0].replicas, vec![2, 3]);
        let round = Plan::new(vec![part("t", 0, &[2, 3])]).to_json();
        assert_eq!(
            round,
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]}]}"#
        );
        for bad in [
            r#"{"version":2,"partitions":[]}"#,
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[]}]}"#,
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,1]}]}"#,
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]},{"topic":"t","partition":0,"replicas":[2]}]}"#,
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1],"log_dirs":["/data"]}]}"#,
            r#"{"partitions":"nope"}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(Plan::read(&path).is_err(), "accepted {bad}");
        }
        assert!(Plan::read(&dir.path().join("missing.json")).is_err());
    }
}
