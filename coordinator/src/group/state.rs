//! The classic group membership protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) as a pure, deterministic state machine: no I/O, no clock, no
//! randomness. Time comes in as `now_ms`, fresh member ids come in with the
//! request, and what the caller must do (answer waiting members, store the
//! group) comes out as [`Effects`]. The glue in `coordinator.rs` owns the
//! sockets, timers and the log.
//!
//! The rules are Kafka's (`GroupCoordinator`/`GroupMetadata`, classic protocol):
//!
//! ```text
//!   Empty --join--> PreparingRebalance --all joined / rebalance timeout-->
//!   CompletingRebalance --leader SyncGroup--> Stable
//!   Stable|CompletingRebalance --join (new member, leader, changed metadata),
//!       leave, session timeout--> PreparingRebalance
//!   PreparingRebalance --join phase ends with no member--> Empty
//! ```
//!
//! Invariants (checked by `check_invariants` in tests):
//! - `leader` is a member, or `None` exactly when there are no members;
//! - `Empty` has no members; `static_members` maps instance ids to live members;
//! - a member waits for a JoinGroup answer only in `PreparingRebalance` and for
//!   a SyncGroup answer only in `CompletingRebalance`;
//! - the generation only grows; it moves when a join phase ends.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::ResponseError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

/// The topics of a ConsumerProtocolSubscription (every version starts with
/// `version: i16, topics: [string]`, not flexible); `None` if it does not
/// parse.
pub fn subscription_topics(bytes: &[u8]) -> Option<Vec<String>> {
    fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = r.split_at_checked(n)?;
        *r = rest;
        Some(head)
    }
    let mut r = bytes;
    take(&mut r, 2)?; // version
    let count = i32::from_be_bytes(take(&mut r, 4)?.try_into().ok()?);
    let count = usize::try_from(count).ok().filter(|c| *c <= r.len() / 2)?;
    let mut topics = Vec::with_capacity(count);
    for _ in 0..count {
        let len = i16::from_be_bytes(take(&mut r, 2)?.try_into().ok()?);
        let name = take(&mut r, usize::try_from(len).ok()?)?;
        topics.push(std::str::from_utf8(name).ok()?.to_string());
    }
    Some(topics)
}

impl GroupState {
    /// Kafka's state names (DescribeGroups, ListGroups).
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// The node settings the protocol needs (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `group.min.session.timeout.ms`
    pub session_timeout_ms_min: i32,
    /// `group.max.session.timeout.ms`
    pub session_timeout_ms_max: i32,
    /// `group.initial.rebalance.delay.ms`: how long the first join phase of an
    /// empty group waits for more members.
    pub initial_rebalance_delay_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// In the member's order of preference.
    pub protocols: Vec<Protocol>,
    pub assignment: Bytes,
    awaiting_join: bool,
    awaiting_sync: bool,
    /// Removed at this time unless it heartbeats (or waits for an answer).
    session_deadline_ms: i64,
}

impl Member {
    /// This member's metadata for `protocol` (empty if it has none).
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|p| p.name == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }
}

/// A JoinGroup as the state machine sees it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    /// Empty for a member joining for the first time.
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    /// JoinGroup v4+: a new member first gets its id with MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
    /// The id a new member gets (the caller makes it unique).
    pub fresh_member_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    pub error: Option<ResponseError>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member with its metadata, for the leader only.
    pub members: Vec<JoinedMember>,
}

