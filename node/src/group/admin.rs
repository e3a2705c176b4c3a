//! `skiff group list | describe | delete | reset-offsets | delete-offsets`:
//! consumer group administration over
//! the Kafka APIs (blocking, one request at a time), so it works against any
//! Kafka-compatible cluster: ListGroups goes to every broker, the rest to the
//! group's coordinator (FindCoordinator), log end offsets to partition leaders.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::{bail, Context};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    ListGroupsRequest, ListGroupsResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::admin_client::AdminClient;

/// One listed group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: String,
}

fn check(code: i16, what: &str) -> anyhow::Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Every broker's address, from the bootstrap's Metadata.
fn brokers(bootstrap: &str) -> anyhow::Result<BTreeMap<i32, String>> {
    let metadata = AdminClient::connect(bootstrap)?.metadata(Some(Vec::new()))?;
    Ok(metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect())
}

/// A connection to the coordinator of `group`.
fn coordinator(bootstrap: &str, group: &str) -> anyhow::Result<AdminClient> {
    let request = FindCoordinatorRequest::default()
        .with_key(s(group))
        .with_key_type(0);
    let response: FindCoordinatorResponse = AdminClient::connect(bootstrap)?.call(&request, 3)?;
    check(response.error_code, "finding the group coordinator")?;
    AdminClient::connect(&format!("{}:{}", response.host.as_str(), response.port))
        .context("connecting to the group coordinator")
}

pub fn list(bootstrap: &str) -> anyhow::Result<Vec<ListedGroup>> {
    let mut out = BTreeSet::new();
    for address in brokers(bootstrap)?.values() {
        let response: ListGroupsResponse =
            AdminClient::connect(address)?.call(&ListGroupsRequest::default(), 4)?;
        check(response.error_code, "listing groups")?;
        for g in response.groups {
            out.insert(ListedGroup {
                group_id: g.group_id.0.to_string(),
                protocol_type: g.protocol_type.to_string(),
                state: g.group_state.to_string(),
            });
        }
    }
    Ok(out.into_iter().collect())
}

pub fn delete(bootstrap: &str, group: &str) -> anyhow::Result<()> {
    let request = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]);
    let response: DeleteGroupsResponse = coordinator(bootstrap, group)?.call(&request, 2)?;
    for r in response.results {
        check(r.error_code, &format!("deleting group {group}"))?;
    }
    Ok(())
}

/// A member's assigned partitions, from a consumer-protocol assignment
/// (version, [topic, [partition]], user data); empty when it is not one.
pub fn decode_assignment(bytes: &[u8]) -> Vec<(String, Vec<i32>)> {
    fn parse(b: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
        let mut pos = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let slice = b.get(pos..pos.checked_add(n)?)?;
            pos += n;
            Some(slice)
        };
        let _version = i16::from_be_bytes(take(2)?.try_into().ok()?);
        let topics = i32::from_be_bytes(take(4)?.try_into().ok()?);
        let mut out = Vec::new();
        for _ in 0..topics.max(0) {
            let len = i16::from_be_bytes(take(2)?.try_into().ok()?);
            let name = String::from_utf8(take(usize::try_from(len).ok()?)?.to_vec()).ok()?;
            let count = i32::from_be_bytes(take(4)?.try_into().ok()?);
            let mut partitions = Vec::new();
            for _ in 0..count.max(0) {
                partitions.push(i32::from_be_bytes(take(4)?.try_into().ok()?));
            }
            out.push((name, partitions));
        }
        Some(out)
    }
    parse(bytes).unwrap_or_default()
}