impl JoinResult {
    pub fn error(error: ResponseError, member_id: &str) -> JoinResult {
        JoinResult {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResult {
    pub error: Option<ResponseError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    pub fn error(error: ResponseError) -> SyncResult {
        SyncResult {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// The answer to a JoinGroup or SyncGroup call: now, or later through
/// [`Effects`] (possibly the effects of this very call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<T> {
    Now(T),
    /// The member (with this id) waits for its answer.
    Wait(String),
}

/// What the caller must do after a call, in this order: when `persist` is set,
/// store the group ([`Group::stored`]) durably first; then send the answers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pub joins: Vec<(String, JoinResult)>,
    pub syncs: Vec<(String, SyncResult)>,
    /// Kafka stores the group when a leader's assignment completes a rebalance
    /// and when the group becomes empty.
    pub persist: bool,
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.joins.is_empty() && self.syncs.is_empty() && !self.persist
    }
}

/// A member as stored in `__consumer_offsets` (GroupMetadataValue.members).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A group as stored in `__consumer_offsets` (GroupMetadataValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp_ms: i64,
    pub members: Vec<StoredMember>,
}

#[derive(Debug, Clone)]
pub struct Group {
    group_id: String,
    limits: Limits,
    state: GroupState,
    generation_id: i32,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// group.instance.id -> member id.
    static_members: BTreeMap<String, String>,
    /// Ids handed out with MEMBER_ID_REQUIRED, with the time they lapse.
    pending_members: BTreeMap<String, i64>,
    /// PreparingRebalance: the join phase ends here with whoever rejoined.
    rebalance_deadline_ms: i64,
    /// PreparingRebalance of a group that was empty: the phase lasts at least
    /// until here (`group.initial.rebalance.delay.ms`, pushed back by each new
    /// member, never past `initial_delay_cap_ms`).
    initial_delay_until_ms: Option<i64>,
    initial_delay_cap_ms: i64,
    state_timestamp_ms: i64,
}

impl Group {
    pub fn new(group_id: impl Into<String>, limits: Limits, now_ms: i64) -> Group {
        Group {
            group_id: group_id.into(),
            limits,
            state: GroupState::Empty,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            pending_members: BTreeMap::new(),
            rebalance_deadline_ms: 0,
            initial_delay_until_ms: None,
            initial_delay_cap_ms: 0,
            state_timestamp_ms: now_ms,
        }
    }

    /// A group loaded from its stored metadata: Stable with its members (each
    /// must heartbeat within its session timeout from now), or Empty.
    pub fn loaded(
        group_id: impl Into<String>,
        limits: Limits,
        stored: StoredGroup,
        now_ms: i64,
    ) -> Group {
        let mut group = Group::new(group_id, limits, now_ms);
        if stored.current_state_timestamp_ms >= 0 {
            group.state_timestamp_ms = stored.current_state_timestamp_ms;
        }
        group.generation_id = stored.generation;
        group.protocol_type = Some(stored.protocol_type).filter(|t| !t.is_empty());
        if stored.members.is_empty() {
            return group;
        }
        let protocol = stored.protocol.clone().unwrap_or_default();
        for m in stored.members {
            if let Some(instance) = &m.group_instance_id {
                group
                    .static_members
                    .insert(instance.clone(), m.member_id.clone());
            }
            group.members.insert(
                m.member_id.clone(),
                Member {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: vec![Protocol {
                        name: protocol.clone(),
                        metadata: m.subscription,
                    }],
                    assignment: m.assignment,
                    awaiting_join: false,
                    awaiting_sync: false,
                    session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
                },
            );
        }
        group.protocol_name = stored.protocol;
        group.leader = stored
            .leader
            .filter(|l| group.members.contains_key(l))
            .or_else(|| group.members.keys().next().cloned());
        group.state = GroupState::Stable;
        group
    }

    /// What Kafka stores for this group.
    pub fn stored(&self) -> StoredGroup {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        StoredGroup {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation_id,
            protocol: self.protocol_name.clone(),
            leader: self.leader.clone(),
            current_state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| StoredMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    pub fn group_id(&self) -> &str {
        &self.group_id
    }
    pub fn state(&self) -> GroupState {
        self.state
    }
    pub fn generation_id(&self) -> i32 {
        self.generation_id
    }
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }
    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }
    pub fn is_empty(&self) -> bool {
        self.state == GroupState::Empty
    }
    /// The topics a consumer group's members subscribe to (protocol type
    /// `consumer`), from each member's ConsumerProtocolSubscription for the
    /// group's protocol. `None` when that cannot be known: another protocol
    /// type, no protocol chosen yet, or metadata that does not parse.
    pub fn subscribed_topics(&self) -> Option<std::collections::BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol_name.as_deref()?;
        let mut out = std::collections::BTreeSet::new();
        for m in self.members.values() {
            out.extend(subscription_topics(&m.metadata(protocol))?);
        }
        Some(out)
    }
    /// Whether a committed offset is past `offsets.retention.minutes` (Kafka's
    /// KIP-211 rule): a group that only stores offsets expires each offset
    /// from its commit; a consumer group only once it is empty, from the time
    /// it became empty; a group with members keeps its offsets.
    pub fn offset_expired(&self, now_ms: i64, retention_ms: i64, commit_timestamp_ms: i64) -> bool {
        match (self.state, &self.protocol_type) {
            (_, None) if self.members.is_empty() => {
                commit_timestamp_ms.saturating_add(retention_ms) <= now_ms
            }
            (GroupState::Empty, Some(_)) => {
                self.state_timestamp_ms.saturating_add(retention_ms) <= now_ms
            }
            _ => false,
        }
    }

    /// Empty and not even expecting a member (no member id handed out).
    pub fn is_idle(&self) -> bool {
        self.state == GroupState::Empty && self.pending_members.is_empty()
    }

    // --- JoinGroup ---------------------------------------------------------

    pub fn join(&mut self, now_ms: i64, request: JoinRequest) -> (Reply<JoinResult>, Effects) {
        let mut effects = Effects::default();
        let fail = |error| {
            (
                Reply::Now(JoinResult::error(error, &request.member_id)),
                Effects::default(),
            )
        };
        if request.session_timeout_ms < self.limits.session_timeout_ms_min
            || request.session_timeout_ms > self.limits.session_timeout_ms_max
        {
            return fail(ResponseError::InvalidSessionTimeout);
        }
        if request.protocol_type.is_empty() || request.protocols.is_empty() {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        if !self.supports(
            &request.member_id,
            &request.protocol_type,
            &request.protocols,
        ) {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        let reply = if request.member_id.is_empty() {
            self.join_new(now_ms, request, &mut effects)
        } else {
            self.join_known(now_ms, request, &mut effects)
        };
        (reply, effects)
    }

    /// Whether `protocols` fit the group: same protocol type, and at least one
    /// protocol every other member supports too.
    fn supports(&self, member_id: &str, protocol_type: &str, protocols: &[Protocol]) -> bool {
        let others: Vec<&Member> = self
            .members
            .values()
            .filter(|m| m.member_id != member_id)
            .collect();
        if others.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|p| {
            others
                .iter()
                .all(|m| m.protocols.iter().any(|q| q.name == p.name))
        })
    }

    fn join_new(
        &mut self,
        now_ms: i64,
        request: JoinRequest,
        effects: &mut Effects,
    ) -> Reply<JoinResult> {
        let id = request.fresh_member_id.clone();
        if let Some(instance) = request.group_instance_id.clone() {
            if let Some(old_id) = self.static_members.get(&instance).cloned() {
                return self.replace_static_member(now_ms, old_id, request, effects);
            }
            self.static_members.insert(instance, id.clone());
            return self.add_member_and_rebalance(now_ms, id, request, effects);
        }
        if request.require_known_member_id {
            // Kafka's KIP-394: the id is handed out first, so a member that
            // never comes back leaves nothing behind but this pending entry.
            self.pending_members
                .insert(id.clone(), now_ms + i64::from(request.session_timeout_ms));
            return Reply::Now(JoinResult::error(ResponseError::MemberIdRequired, &id));
        }
        self.add_member_and_rebalance(now_ms, id, request, effects)
    }

    fn join_known(
        &mut self,
        now_ms: i64,
        request: JoinRequest,
        effects: &mut Effects,
    ) -> Reply<JoinResult> {
        let id = request.member_id.clone();
        if self.pending_members.remove(&id).is_some() {
            return self.add_member_and_rebalance(now_ms, id, request, effects);
        }
        let Some(member) = self.members.get(&id) else {
            return Reply::Now(JoinResult::error(ResponseError::UnknownMemberId, &id));
        };
        if self.fenced(&id, request.group_instance_id.as_deref()) {
            return Reply::Now(JoinResult::error(ResponseError::FencedInstanceId, &id));
        }
        let same_metadata = member.protocols == request.protocols;
        match self.state {
            GroupState::PreparingRebalance => {
                self.update_member(now_ms, &id, &request, true);
                self.try_complete_join(now_ms, effects);
                Reply::Wait(id)
            }
            GroupState::CompletingRebalance if same_metadata => {
                // A retried JoinGroup: the answer it missed.
                Reply::Now(self.join_result_for(&id))
            }
            GroupState::Stable if same_metadata && self.leader.as_deref() != Some(id.as_str()) => {
                Reply::Now(self.join_result_for(&id))
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.update_member(now_ms, &id, &request, true);
                self.prepare_rebalance(now_ms, effects);
                self.try_complete_join(now_ms, effects);
                Reply::Wait(id)
            }
            GroupState::Empty => Reply::Now(JoinResult::error(ResponseError::UnknownMemberId, &id)),
        }
    }

    /// A static member rejoins with a new member id (a restart): the old id is
    /// fenced and the member keeps its place; the group rebalances only when
    /// it has to (Kafka's `updateStaticMemberAndRebalance`).
    fn replace_static_member(
        &mut self,
        now_ms: i64,
        old_id: String,
        request: JoinRequest,
        effects: &mut Effects,
    ) -> Reply<JoinResult> {
        let id = request.fresh_member_id.clone();
        let Some(mut member) = self.members.remove(&old_id) else {
            // The mapping outlived its member: treat it as a new static member.
            if let Some(instance) = &request.group_instance_id {
                self.static_members.insert(instance.clone(), id.clone());
            }
            return self.add_member_and_rebalance(now_ms, id, request, effects);
        };
        if member.awaiting_join {
            effects.joins.push((
                old_id.clone(),
                JoinResult::error(ResponseError::FencedInstanceId, &old_id),
            ));
        }
        if member.awaiting_sync {
            effects.syncs.push((
                old_id.clone(),
                SyncResult::error(ResponseError::FencedInstanceId),
            ));
        }
        let same_metadata = member.protocols == request.protocols;
        member.member_id = id.clone();
        member.awaiting_join = false;
        member.awaiting_sync = false;
        self.members.insert(id.clone(), member);
        if let Some(instance) = &request.group_instance_id {
            self.static_members.insert(instance.clone(), id.clone());
        }
        let was_leader = self.leader.as_deref() == Some(old_id.as_str());
        if was_leader {
            self.leader = Some(id.clone());
        }
        if self.state == GroupState::Stable && same_metadata && !was_leader {
            self.update_member(now_ms, &id, &request, false);
            effects.persist = true;
            return Reply::Now(self.join_result_for(&id));
        }
        self.update_member(now_ms, &id, &request, true);
        if self.state != GroupState::PreparingRebalance {
            self.prepare_rebalance(now_ms, effects);
        }
        self.try_complete_join(now_ms, effects);
        Reply::Wait(id)
    }

    fn add_member_and_rebalance(
        &mut self,
        now_ms: i64,
        id: String,
        request: JoinRequest,
        effects: &mut Effects,
    ) -> Reply<JoinResult> {
        if self.members.is_empty() {
            self.protocol_type = Some(request.protocol_type.clone());
        }
        self.members.insert(
            id.clone(),
            Member {
                member_id: id.clone(),
                group_instance_id: request.group_instance_id.clone(),
                client_id: request.client_id.clone(),
                client_host: request.client_host.clone(),
                session_timeout_ms: request.session_timeout_ms,
                rebalance_timeout_ms: request.rebalance_timeout_ms,
                protocols: request.protocols.clone(),
                assignment: Bytes::new(),
                awaiting_join: true,
                awaiting_sync: false,
                session_deadline_ms: now_ms + i64::from(request.session_timeout_ms),
            },
        );
        if self.leader.is_none() {
            self.leader = Some(id.clone());
        }
        if self.state == GroupState::PreparingRebalance {
            self.rebalance_deadline_ms = self
                .rebalance_deadline_ms
                .max(now_ms + i64::from(request.rebalance_timeout_ms.max(0)));
            if let Some(until) = self.initial_delay_until_ms {
                // Another member arrived during the initial delay: wait a little
                // longer for the rest of them.
                let pushed = now_ms + i64::from(self.limits.initial_rebalance_delay_ms);
                self.initial_delay_until_ms =
                    Some(until.max(pushed).min(self.initial_delay_cap_ms));
            }
        } else {
            self.prepare_rebalance(now_ms, effects);
        }
        self.try_complete_join(now_ms, effects);
        Reply::Wait(id)
    }

    fn update_member(&mut self, now_ms: i64, id: &str, request: &JoinRequest, awaiting_join: bool) {
        if let Some(m) = self.members.get_mut(id) {
            m.client_id = request.client_id.clone();
            m.client_host = request.client_host.clone();
            m.session_timeout_ms = request.session_timeout_ms;
            m.rebalance_timeout_ms = request.rebalance_timeout_ms;
            m.protocols = request.protocols.clone();
            m.awaiting_join = awaiting_join;
            m.session_deadline_ms = now_ms + i64::from(request.session_timeout_ms);
        }
    }

    fn fenced(&self, member_id: &str, instance: Option<&str>) -> bool {
        instance.is_some_and(|i| self.static_members.get(i).map(String::as_str) != Some(member_id))
    }

    fn prepare_rebalance(&mut self, now_ms: i64, effects: &mut Effects) {
        if self.state == GroupState::CompletingRebalance {
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
                if m.awaiting_sync {
                    m.awaiting_sync = false;
                    effects.syncs.push((
                        m.member_id.clone(),
                        SyncResult::error(ResponseError::RebalanceInProgress),
                    ));
                }
            }
        }
        let rebalance_timeout_ms = self
            .members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms.max(0)))
            .max()
            .unwrap_or(0);
        self.initial_delay_until_ms = None;
        if self.state == GroupState::Empty && self.limits.initial_rebalance_delay_ms > 0 {
            let delay = i64::from(self.limits.initial_rebalance_delay_ms).min(rebalance_timeout_ms);
            self.initial_delay_until_ms = Some(now_ms + delay);
            self.initial_delay_cap_ms = now_ms + rebalance_timeout_ms;
        }
        self.state = GroupState::PreparingRebalance;
        self.state_timestamp_ms = now_ms;
        self.rebalance_deadline_ms = now_ms + rebalance_timeout_ms;
    }

    /// Ends the join phase when every member has rejoined (after the initial
    /// delay), or when the rebalance timeout passes (without the stragglers).
    fn try_complete_join(&mut self, now_ms: i64, effects: &mut Effects) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let delay_over = self.initial_delay_until_ms.is_none_or(|t| now_ms >= t);
        let all_joined =
            self.members.values().all(|m| m.awaiting_join) && self.pending_members.is_empty();
        let timed_out = now_ms >= self.rebalance_deadline_ms;
        if !(timed_out || delay_over && all_joined) {
            return;
        }
        let stragglers: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join)
            .map(|m| m.member_id.clone())
            .collect();
        for id in stragglers {
            self.forget_member(&id, effects);
        }
        self.initial_delay_until_ms = None;
        self.generation_id += 1;
        self.state_timestamp_ms = now_ms;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol_name = None;
            self.leader = None;
            effects.persist = true;
            return;
        }
        self.protocol_name = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result_for(&id);
            if let Some(m) = self.members.get_mut(&id) {
                m.awaiting_join = false;
                m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
            }
            effects.joins.push((id, result));
        }
    }

    /// The protocol every member supports that most members prefer (Kafka's
    /// vote); ties go to the earliest candidate in the first member's order.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|q| q.name == *name))
            })
            .collect();
        let mut votes = vec![0usize; candidates.len()];
        for m in self.members.values() {
            if let Some(choice) = m
                .protocols
                .iter()
                .find_map(|p| candidates.iter().position(|c| *c == p.name))
            {
                votes[choice] += 1;
            }
        }
        let mut best: Option<usize> = None;
        for (i, v) in votes.iter().enumerate() {
            if best.is_none_or(|b| *v > votes[b]) {
                best = Some(i);
            }
        }
        best.map(|i| candidates[i].to_string())
    }

    fn join_result_for(&self, member_id: &str) -> JoinResult {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            self.members
                .values()
                .map(|m| JoinedMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    metadata: m.metadata(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: None,
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader,
            member_id: member_id.to_string(),
            members,
        }
    }

    // --- SyncGroup ---------------------------------------------------------

    /// SyncGroup. `assignments` (member id -> assignment) count only from the
    /// leader. `protocol_type`/`protocol_name` are checked when given (v5+).
    pub fn sync(
        &mut self,
        now_ms: i64,
        member_id: &str,
        generation_id: i32,
        group_instance_id: Option<&str>,
        protocol: (Option<&str>, Option<&str>),
        assignments: Vec<(String, Bytes)>,
    ) -> (Reply<SyncResult>, Effects) {
        let mut effects = Effects::default();
        let fail = |e| (Reply::Now(SyncResult::error(e)), Effects::default());
        if !self.members.contains_key(member_id) {
            return fail(ResponseError::UnknownMemberId);
        }
        if self.fenced(member_id, group_instance_id) {
            return fail(ResponseError::FencedInstanceId);
        }
        if generation_id != self.generation_id {
            return fail(ResponseError::IllegalGeneration);
        }
        let (protocol_type, protocol_name) = protocol;
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol_name.as_deref())
        {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        match self.state {
            GroupState::Empty => fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                self.touch(now_ms, member_id);
                (Reply::Now(self.sync_result_for(member_id)), effects)
            }
            GroupState::CompletingRebalance => {
                self.touch(now_ms, member_id);
                if let Some(m) = self.members.get_mut(member_id) {
                    m.awaiting_sync = true;
                }
                if self.leader.as_deref() == Some(member_id) {
                    let mut assignments: BTreeMap<String, Bytes> =
                        assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = assignments.remove(&m.member_id).unwrap_or_default();
                    }
                    self.state = GroupState::Stable;
                    self.state_timestamp_ms = now_ms;
                    let waiting: Vec<String> = self
                        .members
                        .values()
                        .filter(|m| m.awaiting_sync)
                        .map(|m| m.member_id.clone())
                        .collect();
                    for id in waiting {
                        let result = self.sync_result_for(&id);
                        if let Some(m) = self.members.get_mut(&id) {
                            m.awaiting_sync = false;
                        }
                        effects.syncs.push((id, result));
                    }
                    effects.persist = true;
                }
                (Reply::Wait(member_id.to_string()), effects)
            }
        }
    }

    fn sync_result_for(&self, member_id: &str) -> SyncResult {
        SyncResult {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            assignment: self
                .members
                .get(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    /// Storing the group after a leader's SyncGroup failed: nobody got the
    /// assignment, so the group starts over (Kafka rebalances too).
    pub fn persist_failed(&mut self, now_ms: i64) -> Effects {
        let mut effects = Effects::default();
        if self.state == GroupState::Stable {
            self.prepare_rebalance(now_ms, &mut effects);
            self.try_complete_join(now_ms, &mut effects);
        }
        effects
    }

    // --- Heartbeat, LeaveGroup, OffsetCommit checks -------------------------

    pub fn heartbeat(
        &mut self,
        now_ms: i64,
        member_id: &str,
        generation_id: i32,
        group_instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        if !self.members.contains_key(member_id) {
            return Some(ResponseError::UnknownMemberId);
        }
        if self.fenced(member_id, group_instance_id) {
            return Some(ResponseError::FencedInstanceId);
        }
        if generation_id != self.generation_id {
            return Some(ResponseError::IllegalGeneration);
        }
        self.touch(now_ms, member_id);
        match self.state {
            GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            _ => None,
        }
    }

    fn touch(&mut self, now_ms: i64, member_id: &str) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.session_deadline_ms = now_ms + i64::from(m.session_timeout_ms);
        }
    }

    /// LeaveGroup for each (member id, group.instance.id); one error per entry.
    pub fn leave(
        &mut self,
        now_ms: i64,
        leaving: &[(String, Option<String>)],
    ) -> (Vec<Option<ResponseError>>, Effects) {
        let mut effects = Effects::default();
        let mut errors = Vec::with_capacity(leaving.len());
        for (member_id, instance) in leaving {
            let error = match instance {
                Some(instance) => match self.static_members.get(instance).cloned() {
                    None => Some(ResponseError::UnknownMemberId),
                    Some(id) if !member_id.is_empty() && *member_id != id => {
                        Some(ResponseError::FencedInstanceId)
                    }
                    Some(id) => {
                        self.remove_member(now_ms, &id, &mut effects);
                        None
                    }
                },
                None if self.pending_members.remove(member_id).is_some() => {
                    self.try_complete_join(now_ms, &mut effects);
                    None
                }
                None if self.members.contains_key(member_id) => {
                    self.remove_member(now_ms, member_id, &mut effects);
                    None
                }
                None => Some(ResponseError::UnknownMemberId),
            };
            errors.push(error);
        }
        (errors, effects)
    }

    /// Kafka's OffsetCommit checks for a group that exists. Generation -1 with
    /// no membership is a simple consumer (`assign()` + commit).
    pub fn check_commit(
        &mut self,
        now_ms: i64,
        member_id: &str,
        generation_id: i32,
        group_instance_id: Option<&str>,
    ) -> Result<(), ResponseError> {
        if generation_id < 0 && self.state == GroupState::Empty {
            return Ok(());
        }
        if self.fenced(member_id, group_instance_id) {
            return Err(ResponseError::FencedInstanceId);
        }
        if self.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation_id != self.generation_id {
            return Err(ResponseError::IllegalGeneration);
        }
        self.touch(now_ms, member_id);
        Ok(())
    }

    fn remove_member(&mut self, now_ms: i64, member_id: &str, effects: &mut Effects) {
        self.forget_member(member_id, effects);
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now_ms, effects);
                self.try_complete_join(now_ms, effects);
            }
            GroupState::PreparingRebalance => self.try_complete_join(now_ms, effects),
            GroupState::Empty => {}
        }
    }

    /// Drops a member, answering whatever it waits for.
    fn forget_member(&mut self, member_id: &str, effects: &mut Effects) {
        let Some(m) = self.members.remove(member_id) else {
            return;
        };
        if let Some(instance) = &m.group_instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        if m.awaiting_join {
            effects.joins.push((
                m.member_id.clone(),
                JoinResult::error(ResponseError::UnknownMemberId, member_id),
            ));
        }
        if m.awaiting_sync {
            effects.syncs.push((
                m.member_id.clone(),
                SyncResult::error(ResponseError::UnknownMemberId),
            ));
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members.keys().next().cloned();
        }
    }

    // --- time --------------------------------------------------------------

    /// Applies the passage of time: lapsed pending ids and expired sessions go
    /// (members waiting for an answer are bounded by the rebalance timeout
    /// instead), and a join phase whose time is up completes.
    pub fn tick(&mut self, now_ms: i64) -> Effects {
        let mut effects = Effects::default();
        self.pending_members
            .retain(|_, deadline| *deadline > now_ms);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join && !m.awaiting_sync && m.session_deadline_ms <= now_ms)
            .map(|m| m.member_id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.group_id, member = %id, "member session expired");
            self.remove_member(now_ms, &id, &mut effects);
        }
        self.try_complete_join(now_ms, &mut effects);
        effects
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        assert_eq!(self.leader.is_none(), self.members.is_empty(), "{self:?}");
        if let Some(l) = &self.leader {
            assert!(self.members.contains_key(l), "{self:?}");
        }
        if self.state == GroupState::Empty {
            assert!(self.members.is_empty(), "{self:?}");
        }
        for (instance, id) in &self.static_members {
            let m = self.members.get(id);
            assert_eq!(
                m.and_then(|m| m.group_instance_id.as_deref()),
                Some(instance.as_str())
            );
        }
        for m in self.members.values() {
            if m.awaiting_join {
                assert_eq!(self.state, GroupState::PreparingRebalance, "{self:?}");
            }
            if m.awaiting_sync {
                assert_eq!(self.state, GroupState::CompletingRebalance, "{self:?}");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        session_timeout_ms_min: 1000,
        session_timeout_ms_max: 60_000,
        initial_rebalance_delay_ms: 0,
    };

    fn protocols(names: &[&str]) -> Vec<Protocol> {
        names
            .iter()
            .map(|n| Protocol {
                name: n.to_string(),
                metadata: Bytes::from(format!("meta-{n}")),
            })
            .collect()
    }

    fn request(member_id: &str, fresh: &str) -> JoinRequest {
        JoinRequest {
            member_id: member_id.to_string(),
            group_instance_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: protocols(&["range", "roundrobin"]),
            require_known_member_id: false,
            fresh_member_id: fresh.to_string(),
        }
    }

    /// Joins `fresh` as a new member with the v4+ two-step flow; returns its id.
    fn join_two_step(g: &mut Group, now: i64, fresh: &str) -> (Reply<JoinResult>, Effects) {
        let mut r = request("", fresh);
        r.require_known_member_id = true;
        let (reply, effects) = g.join(now, r.clone());
        let Reply::Now(result) = reply else {
            panic!("expected MEMBER_ID_REQUIRED")
        };
        assert_eq!(result.error, Some(ResponseError::MemberIdRequired));
        assert_eq!(result.member_id, fresh);
        assert!(effects.is_empty());
        g.check_invariants();
        r.member_id = fresh.to_string();
        let out = g.join(now, r);
        g.check_invariants();
        out
    }

    fn joined(effects: &Effects, id: &str) -> JoinResult {
        effects
            .joins
            .iter()
            .find(|(m, _)| m == id)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("no join answer for {id} in {effects:?}"))
    }

    #[test]
    fn first_member_becomes_leader_and_group_becomes_stable() {
        let mut g = Group::new("g", LIMITS, 0);
        let (reply, effects) = join_two_step(&mut g, 0, "a");
        assert_eq!(reply, Reply::Wait("a".into()));
        let result = joined(&effects, "a");
        assert_eq!(result.error, None);
        assert_eq!(result.generation_id, 1);
        assert_eq!(result.leader, "a");
        assert_eq!(result.protocol_name.as_deref(), Some("range"));
        assert_eq!(result.members.len(), 1);
        assert_eq!(result.members[0].metadata, Bytes::from("meta-range"));
        assert_eq!(g.state(), GroupState::CompletingRebalance);

        let (reply, effects) = g.sync(
            1,
            "a",
            1,
            None,
            (None, None),
            vec![("a".into(), Bytes::from("A"))],
        );
        assert_eq!(reply, Reply::Wait("a".into()));
        assert!(effects.persist);
        assert_eq!(effects.syncs.len(), 1);
        assert_eq!(effects.syncs[0].1.assignment, Bytes::from("A"));
        assert_eq!(g.state(), GroupState::Stable);
        g.check_invariants();
    }

    #[test]
    fn second_member_triggers_rebalance_and_both_get_answers() {
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        g.sync(1, "a", 1, None, (None, None), vec![]);
        assert_eq!(g.state(), GroupState::Stable);

        // b joins: the group prepares a rebalance; b waits.
        let (reply, effects) = join_two_step(&mut g, 10, "b");
        assert_eq!(reply, Reply::Wait("b".into()));
        assert!(effects.joins.is_empty());
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        // a's heartbeat learns about it.
        assert_eq!(
            g.heartbeat(20, "a", 1, None),
            Some(ResponseError::RebalanceInProgress)
        );
        // a rejoins: the phase completes, generation 2, a stays leader.
        let (reply, effects) = g.join(30, request("a", "unused"));
        assert_eq!(reply, Reply::Wait("a".into()));
        let a = joined(&effects, "a");
        let b = joined(&effects, "b");
        assert_eq!((a.generation_id, b.generation_id), (2, 2));
        assert_eq!((a.leader.as_str(), b.leader.as_str()), ("a", "a"));
        assert_eq!(a.members.len(), 2);
        assert!(b.members.is_empty());
        g.check_invariants();

        // b syncs first and waits; the leader's sync answers both.
        let (reply, effects) = g.sync(40, "b", 2, None, (None, None), vec![]);
        assert_eq!(reply, Reply::Wait("b".into()));
        assert!(effects.is_empty());
        let assignments = vec![
            ("a".into(), Bytes::from("A")),
            ("b".into(), Bytes::from("B")),
        ];
        let (_, effects) = g.sync(
            50,
            "a",
            2,
            None,
            (Some("consumer"), Some("range")),
            assignments,
        );
        let got: BTreeMap<String, Bytes> = effects
            .syncs
            .iter()
            .map(|(m, r)| (m.clone(), r.assignment.clone()))
            .collect();
        assert_eq!(got.get("a"), Some(&Bytes::from("A")));
        assert_eq!(got.get("b"), Some(&Bytes::from("B")));
        // A stale generation is fenced.
        assert_eq!(
            g.heartbeat(60, "b", 1, None),
            Some(ResponseError::IllegalGeneration)
        );
        assert_eq!(g.heartbeat(60, "b", 2, None), None);
        assert_eq!(
            g.heartbeat(60, "zz", 2, None),
            Some(ResponseError::UnknownMemberId)
        );
        g.check_invariants();
    }

    #[test]
    fn leave_hands_partitions_to_the_rest() {
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        let (_, e) = g.sync(1, "a", 1, None, (None, None), vec![]);
        assert!(e.persist);
        join_two_step(&mut g, 2, "b");
        let (_, e) = g.join(2, request("a", "x"));
        let _ = joined(&e, "a");
        let gen = g.generation_id();
        assert_eq!(gen, 2);
        g.sync(3, "a", gen, None, (None, None), vec![]);
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.members().count(), 2);

        let (errors, effects) = g.leave(4, &[("a".into(), None)]);
        assert_eq!(errors, vec![None]);
        assert!(effects.joins.is_empty());
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert_eq!(g.leader(), Some("b"));
        let (_, effects) = g.join(5, request("b", "x"));
        let b = joined(&effects, "b");
        assert_eq!(b.generation_id, gen + 1);
        assert_eq!(b.leader, "b");
        assert_eq!(b.members.len(), 1);
        // The last member leaving empties the group, which is stored.
        g.sync(6, "b", gen + 1, None, (None, None), vec![]);
        let (_, effects) = g.leave(7, &[("b".into(), None)]);
        assert!(effects.persist);
        assert_eq!(g.state(), GroupState::Empty);
        assert_eq!(g.generation_id(), gen + 2);
        g.check_invariants();
        let (errors, _) = g.leave(8, &[("b".into(), None)]);
        assert_eq!(errors, vec![Some(ResponseError::UnknownMemberId)]);
    }

    #[test]
    fn session_timeout_removes_a_silent_member() {
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        g.sync(0, "a", 1, None, (None, None), vec![]);
        join_two_step(&mut g, 100, "b");
        g.join(100, request("a", "x"));
        g.sync(100, "a", 2, None, (None, None), vec![]);
        assert_eq!(g.state(), GroupState::Stable);
        // a heartbeats, b goes silent.
        for t in (1000..=10_000).step_by(1000) {
            assert_eq!(g.heartbeat(t, "a", 2, None), None);
            assert!(g.tick(t).is_empty(), "t={t}");
        }
        let effects = g.tick(10_100);
        assert!(effects.joins.is_empty());
        assert_eq!(g.members().count(), 1);
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert_eq!(
            g.heartbeat(10_200, "a", 2, None),
            Some(ResponseError::RebalanceInProgress)
        );
        let (_, effects) = g.join(10_300, request("a", "x"));
        assert_eq!(joined(&effects, "a").generation_id, 3);
        g.check_invariants();
    }

    #[test]
    fn rebalance_timeout_drops_members_that_do_not_rejoin() {
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        g.sync(0, "a", 1, None, (None, None), vec![]);
        join_two_step(&mut g, 0, "b");
        g.join(0, request("a", "x"));
        g.sync(0, "a", 2, None, (None, None), vec![]);
        // c joins; a rejoins; b keeps heartbeating but never rejoins.
        let (reply, _) = join_two_step(&mut g, 1000, "c");
        assert_eq!(reply, Reply::Wait("c".into()));
        g.join(1000, request("a", "x"));
        for t in (2000..31_000).step_by(1000) {
            assert_eq!(
                g.heartbeat(t, "b", 2, None),
                Some(ResponseError::RebalanceInProgress)
            );
            assert!(g.tick(t).joins.is_empty(), "t={t}");
        }
        let effects = g.tick(31_000);
        assert_eq!(effects.joins.len(), 2);
        assert_eq!(joined(&effects, "a").generation_id, 3);
        assert_eq!(
            g.heartbeat(31_001, "b", 2, None),
            Some(ResponseError::UnknownMemberId)
        );
        g.check_invariants();
    }

    #[test]
    fn errors_for_bad_joins_and_syncs() {
        let mut g = Group::new("g", LIMITS, 0);
        let mut r = request("", "a");
        r.session_timeout_ms = 10;
        assert_eq!(
            g.join(0, r).0,
            Reply::Now(JoinResult::error(ResponseError::InvalidSessionTimeout, ""))
        );
        let mut r = request("", "a");
        r.protocols.clear();
        assert_eq!(
            g.join(0, r).0,
            Reply::Now(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                ""
            ))
        );
        assert_eq!(
            g.join(0, request("ghost", "a")).0,
            Reply::Now(JoinResult::error(ResponseError::UnknownMemberId, "ghost"))
        );
        join_two_step(&mut g, 0, "a");
        // Another protocol type, or no common protocol, is inconsistent.
        let mut r = request("", "b");
        r.protocol_type = "connect".into();
        assert_eq!(
            g.join(0, r).0,
            Reply::Now(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                ""
            ))
        );
        let mut r = request("", "b");
        r.protocols = protocols(&["sticky"]);
        assert_eq!(
            g.join(0, r).0,
            Reply::Now(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                ""
            ))
        );
        // Sync: unknown member, wrong generation, protocol mismatch.
        assert_eq!(
            g.sync(0, "zz", 1, None, (None, None), vec![]).0,
            Reply::Now(SyncResult::error(ResponseError::UnknownMemberId))
        );
        assert_eq!(
            g.sync(0, "a", 7, None, (None, None), vec![]).0,
            Reply::Now(SyncResult::error(ResponseError::IllegalGeneration))
        );
        assert_eq!(
            g.sync(0, "a", 1, None, (None, Some("roundrobin")), vec![])
                .0,
            Reply::Now(SyncResult::error(ResponseError::InconsistentGroupProtocol))
        );
        g.check_invariants();
    }

    #[test]
    fn commits_are_fenced_by_generation_and_membership() {
        let mut g = Group::new("g", LIMITS, 0);
        assert_eq!(g.check_commit(0, "", -1, None), Ok(()));
        join_two_step(&mut g, 0, "a");
        assert_eq!(
            g.check_commit(0, "a", 1, None),
            Err(ResponseError::RebalanceInProgress)
        );
        g.sync(0, "a", 1, None, (None, None), vec![]);
        assert_eq!(g.check_commit(0, "a", 1, None), Ok(()));
        assert_eq!(
            g.check_commit(0, "a", 0, None),
            Err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            g.check_commit(0, "b", 1, None),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            g.check_commit(0, "", -1, None),
            Err(ResponseError::UnknownMemberId)
        );
    }

    #[test]
    fn initial_delay_waits_for_more_members() {
        let limits = Limits {
            initial_rebalance_delay_ms: 300,
            ..LIMITS
        };
        let mut g = Group::new("g", limits, 0);
        let (_, effects) = join_two_step(&mut g, 0, "a");
        assert!(effects.joins.is_empty());
        let (_, effects) = join_two_step(&mut g, 100, "b");
        assert!(effects.joins.is_empty());
        assert!(g.tick(300).joins.is_empty(), "pushed back by b's arrival");
        let effects = g.tick(400);
        assert_eq!(effects.joins.len(), 2);
        assert_eq!(joined(&effects, "a").generation_id, 1);
        g.check_invariants();
    }

    #[test]
    fn pending_member_ids_lapse() {
        let mut g = Group::new("g", LIMITS, 0);
        let mut r = request("", "p");
        r.require_known_member_id = true;
        g.join(0, r.clone());
        g.tick(10_001);
        r.member_id = "p".into();
        assert_eq!(
            g.join(10_002, r).0,
            Reply::Now(JoinResult::error(ResponseError::UnknownMemberId, "p"))
        );
    }

    #[test]
    fn static_member_rejoining_keeps_its_assignment() {
        let mut g = Group::new("g", LIMITS, 0);
        let mut a = request("", "a1");
        a.group_instance_id = Some("ia".into());
        let mut b = request("", "b1");
        b.group_instance_id = Some("ib".into());
        g.join(0, a.clone());
        g.sync(0, "a1", 1, Some("ia"), (None, None), vec![]);
        g.join(0, b.clone());
        let mut a_again = a.clone();
        a_again.member_id = "a1".into();
        g.join(0, a_again);
        let assignments = vec![
            ("a1".into(), Bytes::from("A")),
            ("b1".into(), Bytes::from("B")),
        ];
        g.sync(0, "a1", 2, Some("ia"), (None, None), assignments);
        assert_eq!(g.state(), GroupState::Stable);
        // b restarts: new member id, same instance id, no rebalance.
        b.fresh_member_id = "b2".into();
        let (reply, effects) = g.join(10, b);
        let Reply::Now(result) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(
            (
                result.error,
                result.member_id.as_str(),
                result.generation_id
            ),
            (None, "b2", 2)
        );
        assert!(effects.persist);
        assert_eq!(g.state(), GroupState::Stable);
        let (reply, _) = g.sync(11, "b2", 2, Some("ib"), (None, None), vec![]);
        let Reply::Now(result) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(result.assignment, Bytes::from("B"));
        // The old id is fenced.
        assert_eq!(
            g.heartbeat(12, "b1", 2, Some("ib")),
            Some(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            g.heartbeat(12, "b2", 2, Some("ia")),
            Some(ResponseError::FencedInstanceId)
        );
        let (errors, _) = g.leave(13, &[("b1".into(), Some("ib".into()))]);
        assert_eq!(errors, vec![Some(ResponseError::FencedInstanceId)]);
        g.check_invariants();
    }

    #[test]
    fn stored_group_loads_as_stable_and_expires_without_heartbeats() {
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        g.sync(
            0,
            "a",
            1,
            None,
            (None, None),
            vec![("a".into(), Bytes::from("A"))],
        );
        let stored = g.stored();
        assert_eq!(stored.members[0].subscription, Bytes::from("meta-range"));
        let mut loaded = Group::loaded("g", LIMITS, stored, 1000);
        assert_eq!(loaded.state(), GroupState::Stable);
        assert_eq!(loaded.generation_id(), 1);
        assert_eq!(loaded.leader(), Some("a"));
        loaded.check_invariants();
        let effects = loaded.tick(11_000);
        assert!(effects.persist);
        assert_eq!(loaded.state(), GroupState::Empty);
        assert_eq!(loaded.generation_id(), 2);
    }

    #[test]
    fn offsets_expire_as_kafka_says() {
        const DAY: i64 = 86_400_000;
        // Only offsets: from each commit.
        let simple = Group::new("s", LIMITS, 0);
        assert!(!simple.offset_expired(7 * DAY - 1, 7 * DAY, 0));
        assert!(simple.offset_expired(7 * DAY, 7 * DAY, 0));
        // A consumer group keeps them while it has members...
        let mut g = Group::new("g", LIMITS, 0);
        join_two_step(&mut g, 0, "a");
        g.sync(0, "a", 1, None, (None, None), vec![]);
        assert!(!g.offset_expired(30 * DAY, 7 * DAY, 0));
        // ... and from the time it became empty, whatever the commit times.
        g.leave(DAY, &[("a".into(), None)]);
        assert_eq!(g.state(), GroupState::Empty);
        assert!(!g.offset_expired(8 * DAY - 1, 7 * DAY, 0));
        assert!(g.offset_expired(8 * DAY, 7 * DAY, 7 * DAY));
        // The time it became empty survives a load.
        let loaded = Group::loaded("g", LIMITS, g.stored(), 5 * DAY);
        assert!(loaded.offset_expired(8 * DAY, 7 * DAY, 0));
    }

    #[test]
    fn protocol_vote_prefers_what_most_members_want() {
        let mut g = Group::new("g", LIMITS, 0);
        let mut a = request("", "a");
        a.protocols = protocols(&["range", "roundrobin"]);
        let mut b = request("", "b");
        b.protocols = protocols(&["roundrobin", "range"]);
        let mut c = request("", "c");
        c.protocols = protocols(&["roundrobin", "range", "sticky"]);
        g.join(0, a.clone());
        g.sync(0, "a", 1, None, (None, None), vec![]);
        g.join(0, b);
        g.join(0, c);
        a.member_id = "a".into();
        let (_, effects) = g.join(0, a);
        assert_eq!(
            joined(&effects, "a").protocol_name.as_deref(),
            Some("roundrobin")
        );
    }

    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// Join: a new member (`who` >= known count) or a known one.
            Join {
                who: usize,
                two_step: bool,
                sticky_first: bool,
            },
            Sync {
                who: usize,
                generation_skew: i32,
            },
            Heartbeat {
                who: usize,
                generation_skew: i32,
            },
            Leave {
                who: usize,
            },
            Tick {
                advance_ms: i64,
            },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0usize..6, any::<bool>(), any::<bool>()).prop_map(
                    |(who, two_step, sticky_first)| Op::Join {
                        who,
                        two_step,
                        sticky_first
                    }
                ),
                (0usize..6, -1i32..2).prop_map(|(who, generation_skew)| Op::Sync {
                    who,
                    generation_skew
                }),
                (0usize..6, -1i32..2).prop_map(|(who, generation_skew)| Op::Heartbeat {
                    who,
                    generation_skew
                }),
                (0usize..6).prop_map(|who| Op::Leave { who }),
                (0i64..12_000).prop_map(|advance_ms| Op::Tick { advance_ms }),
            ]
        }

        /// Every answer handed out must agree with the group as it is after
        /// the call: a successful JoinGroup answer carries the current
        /// generation and a leader that is a member; a successful SyncGroup
        /// answer comes only from a Stable group.
        fn check_effects(g: &Group, effects: &Effects) {
            for (id, r) in &effects.joins {
                if r.error.is_none() {
                    assert_eq!(r.generation_id, g.generation_id(), "{id}: {r:?}");
                    assert!(g.members.contains_key(&r.leader), "{r:?} {g:?}");
                    assert_eq!(r.members.is_empty(), *id != r.leader);
                }
            }
            for (_, r) in &effects.syncs {
                if r.error.is_none() {
                    assert_eq!(g.state(), GroupState::Stable);
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

            /// Random interleavings of every call keep the invariants, never
            /// move the generation back, and never answer with a stale view.
            #[test]
            fn random_calls_keep_the_invariants(ops in proptest::collection::vec(op(), 1..80)) {
                let limits = Limits { initial_rebalance_delay_ms: 200, ..LIMITS };
                let mut g = Group::new("g", limits, 0);
                let mut now = 0i64;
                let mut known: Vec<String> = Vec::new();
                let mut fresh = 0;
                let mut generation = g.generation_id();
                for op in ops {
                    let effects = match op {
                        Op::Join { who, two_step, sticky_first } => {
                            let mut r = request("", "");
                            if sticky_first {
                                r.protocols = protocols(&["sticky", "range"]);
                            }
                            r.require_known_member_id = two_step;
                            if let Some(id) = known.get(who) {
                                r.member_id = id.clone();
                            }
                            fresh += 1;
                            r.fresh_member_id = format!("m{fresh}");
                            let (reply, effects) = g.join(now, r);
                            match &reply {
                                Reply::Wait(id) => {
                                    prop_assert!(g.members.contains_key(id));
                                    if !known.contains(id) { known.push(id.clone()); }
                                }
                                Reply::Now(result) => {
                                    if result.error == Some(ResponseError::MemberIdRequired) {
                                        known.push(result.member_id.clone());
                                    } else if result.error.is_none() {
                                        prop_assert_eq!(result.generation_id, g.generation_id());
                                    }
                                }
                            }
                            effects
                        }
                        Op::Sync { who, generation_skew } => {
                            let id = known.get(who).cloned().unwrap_or_default();
                            let assignments = known.iter().map(|m| (m.clone(), Bytes::from(m.clone()))).collect();
                            let (reply, effects) = g.sync(now, &id, g.generation_id() + generation_skew, None, (None, None), assignments);
                            if let Reply::Now(r) = &reply {
                                if r.error.is_none() {
                                    prop_assert_eq!(g.state(), GroupState::Stable);
                                    prop_assert_eq!(generation_skew, 0);
                                }
                            }
                            effects
                        }
                        Op::Heartbeat { who, generation_skew } => {
                            let id = known.get(who).cloned().unwrap_or_default();
                            let error = g.heartbeat(now, &id, g.generation_id() + generation_skew, None);
                            if generation_skew != 0 && g.members.contains_key(&id) {
                                prop_assert_eq!(error, Some(ResponseError::IllegalGeneration));
                            }
                            Effects::default()
                        }
                        Op::Leave { who } => {
                            let id = known.get(who).cloned().unwrap_or_default();
                            let was_member = g.members.contains_key(&id);
                            let (errors, effects) = g.leave(now, &[(id.clone(), None)]);
                            if was_member {
                                prop_assert_eq!(&errors, &vec![None]);
                                prop_assert!(!g.members.contains_key(&id));
                            }
                            effects
                        }
                        Op::Tick { advance_ms } => {
                            now += advance_ms;
                            g.tick(now)
                        }
                    };
                    g.check_invariants();
                    check_effects(&g, &effects);
                    prop_assert!(g.generation_id() >= generation);
                    generation = g.generation_id();
                    // Nobody waits past the rebalance timeout.
                    if g.state() == GroupState::PreparingRebalance {
                        prop_assert!(g.rebalance_deadline_ms <= now + 30_000);
                    }
                }
            }
        }
    }

    #[test]
    fn consumer_subscriptions_parse() {
        // v1-style: version 1, topics ["orders", "b"], then user data and
        // owned partitions, which are not read.
        let mut bytes = vec![0, 1, 0, 0, 0, 2, 0, 6];
        bytes.extend_from_slice(b"orders");
        bytes.extend_from_slice(&[0, 1, b'b', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(
            subscription_topics(&bytes),
            Some(vec!["orders".to_string(), "b".to_string()])
        );
        assert_eq!(subscription_topics(&bytes[..9]), None);
        assert_eq!(subscription_topics(&[0, 0, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(subscription_topics(&[0, 0, 0, 0, 0, 1, 0xff, 0xff]), None);
        assert_eq!(subscription_topics(&[]), None);
    }
}