/// The describe report: state, members with their assignments, and per
/// partition the committed offset, log end offset and lag.
pub fn describe(bootstrap: &str, group: &str) -> anyhow::Result<String> {
    let mut client = coordinator(bootstrap, group)?;
    let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
    let described: DescribeGroupsResponse = client.call(&request, 4)?;
    let Some(g) = described.groups.into_iter().next() else {
        bail!("no answer for group {group}");
    };
    check(g.error_code, &format!("describing group {group}"))?;
    let fetch = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(None);
    let fetched: OffsetFetchResponse = client.call(&fetch, 7)?;
    check(
        fetched.error_code,
        &format!("fetching offsets of group {group}"),
    )?;

    let consumer = g.protocol_type.as_str() == "consumer";
    // partition -> (committed offset, owning member)
    let mut rows: BTreeMap<(String, i32), (Option<i64>, Option<String>)> = BTreeMap::new();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Group: {group}\tState: {}\tProtocolType: {}\tProtocol: {}\tMembers: {}",
        g.group_state.as_str(),
        g.protocol_type.as_str(),
        g.protocol_data.as_str(),
        g.members.len()
    );
    for m in &g.members {
        let assigned = if consumer {
            decode_assignment(&m.member_assignment)
        } else {
            Vec::new()
        };
        let shown: Vec<String> = assigned
            .iter()
            .map(|(t, ps)| {
                let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
                format!("{t}:{}", ps.join(","))
            })
            .collect();
        let _ = writeln!(
            out,
            "\tMember: {}\tClientId: {}\tHost: {}\tAssignment: {}",
            m.member_id.as_str(),
            m.client_id.as_str(),
            m.client_host.as_str(),
            if shown.is_empty() {
                "-".to_string()
            } else {
                shown.join(" ")
            }
        );
        for (t, ps) in assigned {
            for p in ps {
                rows.entry((t.clone(), p)).or_default().1 = Some(m.member_id.to_string());
            }
        }
    }
    for t in &fetched.topics {
        for p in &t.partitions {
            if p.committed_offset >= 0 {
                rows.entry((t.name.0.to_string(), p.partition_index))
                    .or_default()
                    .0 = Some(p.committed_offset);
            }
        }
    }
    let ends = log_end_offsets(bootstrap, rows.keys().cloned().collect())?;
    let _ = writeln!(
        out,
        "TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tCONSUMER-ID"
    );
    for ((topic, partition), (committed, owner)) in rows {
        let end = ends.get(&(topic.clone(), partition)).copied();
        let dash = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
        let lag = match (committed, end) {
            (Some(c), Some(e)) => Some((e - c).max(0)),
            _ => None,
        };
        let _ = writeln!(
            out,
            "{topic}\t{partition}\t{}\t{}\t{}\t{}",
            dash(committed),
            dash(end),
            dash(lag),
            owner.unwrap_or_else(|| "-".to_string())
        );
    }
    Ok(out)
}

/// Where `reset_offsets` moves a group's committed offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    /// An offset, clamped to the partition's earliest..latest.
    Offset(i64),
    /// The first offset whose timestamp is at or after this (ms since the
    /// epoch); the log end when there is none.
    Timestamp(i64),
    /// The committed offset moved by this much (clamped); earliest when none.
    ShiftBy(i64),
}

/// One partition of a reset plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedOffset {
    pub topic: String,
    pub partition: i32,
    pub current: Option<i64>,
    pub new: i64,
}

/// The partitions of `topic` (all of them when `partitions` is empty).
pub fn topic_partitions(
    bootstrap: &str,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<Vec<(String, i32)>> {
    let metadata = AdminClient::connect(bootstrap)?.metadata(Some(vec![topic.to_string()]))?;
    let t = metadata
        .topics
        .first()
        .context("the metadata answer lists no topic")?;
    check(t.error_code, &format!("topic {topic}"))?;
    let all: BTreeSet<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    if let Some(p) = partitions.iter().find(|p| !all.contains(p)) {
        bail!("topic {topic} has no partition {p} (it has {})", all.len());
    }
    let chosen: Vec<i32> = if partitions.is_empty() {
        all.into_iter().collect()
    } else {
        partitions.to_vec()
    };
    Ok(chosen.into_iter().map(|p| (topic.to_string(), p)).collect())
}

/// Kafka's `kafka-consumer-groups --reset-offsets`: the new committed offset
/// of each partition (what `--execute` commits; without it, only shown).
/// Only an empty (inactive) group may be reset, as in Kafka: a live member
/// would commit over it.
pub fn reset_offsets(
    bootstrap: &str,
    group: &str,
    partitions: Vec<(String, i32)>,
    to: ResetTo,
    execute: bool,
) -> anyhow::Result<Vec<PlannedOffset>> {
    let mut client = coordinator(bootstrap, group)?;
    let described: DescribeGroupsResponse = client.call(
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]),
        4,
    )?;
    if let Some(g) = described.groups.first() {
        check(g.error_code, &format!("describing group {group}"))?;
        let state = g.group_state.as_str();
        if !matches!(state, "Empty" | "Dead") {
            bail!("group {group} is {state}: offsets can only be reset while it has no members (stop its consumers first)");
        }
    }
    let fetched: OffsetFetchResponse = client.call(
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(None),
        7,
    )?;
    check(
        fetched.error_code,
        &format!("fetching offsets of group {group}"),
    )?;
    let mut current: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for t in &fetched.topics {
        for p in &t.partitions {
            if p.committed_offset >= 0 {
                current.insert(
                    (t.name.0.to_string(), p.partition_index),
                    p.committed_offset,
                );
            }
        }
    }
    let earliest = offsets_at(bootstrap, partitions.clone(), -2)?;
    let latest = offsets_at(bootstrap, partitions.clone(), -1)?;
    let at = match to {
        ResetTo::Timestamp(ts) => offsets_at(bootstrap, partitions.clone(), ts)?,
        _ => BTreeMap::new(),
    };
    let mut plan = Vec::with_capacity(partitions.len());
    for key in partitions {
        let (Some(&low), Some(&high)) = (earliest.get(&key), latest.get(&key)) else {
            bail!("no offsets for {}-{} (no leader?)", key.0, key.1);
        };
        let committed = current.get(&key).copied();
        let new = match to {
            ResetTo::Earliest => low,
            ResetTo::Latest => high,
            ResetTo::Offset(o) => o,
            ResetTo::Timestamp(_) => at.get(&key).copied().filter(|o| *o >= 0).unwrap_or(high),
            ResetTo::ShiftBy(n) => committed.map_or(low, |c| c.saturating_add(n)),
        }
        .clamp(low, high);
        plan.push(PlannedOffset {
            topic: key.0,
            partition: key.1,
            current: committed,
            new,
        });
    }
    if execute && !plan.is_empty() {
        let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for p in &plan {
            by_topic.entry(&p.topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(p.partition)
                    .with_committed_offset(p.new)
                    .with_committed_leader_epoch(-1),
            );
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(s(""))
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default()
                            .with_name(TopicName(s(t)))
                            .with_partitions(ps)
                    })
                    .collect(),
            );
        let response: OffsetCommitResponse = client.call(&request, 8)?;
        for t in response.topics {
            for p in t.partitions {
                check(
                    p.error_code,
                    &format!("committing {}-{}", t.name.0.as_str(), p.partition_index),
                )?;
            }
        }
    }
    Ok(plan)
}

/// OffsetDelete: removes the group's committed offsets of `partitions`.
/// Returns the partitions refused, with why (GROUP_SUBSCRIBED_TO_TOPIC).
pub fn delete_offsets(
    bootstrap: &str,
    group: &str,
    partitions: Vec<(String, i32)>,
) -> anyhow::Result<Vec<(String, i32, ResponseError)>> {
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        by_topic.entry(t).or_default().push(p);
    }
    let request = OffsetDeleteRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    OffsetDeleteRequestTopic::default()
                        .with_name(TopicName(s(&t)))
                        .with_partitions(
                            ps.into_iter()
                                .map(|p| {
                                    OffsetDeleteRequestPartition::default().with_partition_index(p)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    let response: OffsetDeleteResponse = coordinator(bootstrap, group)?.call(&request, 0)?;
    check(
        response.error_code,
        &format!("deleting offsets of group {group}"),
    )?;
    let mut refused = Vec::new();
    for t in response.topics {
        for p in t.partitions {
            if let Some(e) = ResponseError::try_from_code(p.error_code) {
                refused.push((t.name.0.to_string(), p.partition_index, e));
            }
        }
    }
    Ok(refused)
}

/// Log end offsets (ListOffsets latest) from each partition's leader.
fn log_end_offsets(
    bootstrap: &str,
    partitions: Vec<(String, i32)>,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    offsets_at(bootstrap, partitions, -1)
}

/// ListOffsets at `timestamp` (-1 latest, -2 earliest, else ms since the
/// epoch) from each partition's leader; a partition whose leader did not
/// answer is missing.
fn offsets_at(
    bootstrap: &str,
    partitions: Vec<(String, i32)>,
    timestamp: i64,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut out = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let topics: BTreeSet<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
    let metadata = AdminClient::connect(bootstrap)?.metadata(Some(topics.into_iter().collect()))?;
    let addresses: BTreeMap<i32, String> = metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    let mut leaders: BTreeMap<(String, i32), i32> = BTreeMap::new();
    for t in &metadata.topics {
        let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
        for p in &t.partitions {
            leaders.insert((name.clone(), p.partition_index), p.leader_id.0);
        }
    }
    let mut by_leader: BTreeMap<i32, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for (topic, partition) in partitions {
        if let Some(leader) = leaders.get(&(topic.clone(), partition)) {
            by_leader
                .entry(*leader)
                .or_default()
                .entry(topic)
                .or_default()
                .push(partition);
        }
    }
    for (leader, topics) in by_leader {
        let Some(address) = addresses.get(&leader) else {
            continue;
        };
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        ListOffsetsTopic::default()
                            .with_name(TopicName(s(&t)))
                            .with_partitions(
                                ps.into_iter()
                                    .map(|p| {
                                        ListOffsetsPartition::default()
                                            .with_partition_index(p)
                                            .with_timestamp(timestamp)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        let response: ListOffsetsResponse = AdminClient::connect(address)?.call(&request, 5)?;
        for t in response.topics {
            for p in t.partitions {
                if p.error_code == 0 {
                    out.insert((t.name.0.to_string(), p.partition_index), p.offset);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_assignments_decode() {
        // v0: [("orders", [0, 2])], null user data.
        let bytes = [
            0, 0, 0, 0, 0, 1, 0, 6, b'o', b'r', b'd', b'e', b'r', b's', 0, 0, 0, 2, 0, 0, 0, 0, 0,
            0, 0, 2, 0xff, 0xff, 0xff, 0xff,
        ];
        assert_eq!(
            decode_assignment(&bytes),
            vec![("orders".to_string(), vec![0, 2])]
        );
        assert!(decode_assignment(&bytes[..9]).is_empty());
        assert!(decode_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_empty());
    }
}
